// The stream engine's start-up report (stream_engine.cpp, verbose): the plan
// it runs (slots, where gradients, checkpoints and the embedding live, kept
// layers, layer-major, MLP chunks, device memory) and the host RAM it holds.
#pragma once
#include <cstdint>

#include "cuda/device_memory.h"
#include "engine/backend.h"
#include "engine/cuda/muon_gpu.h"
#include "engine/device_plan.h"
#include "model/block.h"
#include "state/host_state.h"

namespace rt::cuda {

struct EngineSetup {
  const CudaOptions& opt;
  const DevicePlacement& place;
  const HostState& st;
  int slots;
  uint64_t weights_pinned;  // WeightSlots::pinned_bytes
  int64_t keep;             // layers whose activations stay forward to backward
  uint64_t act_bytes;       // one layer's activations
  int64_t K;                // micro-batches the buffers hold
  const BlockDims& dm;
  const DeviceAllocator& alloc;
  const GpuOrthogonalizer* muon;  // null: no Muon
  const GpuDataParallel& dp;
  int64_t attn_keep = 0;     // layers keeping their attention half (selective recompute)
  uint64_t attn_bytes = 0;   // one such layer's halves (layer-major: one per micro-batch)
};

void print_engine_setup(const EngineSetup& e);

}  // namespace rt::cuda
