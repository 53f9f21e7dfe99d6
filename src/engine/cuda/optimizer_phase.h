// Optimizer phase: the CPU AdamW update of every unit, run as one job on the
// engine's worker thread after a step's backward. Host gradients: they are
// already in the host arenas; each unit is updated in forward order. Device
// gradients: in update_order (forward order; delayed update: head, embedding,
// last layer first), each unit's gradient goes device -> host in chunks
// through the sink's pinned ring, AdamW updates master/m/v chunk by chunk as
// they land and writes the bf16 shadow, and the tracker is told each chunk's
// progress, so the next step's load of unit u waits only on u's update.
// Delayed update: step t writes shadow t % 2 (a skipped step copies the
// other shadow, so it still holds the current weights).
// Paged weights (weight_slots.h, --state-dir): right after a unit's update,
// while it is paged in, its new weights go to the device (upload_paged, which
// returns when the copy is done), then the tier writes it back and frees it,
// then the unit is marked updated. A skipped update uploads nothing (the
// device holds the unchanged weights).
// Fold mode (--grads fold, engine/fold_clip.h): no phase after the backward;
// the sink hands each unit's gradient to fold() on the worker as it lands,
// which clips it by the partial norm, updates the unit in place and marks it
// updated. A unit larger than the sink's slabs (the LM head) comes in pieces,
// with its sum of squares from the device (rt::sum_squares's double) on the
// first: its clip coefficient is known before any piece updates, and each
// piece updates as it lands (update_unit_range: any split gives update_unit's
// bits); --state-dir pages its state in before its first piece and writes it
// back after its last.
// Deferred folds (enable_fold_defer): the first units in fold order (the
// head, then the last layers), up to a share of the parameters, are clipped
// as they land (the same partial norms) but their gradients are copied aside
// and their updates run after the step's last unit folded, in forward order,
// under the next step's forward, which needs them last. Only the time of
// those updates moves: the same update_unit_range on the same gradient and
// coefficient, so the same bits. Without it the next forward waits for every
// update (the embedding, which it needs first, folds last); with it, when the
// CPU update is longer than the backward, the forward starts once the
// undeferred units are done.
// Muon (--optimizer muon | muon8bit): host or fold gradients only (whole
// units; device_plan.cpp refuses --grads device); each unit's update runs
// as AdamW's does, with the engine's GPU orthogonaliser (muon_gpu.h) in the
// OptimStep, so each matrix's NS5 runs on the GPU, on the orthogonaliser's
// own streams, pipelined with this thread's host passes (optim/muon_unit.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/engine_device.h"
#include "engine/cuda/gradient_sink.h"
#include "engine/cuda/weight_slots.h"
#include "engine/fold_clip.h"
#include "engine/update_tracker.h"
#include "state/host_state.h"

namespace rt::cuda {

class OptimizerPhase {
 public:
  // orth (nullable): where Muon's NS5 runs (the engine's GPU orthogonaliser)
  // dp (data parallel, backend.h): device gradients already reduce-scattered;
  // each unit's own slice goes device -> host in chunks and updates the
  // shard's fp32 master, m and v, writing the bf16 of the slice into the
  // weights-only state's shadow (the loads all-gather the rest).
  OptimizerPhase(HostState& st, EngineDevice& dev, UpdateTracker& track, WeightSlots& weights, GradientSink& grads,
                 Orthogonalizer* orth = nullptr, const GpuDataParallel& dp = {})
      : st_(st), dev_(dev), track_(track), weights_(weights), grads_(grads), orth_(orth), dp_(dp) {}
  // Worker thread. backward_done: recorded on the compute stream after the
  // step's last gradient was made. apply = false: a skipped step (versions
  // still advance).
  void run(const OptimStep& o, float coef, bool apply, int64_t step, cudaEvent_t backward_done);
  // ---- fold mode ----
  // Compute thread, before the step's gradients land: the step's settings;
  // apply = false: no unit is updated (its loss is not finite); version: the
  // update count the units reach.
  void begin_fold(const OptimStep& o, bool apply, int64_t version);
  // Worker: elements [b, e) of unit u's step gradient, g[0] element b
  // (GradientSink::FoldFn: sumsq with a split unit's first piece).
  void fold(size_t u, int64_t b, int64_t e, const float* g, const double* sumsq);
  // Compute thread: waits until every unit has folded; each unit's sum of
  // squares (non-finite where its update was skipped) and whether all were
  // finite and applied.
  std::vector<double> wait_folded(bool* all_applied);
  // Construction: hold up to `fraction` (0..1) of the parameters' fold
  // gradients aside (whole units from the first in fold order), at most
  // max_bytes of host RAM, allocated and touched here. Not with a state
  // tier (paged units) or data parallelism. Returns the bytes held (0: off).
  uint64_t enable_fold_defer(double fraction, uint64_t max_bytes);
  size_t fold_deferred_units() const { return defer_at_.size(); }

  // Time and parameter count of the last run.
  double seconds() const {
    return track_.read([&] { return seconds_; });
  }
  int64_t params() const {
    return track_.read([&] { return params_; });
  }

 private:
  void run_host(const OptimStep& o, float coef, bool apply, int64_t step);
  void run_sharded(const OptimStep& o, float coef, bool apply, int64_t step);
  void finished(double seconds, int64_t params) {
    track_.update([&] {
      seconds_ = seconds;
      params_ = params;
    });
  }
  HostState& st_;
  EngineDevice& dev_;
  UpdateTracker& track_;
  WeightSlots& weights_;
  GradientSink& grads_;
  Orthogonalizer* orth_;
  GpuDataParallel dp_;
  double seconds_ = 0;  // guarded by the tracker's mutex
  int64_t params_ = 0;
  // fold mode: the step's settings (written before its first fold job is
  // pushed), the worker's clip state, and what it has folded (under the mutex)
  OptimStep fold_o_;
  bool fold_apply_ = false;
  int64_t fold_version_ = 0;
  FoldClip fold_clip_{0};
  std::vector<size_t> fold_order_;
  size_t fold_next_ = 0;
  // the unit being folded: where its next piece starts, its sum of squares and coefficient
  int64_t fold_at_ = 0;
  double fold_unit_sq_ = 0;
  float fold_coef_ = 1;
  double fold_seconds_ = 0;
  int64_t fold_params_ = 0;
  std::vector<double> fold_sq_;  // guarded by the tracker's mutex
  size_t folded_ = 0;            // guarded by the tracker's mutex: units whose norm is recorded
  bool fold_busy_ = false;       // guarded by the tracker's mutex: a step's fold jobs are not all done
  // deferred folds: the first defer_at_.size() units of fold_order_ (fixed at
  // enable_fold_defer), their gradients at defer_at_[k] in defer_buf_; this
  // step's deferred units (fold order) with their clip coefficients
  struct Deferred {
    size_t u, slot;  // the unit, its place in fold order
    float coef;
  };
  void run_deferred();
  std::vector<int64_t> defer_at_;
  std::unique_ptr<float[]> defer_buf_;
  std::vector<Deferred> deferred_;
  bool fold_defer_now_ = false;  // the unit being folded is deferred
};

}  // namespace rt::cuda
