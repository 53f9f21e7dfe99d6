// What every part of the streaming engine shares on the device side: the
// memory budget, the three streams (h2d: weights in; compute; d2h: gradients
// out), the tracer and the count of bytes copied in this step.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/cuda_ops.h"
#include "cuda/device_memory.h"
#include "cuda/trace.h"
#include "engine/backend.h"
#include "model/spec.h"

namespace rt::cuda {

struct EngineDevice {
  EngineDevice(uint64_t budget, std::string trace_path) : alloc(budget), tracer(std::move(trace_path)) {}
  DeviceAllocator alloc;
  Tracer tracer;
  Stream h2d, compute, d2h;
  Blas blas;
  uint64_t h2d_bytes = 0;  // host -> device bytes queued since the last step ended
};

// Bytes of the scratch every op of a step shares (the largest any needs):
// what the engine allocates, and plan_device's exact OpScratchBytes on CUDA.
uint64_t op_scratch_bytes(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o);
// The device memory the engine may take: what is free less room for the CUDA
// context, or --max-gpu-memory (refused when more than is free).
uint64_t device_budget(const CudaOptions& o);
// Refuses, naming the config key and --device cpu, the shapes the CUDA kernels
// do not take (widths not multiples of 8, head_dim, top-k > 32).
void check_cuda_shapes(const ModelSpec& s);

}  // namespace rt::cuda
