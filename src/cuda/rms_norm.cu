// RMSNorm forward (plain and fused with the residual add) and backward.
// One warp per row, 16-byte accesses; rstd in fp32. dw is deterministic:
// a fixed number of row splits (a function of N only) each sum their rows in
// order into scratch, then one kernel adds the splits in order to dw.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

using detail::bf16x8;
constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// amax (nullable): the max key (detail::bf16_amax_key) of out's rounded
// values, committed once per block (FP8 per-tensor scaling's fused amax).
template <bool kResidual>
__global__ void rms_norm_forward_kernel(bf16* out, bf16* sum, float* rstd, const bf16* x, const bf16* r, const bf16* w,
                                        int64_t N, int64_t C, float eps, float w_offset, uint32_t* amax) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  uint32_t key = 0;
  if (row < N) {
    const bf16* xr = x + row * C;
    float ss = 0.f;
    for (int64_t c = lane * 8; c < C; c += 256) {
      float f[8];
      detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(xr + c), f);
      if (kResidual) {
        float g[8];
        detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(r + row * C + c), g);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] += g[k];
        bf16x8 s = detail::float_to_bf16x8(f);
        *reinterpret_cast<bf16x8*>(sum + row * C + c) = s;
        detail::bf16x8_to_float(s, f);  // normalise the rounded sum that backward will see
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += f[k] * f[k];
    }
    ss = detail::warp_sum(ss);
    const float rs = 1.f / sqrtf(ss / static_cast<float>(C) + eps);
    if (lane == 0) rstd[row] = rs;
    const bf16* src = kResidual ? sum + row * C : xr;
    for (int64_t c = lane * 8; c < C; c += 256) {
      float f[8], g[8];
      detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(src + c), f);
      detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(w + c), g);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = f[k] * rs * (w_offset + g[k]);
      const bf16x8 o = detail::float_to_bf16x8(f);
      *reinterpret_cast<bf16x8*>(out + row * C + c) = o;
      if (amax) key = max(key, detail::bf16x8_amax_key(o));
    }
  }
  if (amax) detail::block_amax_commit(key, amax);  // amax is the same for the whole block
}

// dx = rs*w*g - x * rs^3 / C * sum_j(w_j g_j x_j)  (+ dresidual), w + w_offset for Gemma's (1 + w)
__global__ void rms_norm_backward_dx_kernel(bf16* dx, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                                            const bf16* dres, int64_t N, int64_t C, float w_offset) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  const bf16* xr = x + row * C;
  const bf16* gr = dout + row * C;
  float dot = 0.f;
  for (int64_t c = lane * 8; c < C; c += 256) {
    float xf[8], gf[8], wf[8];
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(xr + c), xf);
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(gr + c), gf);
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(w + c), wf);
#pragma unroll
    for (int k = 0; k < 8; ++k) dot += (w_offset + wf[k]) * gf[k] * xf[k];
  }
  dot = detail::warp_sum(dot);
  const float rs = rstd[row];
  const float coef = rs * rs * rs * dot / static_cast<float>(C);
  for (int64_t c = lane * 8; c < C; c += 256) {
    float xf[8], gf[8], wf[8], o[8];
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(xr + c), xf);
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(gr + c), gf);
    detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(w + c), wf);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = rs * (w_offset + wf[k]) * gf[k] - xf[k] * coef;
    if (dres) {
      float rf[8];
      detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(dres + row * C + c), rf);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] += rf[k];
    }
    *reinterpret_cast<bf16x8*>(dx + row * C + c) = detail::float_to_bf16x8(o);
  }
}

// partial[s, c] = sum over rows of split s of g*x*rstd. Block (32, 8): x picks a
// column pair, y a row lane; row lanes combine in order.
__global__ void rms_norm_backward_dw_kernel(float* partial, const bf16* dout, const bf16* x, const float* rstd,
                                            int64_t N, int64_t C, int64_t rows_per_split) {
  __shared__ float part[8][64];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 64 + 2 * threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = std::min<int64_t>(N, r0 + rows_per_split);
  float s0 = 0.f, s1 = 0.f;
  if (c < C) {
    for (int64_t n = r0 + threadIdx.y; n < r1; n += 8) {
      const float rs = rstd[n];
      float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + n * C + c));
      float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + n * C + c));
      s0 += g.x * v.x * rs;
      s1 += g.y * v.y * rs;
    }
  }
  part[threadIdx.y][2 * threadIdx.x] = s0;
  part[threadIdx.y][2 * threadIdx.x + 1] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t0 = 0.f, t1 = 0.f;
    for (int k = 0; k < 8; ++k) {
      t0 += part[k][2 * threadIdx.x];
      t1 += part[k][2 * threadIdx.x + 1];
    }
    partial[blockIdx.y * C + c] = t0;
    partial[blockIdx.y * C + c + 1] = t1;
  }
}

__global__ void rms_norm_dw_finish_kernel(float* dw, const float* partial, int64_t C, int64_t splits) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float t = 0.f;
  for (int64_t s = 0; s < splits; ++s) t += partial[s * C + c];
  dw[c] += t;
}

int64_t dw_splits(int64_t N) { return std::clamp<int64_t>(detail::ceil_div(N, 512), 1, 256); }

void check_shapes(const char* where, int64_t C, const void* a, const void* b) {
  RT_CHECK(C % 8 == 0, "[cuda ", where, "] C must be a multiple of 8, got ", C);
  detail::check_aligned(a, where);
  detail::check_aligned(b, where);
}

}  // namespace

void rms_norm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int64_t C, float eps,
                      cudaStream_t stream, float w_offset, uint32_t* amax_key) {
  check_shapes("rms_norm_forward", C, out, x);
  if (N == 0) return;
  rms_norm_forward_kernel<false>
      <<<static_cast<unsigned>(detail::ceil_div(N, kRowsPerBlock)), 32 * kRowsPerBlock, 0, stream>>>(
          out, nullptr, rstd, x, nullptr, w, N, C, eps, w_offset, amax_key);
  CUDA_CHECK_LAUNCH();
}

void rms_norm_residual_forward(bf16* out, bf16* sum, float* rstd, const bf16* x, const bf16* r, const bf16* w,
                               int64_t N, int64_t C, float eps, cudaStream_t stream, float w_offset) {
  check_shapes("rms_norm_residual_forward", C, out, x);
  check_shapes("rms_norm_residual_forward", C, sum, r);
  if (N == 0) return;
  rms_norm_forward_kernel<true>
      <<<static_cast<unsigned>(detail::ceil_div(N, kRowsPerBlock)), 32 * kRowsPerBlock, 0, stream>>>(
          out, sum, rstd, x, r, w, N, C, eps, w_offset, nullptr);
  CUDA_CHECK_LAUNCH();
}

size_t rms_norm_backward_scratch_bytes(int64_t N, int64_t C) {
  return static_cast<size_t>(dw_splits(N)) * static_cast<size_t>(C) * sizeof(float);
}

void rms_norm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                       const bf16* dresidual, int64_t N, int64_t C, Scratch scratch, cudaStream_t stream,
                       float w_offset) {
  check_shapes("rms_norm_backward", C, dx, dout);
  if (dresidual) detail::check_aligned(dresidual, "rms_norm_backward dresidual");
  const size_t need = rms_norm_backward_scratch_bytes(N, C);
  RT_CHECK(scratch.bytes >= need, "[cuda rms_norm_backward] scratch has ", scratch.bytes, " bytes, needs ", need,
           " (rms_norm_backward_scratch_bytes)");
  if (N == 0) return;
  rms_norm_backward_dx_kernel<<<static_cast<unsigned>(detail::ceil_div(N, kRowsPerBlock)), 32 * kRowsPerBlock, 0,
                                stream>>>(dx, dout, x, w, rstd, dresidual, N, C, w_offset);
  CUDA_CHECK_LAUNCH();
  const int64_t splits = dw_splits(N);
  float* partial = static_cast<float*>(scratch.ptr);
  rms_norm_backward_dw_kernel<<<dim3(static_cast<unsigned>(detail::ceil_div(C, 64)), static_cast<unsigned>(splits)),
                                dim3(32, 8), 0, stream>>>(partial, dout, x, rstd, N, C, detail::ceil_div(N, splits));
  CUDA_CHECK_LAUNCH();
  rms_norm_dw_finish_kernel<<<static_cast<unsigned>(detail::ceil_div(C, 256)), 256, 0, stream>>>(dw, partial, C,
                                                                                                 splits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
