// RunLogger: everything a training run reports while it runs.
//   - the per-step log line on stdout (loss, lr, grad norm, tok/s, epoch, host
//     RSS and device memory when the backend reports it);
//   - the progress bar on stderr when stderr is a terminal (redrawn in place;
//     cleared before any other line is printed, through clear_progress());
//   - the metrics file: one JSON object per line, exact doubles, with the
//     wall-clock time ("time": Unix seconds, "elapsed": seconds since the
//     logger started); this is the plot data (scripts/plot.py reads it).
// Metrics policy: a failed write (full disk, I/O error) is reported once on
// stderr with the path and the reason; training continues and later records
// are dropped (the run is worth more than its log). An open failure at the
// start is an error.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace rt {

struct StepLog {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;
  double seconds = 0;
  bool skipped = false;
  double epoch = 0;  // fractional epoch reached after the step (0: unknown)
  // MoE models: tokens routed to each expert of each layer over the step's
  // micro-batches ([layers x experts], layer-major; empty: dense) and the
  // step's mean load-balancing loss; the metrics record gets them as
  // "expert_tokens" (one list per layer) and "moe_aux_loss".
  std::vector<int64_t> expert_tokens;
  int64_t n_experts = 0;
  double moe_aux_loss = 0;
};

class RunLogger {
 public:
  // metrics_path "": no metrics file. append: keep what the file holds (a resumed run).
  RunLogger(const std::string& metrics_path, bool append, int64_t total_steps, int64_t log_every);
  ~RunLogger();
  RunLogger(const RunLogger&) = delete;
  RunLogger& operator=(const RunLogger&) = delete;

  // One optimizer step: its metrics record, and its log line when due (every
  // log_every steps, the first and the last). skipped_total/bad_in_a_row
  // describe skipped steps. device_bytes: the device memory in use (0: none).
  void step(const StepLog& s, int64_t skipped_total, int64_t bad_in_a_row, uint64_t device_bytes);
  // An evaluation: the validation loss and/or the --eval-data loss (NaN: none).
  void eval(int64_t step, double val_loss, double eval_loss, bool final);
  // Redraws the progress bar (terminal only).
  void progress(int64_t step, double epoch, uint64_t device_bytes);
  void clear_progress();
  bool metrics_failed() const { return metrics_failed_; }
  double elapsed() const;

 private:
  void write_record(const std::string& json_object_body);
  void write_line(const std::string& line);
  std::string path_;
  FILE* metrics_ = nullptr;
  bool metrics_failed_ = false;
  bool tty_ = false;
  int64_t total_steps_, log_every_;
  double tokens_since_log_ = 0, secs_since_log_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

// A second destination for every metrics record (the Python module's
// callbacks): the record's JSON object exactly as the metrics file gets it,
// without the newline, also when there is no metrics file. Called on the
// training thread, after the file's write. An empty function: none.
using MetricsSink = std::function<void(const std::string& json_object)>;
void set_metrics_sink(MetricsSink sink);

// Resident set size of this process in bytes (/proc/self/statm; 0 when unknown).
uint64_t host_rss_bytes();
// "1.23 GiB" / "456.0 MiB".
std::string memory_string(uint64_t bytes);

}  // namespace rt
