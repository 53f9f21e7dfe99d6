// Hopper attention kernels (src/cuda/attention_sm90.cu, built for sm_90a only).
// Internal to the CUDA backend: attention.cu checks shapes and pointers and
// decides which kernels run (see rt::cuda::set_attention_kernels in ops.h).
#pragma once
#include "cuda/attention/shape.h"
#include "cuda/ops.h"

namespace rt::cuda {

namespace sm90 {

// True when the current device is compute capability 9.0 (H100, H200, H20):
// the only GPUs that run sm_90a code.
bool device_supported();

// Same contract as rt::cuda::attention_forward (doc_start and sinks included;
// the window is s.window); D is 64 or 128 (checked by the caller).
void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                       const AttnShape& s, int64_t D, cudaStream_t stream, const int32_t* doc_start, const bf16* sinks);
// dq, dk, dv (=) from delta = rowsum(dO * O) [B, H, T] (fp32) computed by the caller.
void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const float* lse, const float* delta, int64_t B, const AttnShape& s, int64_t D,
                        cudaStream_t stream, const int32_t* doc_start);

}  // namespace sm90
}  // namespace rt::cuda
