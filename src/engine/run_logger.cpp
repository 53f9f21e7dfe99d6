#include "engine/run_logger.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace rt {

namespace {

std::string json_number(double x) { return std::isfinite(x) ? nlohmann::json(x).dump() : "null"; }

std::string fmt_duration(double s) {
  char buf[32];
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

double unix_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

MetricsSink& metrics_sink() {
  static MetricsSink sink;
  return sink;
}

}  // namespace

void set_metrics_sink(MetricsSink sink) { metrics_sink() = std::move(sink); }

uint64_t host_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

std::string memory_string(uint64_t bytes) {
  char b[32];
  const double gib = static_cast<double>(bytes) / (1ull << 30);
  if (gib >= 1)
    std::snprintf(b, sizeof b, "%.2f GiB", gib);
  else
    std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

RunLogger::RunLogger(const std::string& metrics_path, bool append, int64_t total_steps, int64_t log_every)
    : path_(metrics_path),
      tty_(::isatty(STDERR_FILENO)),
      total_steps_(total_steps),
      log_every_(log_every < 1 ? 1 : log_every),
      t0_(std::chrono::steady_clock::now()) {
  if (path_.empty()) return;
  const std::string parent = path_dirname(path_);
  if (!parent.empty()) make_dirs(parent);
  metrics_ = std::fopen(path_.c_str(), append ? "a" : "w");
  if (!metrics_) fail("[train] cannot open --metrics ", path_, " for writing: ", std::strerror(errno));
}

RunLogger::~RunLogger() {
  if (metrics_) std::fclose(metrics_);
}

double RunLogger::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void RunLogger::write_record(const std::string& body) {
  const bool to_file = metrics_ && !metrics_failed_;
  if (!to_file && !metrics_sink()) return;
  char t[96];
  std::snprintf(t, sizeof t, ", \"time\": %.3f, \"elapsed\": %.3f}\n", unix_seconds(), elapsed());
  const std::string line = "{" + body + t;
  if (to_file) write_line(line);
  if (metrics_sink()) metrics_sink()(line.substr(0, line.size() - 1));
}

void RunLogger::write_line(const std::string& line) {
  errno = 0;
  const bool ok = std::fwrite(line.data(), 1, line.size(), metrics_) == line.size() && std::fflush(metrics_) == 0;
  if (ok) return;
  metrics_failed_ = true;
  const int err = errno;
  clear_progress();
  std::fflush(stdout);
  std::fprintf(stderr,
               "warning: cannot write to --metrics %s (%s); training continues, but this and later metrics records "
               "are dropped (the step log on stdout still has the losses)\n",
               path_.c_str(), err ? std::strerror(err) : "write error");
  std::fflush(stderr);
}

void RunLogger::step(const StepLog& s, int64_t skipped_total, int64_t bad_in_a_row, uint64_t device_bytes) {
  tokens_since_log_ += static_cast<double>(s.tokens);
  secs_since_log_ += s.seconds;
  std::string moe;
  if (!s.expert_tokens.empty() && s.n_experts > 0) {
    moe = cat(", \"moe_aux_loss\": ", json_number(s.moe_aux_loss), ", \"expert_tokens\": [");
    for (size_t i = 0; i < s.expert_tokens.size(); ++i) {
      const bool first = i % static_cast<size_t>(s.n_experts) == 0;
      if (first) moe += i ? "], [" : "[";
      else moe += ", ";
      moe += std::to_string(s.expert_tokens[i]);
    }
    moe += "]]";
  }
  write_record(cat("\"step\": ", s.step, ", \"loss\": ", json_number(s.loss), ", \"grad_norm\": ",
                   json_number(s.grad_norm), ", \"lr\": ", json_number(s.lr), ", \"tokens\": ", s.tokens,
                   ", \"skipped\": ", s.skipped ? "true" : "false", ", \"epoch\": ", json_number(s.epoch), moe));
  clear_progress();
  if (s.skipped) {
    std::printf("step %lld: skipped (loss %g, grad norm %g are not finite); %lld skipped so far, %lld in a row\n",
                (long long)s.step, s.loss, s.grad_norm, (long long)skipped_total, (long long)bad_in_a_row);
  } else if (s.step % log_every_ == 0 || s.step == 1 || s.step == total_steps_) {
    std::string mem = "rss " + memory_string(host_rss_bytes());
    if (device_bytes) mem += " | gpu " + memory_string(device_bytes);
    std::printf("step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | epoch %.2f | %s\n",
                (long long)s.step, (long long)total_steps_, s.loss, s.lr, s.grad_norm,
                secs_since_log_ > 0 ? tokens_since_log_ / secs_since_log_ : 0.0, s.epoch, mem.c_str());
    tokens_since_log_ = secs_since_log_ = 0;
  }
}

void RunLogger::eval(int64_t step, double val_loss, double eval_loss, bool final) {
  clear_progress();
  if (std::isfinite(val_loss)) {
    if (final)
      std::printf("final validation loss %.4f after %lld steps\n", val_loss, (long long)step);
    else
      std::printf("step %5lld | validation loss %.4f\n", (long long)step, val_loss);
  }
  if (std::isfinite(eval_loss)) {
    if (final)
      std::printf("final eval-data loss %.4f (perplexity %.3f)\n", eval_loss, std::exp(eval_loss));
    else
      std::printf("step %5lld | eval-data loss %.4f\n", (long long)step, eval_loss);
  }
  std::string body = cat("\"step\": ", step, ", \"val_loss\": ", json_number(val_loss));
  if (std::isfinite(eval_loss)) body += cat(", \"eval_loss\": ", json_number(eval_loss));
  if (final) body += ", \"final\": true";
  write_record(body);
}

void RunLogger::progress(int64_t step, double epoch, uint64_t device_bytes) {
  if (!tty_) return;
  const double el = elapsed(), frac = static_cast<double>(step) / static_cast<double>(total_steps_);
  const int bar = static_cast<int>(frac * 20);
  std::string mem = "rss " + memory_string(host_rss_bytes());
  if (device_bytes) mem += ", gpu " + memory_string(device_bytes);
  std::fprintf(stderr, "\r\033[K[%.*s%*s] %3d%% step %lld/%lld, epoch %.2f, %s, %s elapsed, ETA %s", bar,
               "====================", 20 - bar, "", static_cast<int>(frac * 100), (long long)step,
               (long long)total_steps_, epoch, mem.c_str(), fmt_duration(el).c_str(),
               fmt_duration(frac > 0 ? el / frac * (1 - frac) : 0).c_str());
  std::fflush(stderr);
}

void RunLogger::clear_progress() {
  if (tty_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace rt
