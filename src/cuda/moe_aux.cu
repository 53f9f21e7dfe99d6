// The MoE's small device ops outside the expert layer (declared in
// cuda/ops.h): the load-balancing loss finished on the device in
// MoeAux::finish's fp64 order (model/moe_aux.h), and Qwen2-MoE's shared
// expert gate, y += sigmoid(z) o, forward and backward. The layer is moe.cu.
#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {

namespace {

using detail::blocks_each;
using detail::blocks_for;

__global__ void shared_gate_forward_kernel(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = 1.f / (1.f + expf(-z[i / C]));
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + s * __bfloat162float(o[i]));
  }
}

// One warp per row.
__global__ void shared_gate_backward_kernel(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z,
                                            int64_t N, int64_t C) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int lane = threadIdx.x & 31;
  const float s = 1.f / (1.f + expf(-z[n]));
  float dot = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float g = __bfloat162float(dy[n * C + c]);
    dot += g * __bfloat162float(o[n * C + c]);
    d_o[n * C + c] = __float2bfloat16(s * g);
  }
  dot = detail::warp_sum(dot);
  if (lane == 0) dz[n] = __float2bfloat16(s * (1.f - s) * dot);
}

// MoeAux::finish (model/moe_aux.h) on one thread: the same fp64 operations in
// the same order, each rounded on its own (the _rn intrinsics: no FMA
// contraction, as the host's portable build has none); dprob [E] (=),
// step_tokens [L, E] (+=) and *step_aux (+= aux * aux_scale).
__global__ void moe_aux_finish_kernel(float* dprob, int64_t* step_tokens, double* step_aux, const int64_t* tokens,
                                      const double* prob_sum, int64_t L, int64_t E, int64_t N, double weight,
                                      double aux_scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double R = __dmul_rn(static_cast<double>(L), static_cast<double>(N));
  const double RR = __dmul_rn(R, R), wE = __dmul_rn(weight, static_cast<double>(E));
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    double T = 0, P = 0;
    for (int64_t l = 0; l < L; ++l) {
      T = __dadd_rn(T, static_cast<double>(tokens[l * E + e]));
      P = __dadd_rn(P, prob_sum[l * E + e]);
    }
    aux = __dadd_rn(aux, __dmul_rn(__ddiv_rn(T, R), __ddiv_rn(P, R)));
    dprob[e] = __double2float_rn(__ddiv_rn(__dmul_rn(wE, T), RR));
  }
  aux = __dmul_rn(aux, static_cast<double>(E));
  if (step_aux) *step_aux = __dadd_rn(*step_aux, __dmul_rn(aux, aux_scale));
  if (step_tokens)
    for (int64_t i = 0; i < L * E; ++i) step_tokens[i] += tokens[i];
}

}  // namespace

void moe_aux_finish(float* dprob, int64_t* step_tokens, double* step_aux, const int64_t* tokens, const double* prob_sum,
                    int64_t L, int64_t E, int64_t N, double weight, float aux_scale, cudaStream_t stream) {
  RT_CHECK(L > 0 && E > 0 && N > 0, "[cuda moe] moe_aux_finish: bad shape L ", L, ", E ", E, ", N ", N);
  moe_aux_finish_kernel<<<1, 1, 0, stream>>>(dprob, step_tokens, step_aux, tokens, prob_sum, L, E, N, weight,
                                             static_cast<double>(aux_scale));
  CUDA_CHECK_LAUNCH();
}

void moe_shared_gate_forward(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  shared_gate_forward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(y, o, z, N, C);
  CUDA_CHECK_LAUNCH();
}

void moe_shared_gate_backward(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z, int64_t N, int64_t C,
                              cudaStream_t stream) {
  if (N == 0) return;
  shared_gate_backward_kernel<<<blocks_each(N, 8), 256, 0, stream>>>(d_o, dz, dy, o, z, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
