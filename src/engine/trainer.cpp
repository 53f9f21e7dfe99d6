#include "engine/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "io/hf_export.h"

namespace rt {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string fmt_duration(double s) {
  char buf[32];
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

void signal_handler(int sig) {
  if (Trainer::stop_flag().exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

LrSchedule make_lr_schedule(const std::string& kind, double peak, int64_t warmup, int64_t total, double min_lr_ratio) {
  LrSchedule s;
  s.kind = lr_schedule_kind_parse(kind);
  s.peak = peak;
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.min_lr_ratio = min_lr_ratio;
  s.validate();
  return s;
}

std::atomic<bool>& Trainer::stop_flag() {
  static std::atomic<bool> f{false};
  return f;
}

void install_stop_handler() {
  std::signal(SIGINT, signal_handler);
  std::signal(SIGTERM, signal_handler);
}

Trainer::Trainer(HostState& state, BatchSource& data, const TrainOptions& opt, std::unique_ptr<Backend> backend)
    : state_(state), data_(data), opt_(opt), backend_(std::move(backend)) {
  RT_CHECK(opt_.micro_batch >= 1, "[train] --micro-batch must be >= 1");
  RT_CHECK(opt_.grad_accum >= 1, "[train] --grad-accum must be >= 1");
  RT_CHECK(opt_.steps >= 1, "[train] --steps must be >= 1");
  RT_CHECK(data_.seq_len() <= state_.spec().max_positions, "[train] --seq-len ", data_.seq_len(),
           " exceeds the model's max_position_embeddings (", state_.spec().max_positions, ")");
  if (!backend_) backend_ = make_cpu_backend(state_);
}

StepResult Trainer::step() {
  const auto t0 = clock_type::now();
  std::vector<Batch> batches;
  int64_t n_valid_total = 0;
  for (int64_t k = 0; k < opt_.grad_accum; ++k) {
    batches.push_back(data_.next_batch(opt_.micro_batch));
    for (int32_t t : batches.back().targets) n_valid_total += t != ignore_target;
  }
  ++step_;
  StepResult r{step_, NAN, NAN, opt_.lr.at(step_), n_valid_total, 0, true};
  if (n_valid_total == 0) return r;
  OptimStep o;
  o.lr = r.lr;
  o.t = adam_t_ + 1;
  o.hyper = opt_.adam;
  o.weight_decay = opt_.weight_decay;
  o.decay_norms_and_biases = opt_.decay_norms_and_biases;
  o.clip = opt_.clip;
  StepStats st = backend_->train_step(batches, n_valid_total, o);
  r.loss = st.loss_sum / static_cast<double>(n_valid_total);
  r.grad_norm = st.grad_norm;
  r.skipped = !st.applied;
  if (st.applied) ++adam_t_;
  else ++skipped_;
  r.seconds = seconds_since(t0);
  return r;
}

double Trainer::evaluate() {
  std::vector<Batch> vb = data_.val_batches(opt_.micro_batch, opt_.eval_batches);
  if (vb.empty()) return NAN;
  double sum = 0;
  int64_t n = 0;
  for (auto& b : vb) {
    int64_t nv = 0;
    sum += backend_->loss_sum(b, &nv);
    n += nv;
  }
  return n ? sum / static_cast<double>(n) : NAN;
}

void Trainer::export_to(const std::string& dir, double loss) {
  backend_->sync();
  ExportOptions eo;
  eo.dtype = opt_.export_dtype;
  eo.tokenizer = opt_.tokenizer;
  eo.copy_from_dir = opt_.copy_from_dir;
  eo.copy_files = opt_.copy_files;
  eo.info["step"] = std::to_string(step_);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", loss);
  eo.info["train_loss"] = buf;
  eo.info["data_cursor"] = data_.cursor().to_string();
  for (auto& [k, v] : opt_.resolved_config) eo.info["config." + k] = v;
  export_hf_dir(dir, state_, eo);
}

int Trainer::run(const std::function<void(const char*)>& on_sample) {
  const bool tty = ::isatty(STDERR_FILENO);
  const auto t_start = clock_type::now();
  int64_t tokens_seen = 0;
  double last_loss = NAN, tokens_since_log = 0, secs_since_log = 0;
  std::printf("backend: %s\n", backend_->describe().c_str());
  std::printf("training %lld steps: micro-batch %lld x %lld tokens, accumulation %lld, %lld params, %.0f B/param host, "
              "optimizer %s\n",
              (long long)opt_.steps, (long long)opt_.micro_batch, (long long)data_.seq_len(),
              (long long)opt_.grad_accum, (long long)state_.n_params(), state_.bytes_per_param(),
              simd_level_name(simd_level_active()));
  if (on_sample) on_sample("before training");
  std::fflush(stdout);
  int code = 0;
  while (step_ < opt_.steps) {
    StepResult r = step();
    tokens_seen += r.tokens;
    tokens_since_log += static_cast<double>(r.tokens);
    secs_since_log += r.seconds;
    if (!r.skipped) last_loss = r.loss;
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (r.skipped) {
      std::printf("step %lld: skipped (loss %g, grad norm %g are not finite); %lld skipped so far\n", (long long)r.step,
                  r.loss, r.grad_norm, (long long)skipped_);
    } else if (r.step % opt_.log_every == 0 || r.step == 1 || r.step == opt_.steps) {
      std::printf("step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s\n", (long long)r.step,
                  (long long)opt_.steps, r.loss, r.lr, r.grad_norm,
                  secs_since_log > 0 ? tokens_since_log / secs_since_log : 0.0);
      tokens_since_log = secs_since_log = 0;
    }
    if (opt_.eval_every > 0 && r.step % opt_.eval_every == 0 && r.step != opt_.steps) {
      double vl = evaluate();
      if (std::isfinite(vl)) std::printf("step %5lld | validation loss %.4f\n", (long long)r.step, vl);
    }
    if (opt_.save_every > 0 && r.step % opt_.save_every == 0 && !opt_.out_dir.empty() && r.step != opt_.steps) {
      char name[32];
      std::snprintf(name, sizeof name, "step-%06lld", (long long)r.step);
      export_to(opt_.out_dir + "/" + name, last_loss);
      std::printf("saved %s/%s\n", opt_.out_dir.c_str(), name);
    }
    std::fflush(stdout);
    if (tty) {
      double el = seconds_since(t_start), frac = static_cast<double>(step_) / static_cast<double>(opt_.steps);
      int bar = static_cast<int>(frac * 30);
      std::fprintf(stderr, "[%.*s%*s] %3d%% step %lld/%lld, %s elapsed, ETA %s", bar,
                   "==============================", 30 - bar, "", static_cast<int>(frac * 100), (long long)step_,
                   (long long)opt_.steps, fmt_duration(el).c_str(), fmt_duration(el / frac * (1 - frac)).c_str());
      std::fflush(stderr);
    }
    if (stop_flag().load()) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      std::printf("interrupted after step %lld: saving and exiting\n", (long long)step_);
      code = 130;
      break;
    }
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  double vl = evaluate();
  if (std::isfinite(vl)) std::printf("final validation loss %.4f after %lld steps\n", vl, (long long)step_);
  std::printf("trained %lld tokens in %s\n", (long long)tokens_seen, fmt_duration(seconds_since(t_start)).c_str());
  if (!opt_.out_dir.empty()) {
    std::string dir = opt_.out_dir + "/final";
    if (code == 130) {
      char name[32];
      std::snprintf(name, sizeof name, "step-%06lld", (long long)step_);
      dir = opt_.out_dir + "/" + name;
    }
    export_to(dir, last_loss);
    std::printf("saved %s\n", dir.c_str());
  }
  if (on_sample) on_sample("after training");
  std::fflush(stdout);
  return code;
}

}  // namespace rt
