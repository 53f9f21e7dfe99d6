// The training loop (CPU backend): micro-batches with gradient accumulation,
// exact global-norm clipping, AdamW over the host arenas, LR schedule,
// validation, per-step logs, checkpoints (io/checkpoint.h: every save_every
// steps in the background, and on SIGINT/SIGTERM), exact resume, the HF
// export of the final model to out_dir/final, and failure handling.
//
// Failures: a step whose loss or gradient norm is not finite is skipped (no
// update; its data and its LR-schedule position are consumed), counted and
// logged; max_bad_steps skipped steps in a row abort the run with a message
// naming the step the streak started at. A checkpoint that cannot be written
// (e.g. a full disk) stops the run with an error; the previous one is intact.
// Test hook: RAMTRAIN_INJECT_NAN_AT_STEP=k (or "a-b", comma lists) makes the
// loss of those steps NaN (backends that honour OptimStep::inject_nan: CPU).
//
// Loss and gradient scale: the loss of a step is the mean over every
// predicted token of all its micro-batches, so accumulating k micro-batches
// of B rows gives the same gradient as one batch of k*B rows.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/backend.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/muon.h"
#include "state/host_state.h"

namespace rt {

struct TrainOptions {
  int64_t steps = 100;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  AdamWHyper adam;
  QuantRounding moment_rounding = QuantRounding::stochastic;  // quantized moments (state/moment_quant.h)
  MuonHyper muon;  // a state with UpdateRule::muon (optim/muon.h)
  double weight_decay = 0.0;
  bool decay_norms_and_biases = false;  // HF default: no decay on norms and biases
  double clip = 1.0;                    // <= 0: off
  bool delayed_update = false;          // apply step t's update during step t+1 (backend.h): the log says so, and
                                        // the trainer's own CPU backend does it; a given backend must match
  // Layers whose activations stay from forward to backward (no recompute there;
  // bit-identical results); -1: as many as fit (backend.h, keep_activations).
  int64_t keep_activations = -1;
  // Layers keeping their attention half only (backend.h, keep_attention); -1: auto.
  int64_t keep_attention = -1;
  // MLP token chunk of the CPU backend the trainer makes (make_cpu_backend).
  int64_t mlp_chunk_tokens = 0;
  // --grads fold on the trainer's CPU backend: the twin of the CUDA engine's
  // folded updates (engine/fold_clip.h: clipping by the partial norm).
  bool fold_grads = false;
  // --matmul of the CPU backend the trainer makes (a given backend has its own).
  MatmulMode matmul = MatmulMode::bf16;
  // --state-dir / --max-host-memory: the CPU backend's optimizer state paged
  // through a file in state_dir (state/state_tier.h); "" all in RAM.
  std::string state_dir;
  uint64_t max_host_memory = 0;  // 0: every unit's state paged
  LrSchedule lr;
  int64_t eval_every = 0;  // 0: only at the end
  int64_t eval_batches = 8;
  int64_t log_every = 1;
  int64_t save_every = 0;        // checkpoint every N steps (and at the last step); 0: only on SIGINT/SIGTERM
  int64_t keep_checkpoints = 3;  // newest checkpoints kept in out_dir (0: all)
  int64_t max_bad_steps = 5;     // abort after this many skipped steps in a row (0: never)
  std::string metrics_path;      // JSON lines: one per step and per evaluation (engine/run_logger.h; "": none)
  bool metrics_append = true;    // false: a fresh run truncates the file
  // Held-out data (--eval-data): evaluated beside the validation part, on its
  // first eval_batches micro-batches in its seeded order (null: none).
  BatchSource* eval_data = nullptr;
  std::string out_dir;  // "" : no export, no checkpoints
  // A data-parallel GPU rank > 0 (no out_dir): it takes part in rank 0's
  // checkpoint gathers (Backend::gather_unit) at the same steps.
  bool follow_saves = false;
  DType export_dtype = DType::bf16;
  bool export_final = true;  // false: no out_dir/final at the end (checkpoints still written)
  std::string tokenizer = "byte";
  std::string copy_from_dir;                           // export also copies these files from this dir
  std::vector<std::string> copy_files;                 // (the model's tokenizer files), see ExportOptions
  std::map<std::string, std::string> resolved_config;  // for ramtrain.json and checkpoints
  // Recorded in checkpoints so that a resume can check it runs on the same thing.
  uint64_t seed = 0;
  std::vector<std::string> data_paths;
  std::string source_model_dir;  // "" when started from a preset; tokenizer files are copied from it
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

// The state tier of a run on backend b (--state-dir dir, --max-host-memory;
// state/state_tier.h): the weights page too when the budget asks and the
// backend can (Backend::weight_paging_refusal), the backend told before the
// tier moves them and after (Backend::weights_will_page, weights_paged).
std::unique_ptr<StateTier> make_state_tier(HostState& s, Backend& b, const std::string& dir, uint64_t max_host_bytes);

class Trainer {
 public:
  // backend: nullptr = the CPU reference backend.
  Trainer(HostState& state, BatchSource& data, const TrainOptions& opt, std::unique_ptr<Backend> backend = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (grad_accum micro-batches). step is 1-based.
  StepResult step();
  // Mean validation loss over the fixed validation batches (NaN when none).
  double evaluate();
  // Mean loss over the --eval-data batches (NaN when none).
  double evaluate_held_out();
  // Runs the whole schedule with logs; returns the exit code: 0, or 128 +
  // signal (130 SIGINT, 143 SIGTERM) when stopped by a signal after saving a
  // checkpoint. Throws rt::Error when too many steps in a row are bad or a
  // checkpoint cannot be written.
  int run(const std::function<void(const char* when)>& on_sample = nullptr);
  int64_t steps_done() const { return step_; }
  void export_to(const std::string& dir, double loss);

  // Continue from a checkpoint: counters, streak and the data cursor (the
  // weights and moments are loaded into HostState by checkpoint_load_state).
  void restore(const TrainerCheckpoint& c);
  // The trainer's state now, as a checkpoint records it.
  TrainerCheckpoint checkpoint_meta() const;
  // Writes a checkpoint of the state after the current step into out_dir.
  SaveReport save_checkpoint(bool background);
  // The state tier paging the optimizer state (--state-dir), nullptr when all is in RAM.
  StateTier* state_tier() { return tier_.get(); }

  static std::atomic<bool>& stop_flag();  // set by the SIGINT/SIGTERM handler
  static int stop_signal();               // the signal that set it (0: none)

 private:
  HostState& state_;
  BatchSource& data_;
  TrainOptions opt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StateTier> tier_;  // --state-dir (after backend_: destroyed first)
  void report_save(const SaveReport& r, bool started);
  double epoch_now() const;  // fractional epoch of the data cursor

  RunIdentity run_;
  int64_t step_ = 0;    // optimizer steps taken
  int64_t adam_t_ = 0;  // steps applied (skipped ones do not count)
  int64_t skipped_ = 0;
  int64_t bad_in_a_row_ = 0, bad_since_ = 0;
  int64_t last_saved_step_ = -1;
  std::vector<std::pair<int64_t, int64_t>> inject_nan_;  // [a, b] step ranges (test hook)
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<Batch> eval_batches_;  // drawn once from opt_.eval_data
};

// A validated schedule: kind "constant", "cosine" or "linear".
LrSchedule make_lr_schedule(const std::string& kind, double peak, int64_t warmup, int64_t total, double min_lr_ratio);

// Installs a SIGINT/SIGTERM handler that asks the loop to stop at the next
// step boundary (and save), and sampling at the next token
// (SampleOptions::stop = &Trainer::stop_flag()); a second signal exits at once.
void install_stop_handler();
// Forgets a stop asked for earlier (stop_flag and stop_signal), so that a
// process that runs several commands (the Python module) starts each afresh.
void reset_stop_request();

}  // namespace rt
