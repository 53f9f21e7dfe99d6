// Every expert's weight gradients of a MoE layer call in one launch, for
// Hopper (src/cuda/moe_wgrad_sm90.cu, built for sm_90a only). Internal to the
// CUDA backend: cuda/moe.cu decides when it runs (MoeBlas::wgrad_kernel).
#pragma once
#include <cstdint>

#include "cuda/ops.h"

namespace rt::cuda::sm90 {

// One kind of expert weight gradient (gate's, up's or down's): for every
// expert e, out[e] [M, N] (fp32, row-major, +=) += a_e^T b_e, a_e and b_e
// expert e's rows [starts[e], starts[e + 1]) of a [P, M] and b [P, N] (bf16,
// row-major: the permuted rows of cuda/moe.cu's padded layout). out: a host
// array of E device pointers.
struct WgradProduct {
  const bf16* a;
  const bf16* b;
  int64_t M, N;
  float* const* out;
};
constexpr int kMaxWgradProducts = 3;

// Whether moe_weight_grads takes these products: E <= kMoeMaxGroupedExperts,
// 1..kMaxWgradProducts products, M and N multiples of 8 (TMA's 16-byte row
// pitch), every output 8-byte aligned, the inputs 16-byte aligned.
bool wgrad_shapes_ok(const WgradProduct* ps, int np, int64_t E);

// The products' gradients, one launch on `stream`. starts: [E + 1] on the
// device, each a multiple of 64 (kMoeChunk's padding), starts[E] <= P; an
// expert without rows leaves its gradients untouched. Each output tile is
// summed by one thread block in a fixed order (the expert's rows in 64-row
// steps, fp32), then added to out once: deterministic, no atomics. The
// caller checks device_supported() and wgrad_shapes_ok.
void moe_weight_grads(const WgradProduct* ps, int np, const int32_t* starts, int64_t E, int64_t P, cudaStream_t stream);

}  // namespace rt::cuda::sm90
