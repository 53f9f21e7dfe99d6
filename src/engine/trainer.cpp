#include "engine/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "engine/run_logger.h"
#include "io/hf_export.h"
#include "model/spec_multimodal.h"
#include "state/state_tier.h"

namespace rt {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::atomic<int> g_stop_signal{0};

void signal_handler(int sig) {
  if (Trainer::stop_flag().exchange(true)) {  // a second signal: quit now (write(2) is async-signal-safe)
    static const char msg[] =
        "\nramtrain: second interrupt: quitting at once, without a checkpoint; the steps since the last one are "
        "lost (continue with --resume auto; a half-written checkpoint is skipped)\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
  g_stop_signal.store(sig);
}

// RAMTRAIN_INJECT_NAN_AT_STEP: "k", "a-b" or a comma list of those.
std::vector<std::pair<int64_t, int64_t>> inject_nan_parse() {
  std::vector<std::pair<int64_t, int64_t>> out;
  const char* env = std::getenv("RAMTRAIN_INJECT_NAN_AT_STEP");
  if (!env || !*env) return out;
  const std::string s = env;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    const std::string item = s.substr(b, e - b);
    char* end = nullptr;
    long long lo = std::strtoll(item.c_str(), &end, 10), hi = lo;
    if (*end == '-') hi = std::strtoll(end + 1, &end, 10);
    if (item.empty() || *end || lo < 1 || hi < lo)
      fail("[train] RAMTRAIN_INJECT_NAN_AT_STEP='", s, "' (a test hook) must be steps like 7, 3-9 or 2,5-6");
    out.push_back({lo, hi});
    b = e + 1;
  }
  return out;
}

std::string mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

std::string abs_path(const std::string& p) {
  std::error_code ec;
  std::filesystem::path a = std::filesystem::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
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

int Trainer::stop_signal() { return g_stop_signal.load(); }

void install_stop_handler() {
  std::signal(SIGINT, signal_handler);
  std::signal(SIGTERM, signal_handler);
}

void reset_stop_request() {
  Trainer::stop_flag().store(false);
  g_stop_signal.store(0);
}

std::unique_ptr<StateTier> make_state_tier(HostState& s, Backend& b, const std::string& dir, uint64_t max_host_bytes) {
  const std::string why = b.weight_paging_refusal();
  const TierOptions o{dir, max_host_bytes, "[train]", why.empty(), why};
  // the placement the tier will make (tier_place is pure): the backend unpins what it must before the weights go
  const bool weights = tier_place(tier_unit_bytes(s), max_host_bytes, o.page_weights).weights_paged;
  if (weights) b.weights_will_page();
  auto t = std::make_unique<StateTier>(s, o);
  RT_CHECK(t->plan().weights_paged == weights, "[train] internal: the state tier's placement changed");
  if (weights) b.weights_paged();
  return t;
}

Trainer::Trainer(HostState& state, BatchSource& data, const TrainOptions& opt, std::unique_ptr<Backend> backend)
    : state_(state), data_(data), opt_(opt), backend_(std::move(backend)) {
  RT_CHECK(opt_.micro_batch >= 1, "[train] --micro-batch must be >= 1");
  RT_CHECK(opt_.grad_accum >= 1, "[train] --grad-accum must be >= 1");
  RT_CHECK(opt_.steps >= 1, "[train] --steps must be >= 1");
  RT_CHECK(data_.seq_len() <= state_.spec().max_sequence(), "[train] --seq-len ", data_.seq_len(),
           " exceeds the model's ", state_.spec().max_sequence_why());
  if (!backend_)
    backend_ = make_cpu_backend(state_, opt_.delayed_update, opt_.keep_activations, false, opt_.mlp_chunk_tokens,
                                opt_.fold_grads, opt_.keep_attention, opt_.matmul);
  if (!opt_.state_dir.empty()) {  // after the backend: it converts the master and allocates the gradients first
    RT_CHECK(backend_->pages_state(), "[train] --state-dir: this backend (", backend_->describe(),
             ") keeps its optimizer state in RAM (data-parallel runs shard it instead); drop --state-dir");
    tier_ = make_state_tier(state_, *backend_, opt_.state_dir, opt_.max_host_memory);
    std::printf("%s\n", tier_->describe().c_str());
  }
  inject_nan_ = inject_nan_parse();
  run_.seed = opt_.seed;
  for (const std::string& p : opt_.data_paths) run_.data_paths.push_back(abs_path(p));
  run_.train_tokens = data_.train_token_count();
  run_.val_tokens = data_.val_token_count();
  run_.train_windows = data_.train_window_count();
  run_.data_fingerprint = dataset_fingerprint(data_);
  run_.source_model_dir = opt_.source_model_dir.empty() ? "" : abs_path(opt_.source_model_dir);
  run_.source_multimodal = !opt_.source_model_dir.empty() && config_file_is_multimodal(opt_.source_model_dir);
  run_.tokenizer = opt_.tokenizer;
  run_.run_config = opt_.resolved_config;
}

Trainer::~Trainer() = default;

void Trainer::restore(const TrainerCheckpoint& c) {
  RT_CHECK(c.adam_t + c.skipped == c.step, "[train] inconsistent checkpoint counters");
  data_.set_cursor(c.cursor);
  step_ = c.step;
  adam_t_ = c.adam_t;
  skipped_ = c.skipped;
  bad_in_a_row_ = c.bad_in_a_row;
  bad_since_ = c.bad_since;
  last_saved_step_ = c.step;
}

TrainerCheckpoint Trainer::checkpoint_meta() const {
  TrainerCheckpoint c;
  c.step = step_;
  c.adam_t = adam_t_;
  c.skipped = skipped_;
  c.bad_in_a_row = bad_in_a_row_;
  c.bad_since = bad_since_;
  c.cursor = data_.cursor();
  c.run = run_;
  return c;
}

SaveReport Trainer::save_checkpoint(bool background) {
  const size_t U = state_.units().size();
  if (opt_.out_dir.empty() && opt_.follow_saves) {  // a data-parallel rank > 0: its part of rank 0's gathers
    backend_->sync();
    for (size_t u = 0; u < U; ++u) backend_->gather_unit(u, nullptr);
    last_saved_step_ = step_;
    return {};
  }
  RT_CHECK(!opt_.out_dir.empty(), "[train] no output directory to save a checkpoint into");
  if (!writer_) writer_ = std::make_unique<CheckpointWriter>(opt_.out_dir, opt_.keep_checkpoints);
  if (auto done = writer_->wait()) report_save(*done, false);
  backend_->sync();
  SaveReport r;
  if (backend_->gathers_checkpoints()) {  // unit by unit from every rank's slices, written as they arrive
    std::vector<float> staging;
    r = writer_->save_gathered(state_.spec(), U, checkpoint_meta(), [&](size_t u) {
      const StateUnit& layout = state_.units()[u];
      staging.resize(static_cast<size_t>(3 * layout.numel));
      backend_->gather_unit(u, staging.data());
      const float* p = staging.data();
      return unit_snap_fp32(layout, p, p + layout.numel, p + 2 * layout.numel);
    });
  } else if (tier_) {  // paged units: each read in (clean), copied into the checkpoint, freed; the next read ahead
    auto& units = state_.units();
    r = writer_->save_gathered(state_.spec(), U, checkpoint_meta(), [&](size_t u) {
      if (u > 0) tier_->release(u - 1, false);
      if (u + 1 < U) tier_->prefetch(u + 1);
      tier_->acquire(u);
      return unit_snap_live(units[u]);
    });
    tier_->release(U - 1, false);
  } else {
    r = writer_->save(state_, checkpoint_meta(), background);
  }
  last_saved_step_ = step_;
  report_save(r, r.background);
  return r;
}

void Trainer::report_save(const SaveReport& r, bool started) {
  auto secs = [](double t) {
    char b[32];
    if (t < 1)
      std::snprintf(b, sizeof b, "%.2f ms", t * 1e3);
    else
      std::snprintf(b, sizeof b, "%.2f s", t);
    return std::string(b);
  };
  if (!r.note.empty()) std::printf("checkpoint note: %s\n", r.note.c_str());
  if (started)
    std::printf("checkpoint step %lld: state copied in %s (training paused %s); writing in the background\n",
                (long long)r.step, secs(r.stall_seconds).c_str(), secs(r.stall_seconds).c_str());
  else
    std::printf("checkpoint saved: %s (%s written in %s%s; training paused %s)\n", r.path.c_str(), mib(r.bytes).c_str(),
                secs(r.write_seconds).c_str(), r.background ? " in the background" : " synchronously",
                secs(r.stall_seconds).c_str());
  std::fflush(stdout);
}

double Trainer::epoch_now() const {
  const DataCursor c = data_.cursor();
  const uint64_t w = data_.train_window_count();
  return static_cast<double>(c.epoch) + (w ? static_cast<double>(c.index) / static_cast<double>(w) : 0.0);
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
  if (n_valid_total == 0) {
    ++skipped_;
    return r;
  }
  OptimStep o;
  o.lr = r.lr;
  o.t = adam_t_ + 1;
  o.hyper = opt_.adam;
  o.weight_decay = opt_.weight_decay;
  o.decay_norms_and_biases = opt_.decay_norms_and_biases;
  o.clip = opt_.clip;
  o.moment_rounding = opt_.moment_rounding;
  o.muon = opt_.muon;
  o.rounding_seed = opt_.seed;
  for (auto& [a, b] : inject_nan_) o.inject_nan |= step_ >= a && step_ <= b;
  StepStats st = backend_->train_step(batches, n_valid_total, o);
  r.loss = st.loss_sum / static_cast<double>(n_valid_total);
  r.grad_norm = st.grad_norm;
  r.skipped = !st.applied;
  if (st.applied)
    ++adam_t_;
  else
    ++skipped_;
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

double Trainer::evaluate_held_out() {
  if (!opt_.eval_data) return NAN;
  if (eval_batches_.empty()) {
    const DataCursor keep = opt_.eval_data->cursor();
    opt_.eval_data->set_cursor(DataCursor{});
    const int64_t B = opt_.micro_batch;
    const int64_t whole = static_cast<int64_t>((opt_.eval_data->train_window_count() + B - 1) / B);
    for (int64_t i = 0; i < std::min(opt_.eval_batches, whole); ++i)
      eval_batches_.push_back(opt_.eval_data->next_batch(opt_.micro_batch));
    opt_.eval_data->set_cursor(keep);
  }
  double sum = 0;
  int64_t n = 0;
  for (auto& b : eval_batches_) {
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
  eo.source_model_dir = opt_.source_model_dir;
  eo.info["step"] = std::to_string(step_);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", loss);
  eo.info["train_loss"] = buf;
  eo.info["data_cursor"] = data_.cursor().to_string();
  for (auto& [k, v] : opt_.resolved_config) eo.info["config." + k] = v;
  export_hf_dir(dir, state_, eo);
}

int Trainer::run(const std::function<void(const char*)>& on_sample) {
  const auto t_start = clock_type::now();
  RunLogger log(opt_.metrics_path, opt_.metrics_append || step_ > 0, opt_.steps, opt_.log_every);
  int64_t tokens_seen = 0;
  double last_loss = NAN;
  auto device_bytes = [&] { return backend_->stats().device_peak_bytes; };
  std::printf("backend: %s\n", backend_->describe().c_str());
  const std::string held =
      state_.weights_only() ? std::string("bf16 weights only; the fp32 master and Adam m, v are in this rank's shards")
                            : cat(master_storage_name(state_.master_storage()), " master, ",
                                  optimizer_name(state_.update_rule(), state_.moment_storage()), " moments",
                                  state_.moment_storage() == MomentStorage::fp32
                                      ? ""
                                      : cat(", ", quant_rounding_name(opt_.moment_rounding), " rounding"));
  std::printf(
      "training %lld steps: micro-batch %lld x %lld tokens, accumulation %lld, %lld params, "
      "%.2f B/param host state (%s), optimizer %s\n",
      (long long)opt_.steps, (long long)opt_.micro_batch, (long long)data_.seq_len(), (long long)opt_.grad_accum,
      (long long)state_.n_params(), state_.bytes_per_param(), held.c_str(), simd_level_name(simd_level_active()));
  if (state_.update_rule() == UpdateRule::muon)
    std::printf(
        "optimizer %s: Muon (momentum %g, Nesterov, 5 Newton-Schulz steps, update scaled by 0.2*sqrt(max(rows, "
        "cols)) to share AdamW's lr) for the layers' 2-D matrices; AdamW for the embedding, head, norms, biases "
        "and routers\n",
        optimizer_name(state_.update_rule(), state_.moment_storage()),
        opt_.muon.momentum >= 0 ? opt_.muon.momentum : opt_.adam.beta1);
  if (opt_.delayed_update)
    std::printf(
        "delayed update: the update of step t is applied during step t+1 (gradients one step stale, the "
        "optimizer overlaps the next step); pending updates are applied before checkpoints, the final "
        "evaluation and the export\n");
  if (step_ > 0)
    std::printf("continuing at step %lld of %lld (data cursor %s, %lld skipped steps so far)\n", (long long)step_ + 1,
                (long long)opt_.steps, data_.cursor().to_string().c_str(), (long long)skipped_);
  if (!opt_.metrics_path.empty()) std::printf("metrics: %s\n", opt_.metrics_path.c_str());
  std::fflush(stdout);
  if (on_sample) on_sample("before training");
  std::fflush(stdout);
  const bool saving = !opt_.out_dir.empty() || opt_.follow_saves;
  const int64_t first_step = step_;
  int code = 0;
  // A signal stops the run at the next step boundary; data-parallel GPU ranks
  // stop at the step their engine agreed on (Backend::stop_agreement).
  auto stopping = [&] {
    const int agreed = backend_->stop_agreement();
    return agreed < 0 ? stop_flag().load() : agreed == 1;
  };
  while (step_ < opt_.steps && !stopping()) {
    StepResult r = step();
    tokens_seen += r.tokens;
    if (!r.skipped) last_loss = r.loss;
    if (r.skipped) {
      if (bad_in_a_row_++ == 0) bad_since_ = r.step;
    } else {
      bad_in_a_row_ = 0;
      bad_since_ = 0;
    }
    StepLog sl;
    sl.step = r.step, sl.loss = r.loss, sl.grad_norm = r.grad_norm, sl.lr = r.lr;
    sl.tokens = r.tokens, sl.seconds = r.seconds, sl.skipped = r.skipped, sl.epoch = epoch_now();
    if (state_.spec().is_moe()) {  // the step's expert load (issue 32)
      EngineStats es = backend_->stats();
      sl.expert_tokens = std::move(es.moe_tokens_per_expert);
      sl.n_experts = state_.spec().moe.n_experts;
      sl.moe_aux_loss = es.moe_aux_loss;
    }
    log.step(sl, skipped_,
             bad_in_a_row_, device_bytes());
    if (r.skipped && opt_.max_bad_steps > 0 && bad_in_a_row_ >= opt_.max_bad_steps) {
      std::fflush(stdout);
      if (writer_) writer_->wait();
      fail("[train] ", bad_in_a_row_, " bad steps in a row (non-finite loss or gradient norm), starting at step ",
           bad_since_, ": aborting (--max-bad-steps ", opt_.max_bad_steps, "). No update was applied since step ",
           bad_since_ - 1, ". Lower --lr, raise --warmup or check the data",
           writer_ && !writer_->last_path().empty() ? cat(", then resume from ", writer_->last_path()) : std::string(),
           ".");
    }
    if (opt_.eval_every > 0 && r.step % opt_.eval_every == 0 && r.step != opt_.steps)
      log.eval(r.step, evaluate(), evaluate_held_out(), false);
    if (writer_)
      if (auto done = writer_->poll()) report_save(*done, false);
    if (saving && opt_.save_every > 0 && r.step % opt_.save_every == 0 && r.step != opt_.steps) save_checkpoint(true);
    std::fflush(stdout);
    log.progress(step_, epoch_now(), device_bytes());
  }
  if (stopping() && step_ < opt_.steps) {
    const int sig = stop_signal() ? stop_signal() : SIGINT;
    log.clear_progress();
    std::printf("interrupted by %s after step %lld: %s\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", (long long)step_,
                step_ == first_step ? "no step was taken, nothing to save"
                : saving            ? "saving a checkpoint and exiting"
                                    : "exiting (no --out: nothing is saved)");
    code = 128 + sig;
  }
  log.clear_progress();
  if (writer_)
    if (auto done = writer_->wait()) report_save(*done, false);
  const bool finished = code == 0;
  // Save before the final evaluation: a second signal must not lose the work.
  if (saving && last_saved_step_ != step_ && step_ > first_step && (!finished || opt_.save_every > 0))
    save_checkpoint(false);
  if (!finished) {
    if (saving && step_ > first_step)
      std::printf("resume with: ramtrain train --resume auto --out %s   (export with: ramtrain export %s --out DIR)\n",
                  opt_.out_dir.c_str(), writer_ ? writer_->last_path().c_str() : opt_.out_dir.c_str());
    std::fflush(stdout);
    return code;
  }
  backend_->sync();  // delayed update: the final evaluation sees the last update
  log.eval(step_, evaluate(), evaluate_held_out(), true);
  if (const EngineStats es = backend_->stats(); !es.moe_tokens_per_expert.empty()) {
    const auto [lo, hi] = std::minmax_element(es.moe_tokens_per_expert.begin(), es.moe_tokens_per_expert.end());
    const auto idle = std::count(es.moe_tokens_per_expert.begin(), es.moe_tokens_per_expert.end(), int64_t{0});
    std::printf(
        "expert load, last step: %lld to %lld tokens per expert and layer, %lld of %zu idle; "
        "load-balancing loss %.4f\n",
        (long long)*lo, (long long)*hi, (long long)idle, es.moe_tokens_per_expert.size(), es.moe_aux_loss);
  }
  std::printf("trained %lld tokens in %.1f s\n", (long long)tokens_seen, seconds_since(t_start));
  if (tier_) {
    const StateTier::Stats ts = tier_->stats();
    std::printf(
        "state tier: %.2f GB read, %.2f GB written; the optimizer waited %.2f s for reads; at most %.1f MiB "
        "of paged state in RAM at once\n",
        static_cast<double>(ts.read_bytes) / 1e9, static_cast<double>(ts.written_bytes) / 1e9, ts.wait_s,
        static_cast<double>(ts.paged_in_peak) / (1 << 20));
  }
  if (!opt_.out_dir.empty() && opt_.export_final) {
    const std::string dir = opt_.out_dir + "/final";
    export_to(dir, last_loss);
    std::printf("saved %s\n", dir.c_str());
  }
  if (on_sample) on_sample("after training");
  std::fflush(stdout);
  if (stop_flag().load()) return 128 + (stop_signal() ? stop_signal() : SIGINT);
  return code;
}

}  // namespace rt
