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
#pragma once
#include <cstdint>

#include "engine/backend.h"
#include "engine/cuda/engine_device.h"
#include "engine/cuda/gradient_sink.h"
#include "engine/cuda/weight_slots.h"
#include "engine/update_tracker.h"
#include "state/host_state.h"

namespace rt::cuda {

class OptimizerPhase {
 public:
  OptimizerPhase(HostState& st, EngineDevice& dev, UpdateTracker& track, WeightSlots& weights, GradientSink& grads)
      : st_(st), dev_(dev), track_(track), weights_(weights), grads_(grads) {}
  // Worker thread. backward_done: recorded on the compute stream after the
  // step's last gradient was made. apply = false: a skipped step (versions
  // still advance).
  void run(const OptimStep& o, float coef, bool apply, int64_t step, cudaEvent_t backward_done);
  // Time and parameter count of the last run.
  double seconds() const {
    return track_.read([&] { return seconds_; });
  }
  int64_t params() const {
    return track_.read([&] { return params_; });
  }

 private:
  void run_host(const OptimStep& o, float coef, bool apply, int64_t step);
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
  double seconds_ = 0;  // guarded by the tracker's mutex
  int64_t params_ = 0;
};

}  // namespace rt::cuda
