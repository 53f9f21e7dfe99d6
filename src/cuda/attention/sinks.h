// gpt-oss's attention sinks: the sink gradient both attention paths share
// (the fused kernels of attention.cu and the fallback of attention_masked.cu,
// which defines it). Internal to the CUDA backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops.h"

namespace rt::cuda {

// dsinks[h] += -sum over (b, t) of exp(sinks[h] - lse[b,h,t]) * delta[b,h,t]:
// P_sink (lse counts the sink) times the sink's dS = 0 - D_t, with delta =
// rowsum(dO * O) [B,H,T] fp32. One block per head summing its rows in a fixed
// order (deterministic); queued on stream.
void attention_sink_grad(float* dsinks, const bf16* sinks, const float* lse, const float* delta, int64_t B, int64_t H,
                         int64_t T, cudaStream_t stream);

}  // namespace rt::cuda
