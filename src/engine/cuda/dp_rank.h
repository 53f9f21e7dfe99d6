// The device side of a data-parallel GPU rank (GpuDataParallel, engine/backend.h;
// docs/multi_gpu.md): the step's gradient reduce-scatter and slice norms, and
// a checkpoint's gather of one unit. The stream engine (stream_engine.cpp)
// calls these at its points of the step; the weight all-gathers are the
// loads' (weight_slots.h), the slice updates the optimizer's (optimizer_phase.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/backend.h"
#include "engine/cuda/engine_device.h"
#include "engine/cuda/gradient_sink.h"

namespace rt::cuda {

// ", data-parallel rank r of N: ..." for the engine's describe(); "" when off.
std::string dp_describe(const GpuDataParallel& dp);

// After the step's backward is queued on the compute stream: every unit's
// device gradient (padded to world * S) summed over the ranks in place on the
// gradient communicator's stream (this rank's slice lands at rank * S), then
// the sums of squares of this rank's slices into norms[u] on the compute
// stream, which waits for the reductions (made, reduced: events to order them).
void dp_reduce_scatter(const GpuDataParallel& dp, GradientSink& grads, EngineDevice& dev, size_t n_units, double* norms,
                       Scratch sc, Event& made, Event& reduced);

// The step's norm, loss and tokens over every rank (dp_all_reduce_totals:
// the same doubles on every rank): nrm holds this rank's per-unit slice sums
// of squares, stats its own loss and tokens on entry and the whole step's on
// return; *stop_agreed: some rank was signalled (every rank stops after this
// step). Returns the squared norm.
double dp_step_totals(const GpuDataParallel& dp, const double* nrm, size_t n_units, StepStats* stats,
                      bool* stop_agreed);

// Unit u's fp32 master, m and v (numel each), each all-gathered in place
// through the unit's padded gradient buffer (idle and zero between steps;
// zeroed again after), into staging [master | m | v] (nullptr: this rank only
// takes part). The device must be idle (after sync()).
void dp_gather_unit(const GpuDataParallel& dp, GradientSink& grads, int64_t numel, size_t u, float* staging);

}  // namespace rt::cuda
