// The training loop (CPU backend): micro-batches with gradient accumulation,
// exact global-norm clipping, AdamW over the host arenas, LR schedule,
// validation, per-step logs, periodic export, and a clean stop on SIGINT.
//
// Loss and gradient scale: the loss of a step is the mean over every
// predicted token of all its micro-batches, so accumulating k micro-batches
// of B rows gives the same gradient as one batch of k*B rows.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/host_state.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace rt {

struct TrainOptions {
  int64_t steps = 100;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  AdamWHyper adam;
  double weight_decay = 0.0;
  bool decay_norms_and_biases = false;  // HF default: no decay on norms and biases
  double clip = 1.0;                    // <= 0: off
  LrSchedule lr;
  int64_t eval_every = 0;    // 0: only at the end
  int64_t eval_batches = 8;
  int64_t log_every = 1;
  int64_t save_every = 0;    // 0: only at the end
  std::string out_dir;       // "" : no export
  DType export_dtype = DType::bf16;
  std::string tokenizer = "byte";
  std::string copy_from_dir;            // export also copies these files from this dir
  std::vector<std::string> copy_files;  // (the model's tokenizer files), see ExportOptions
  std::map<std::string, std::string> resolved_config;  // for ramtrain.json
};

struct StepResult {
  int64_t step;
  double loss;
  double grad_norm;
  double lr;
  int64_t tokens;
  double seconds;
  bool skipped;
};

class Trainer {
 public:
  // backend: nullptr = the CPU reference backend.
  Trainer(HostState& state, BatchSource& data, const TrainOptions& opt, std::unique_ptr<Backend> backend = nullptr);

  // One optimizer step (grad_accum micro-batches). step is 1-based.
  StepResult step();
  // Mean validation loss over the fixed validation batches (NaN when none).
  double evaluate();
  // Runs the whole schedule with logs; returns the exit code (0, or 130 when
  // stopped by SIGINT after saving).
  int run(const std::function<void(const char* when)>& on_sample = nullptr);
  int64_t steps_done() const { return step_; }
  void export_to(const std::string& dir, double loss);

  static std::atomic<bool>& stop_flag();  // set by the SIGINT handler

 private:
  HostState& state_;
  BatchSource& data_;
  TrainOptions opt_;
  std::unique_ptr<Backend> backend_;
  int64_t step_ = 0;       // optimizer steps taken
  int64_t adam_t_ = 0;     // steps applied (skipped ones do not count)
  int64_t skipped_ = 0;
};

// A validated schedule: kind "constant", "cosine" or "linear".
LrSchedule make_lr_schedule(const std::string& kind, double peak, int64_t warmup, int64_t total, double min_lr_ratio);

// Installs a SIGINT/SIGTERM handler that asks the loop to stop at the next
// step boundary; a second signal exits at once.
void install_stop_handler();

}  // namespace rt
