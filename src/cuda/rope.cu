// RoPE (HF rotate-half) forward and backward, in place on bf16 x [N, heads, D].
// One thread per (row, head, i < R/2) pair, R = rotary_dim (the whole head
// but for Phi3's partial rotary; dims R..D are not touched); angle =
// float(pos) * inv_freq[i] and its cos/sin are fp32 (sincosf, full precision:
// positions reach 1e5 rad), multiplied by scale (LongRoPE; 1 elsewhere).
#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

template <bool kInverse>
__global__ void rope_kernel(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                            int64_t R, float scale) {
  const int64_t half = R / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * heads * half) return;
  const int64_t i = idx % half;
  const int64_t nh = idx / half;
  const int64_t n = nh / heads;
  const float angle = static_cast<float>(pos[n]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  c *= scale;
  s *= scale;
  if (kInverse) s = -s;
  bf16* row = x + nh * D;
  const float x1 = __bfloat162float(row[i]), x2 = __bfloat162float(row[i + half]);
  row[i] = __float2bfloat16(x1 * c - x2 * s);
  row[i + half] = __float2bfloat16(x2 * c + x1 * s);
}

template <bool kInverse>
void rope_launch(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D, int64_t R,
                 float scale, cudaStream_t stream) {
  RT_CHECK(D % 2 == 0, "[cuda rope] head_dim must be even, got ", D);
  RT_CHECK(R > 0 && R % 2 == 0 && R <= D, "[cuda rope] rotary_dim ", R, " must be even and in (0, head_dim ", D, "]");
  const int64_t total = N * heads * (R / 2);
  if (total == 0) return;
  rope_kernel<kInverse><<<static_cast<unsigned>(detail::ceil_div(total, 256)), 256, 0, stream>>>(
      x, pos, inv_freq, N, heads, D, R, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  cudaStream_t stream) {
  rope_launch<false>(x, pos, inv_freq, N, heads, D, D, 1.f, stream);
}
void rope_backward(bf16* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   cudaStream_t stream) {
  rope_launch<true>(dx, pos, inv_freq, N, heads, D, D, 1.f, stream);
}
void rope_forward(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  int64_t rotary_dim, float scale, cudaStream_t stream) {
  rope_launch<false>(x, pos, inv_freq, N, heads, D, rotary_dim, scale, stream);
}
void rope_backward(bf16* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   int64_t rotary_dim, float scale, cudaStream_t stream) {
  rope_launch<true>(dx, pos, inv_freq, N, heads, D, rotary_dim, scale, stream);
}

}  // namespace rt::cuda
