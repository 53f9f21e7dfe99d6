// LM head + cross-entropy over token chunks (see ops.h). Per chunk: fp32
// logits by cuBLASLt, one block per row for the fused softmax / loss /
// dlogits kernel, then the dh and dw GEMMs, then a one-block fixed-order
// reduction of the chunk's per-row losses into the device totals (fp64).
// A vocabulary V that is not a multiple of 8 runs on Vr = V rounded up to 8
// rows of w and dw (the GEMMs' row widths): the row kernel excludes logits
// V..Vr-1 from the softmax and gives them zero gradients, so dh is exact and
// dw's extra rows only ever receive zeros.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/lm_head_rows.h"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

constexpr int kRowThreads = 512;

__device__ __forceinline__ void softmax_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

// Logits c..c+3 of a row, those at or past the vocabulary V as -inf.
__device__ __forceinline__ float4 row_logits(const float* x, int64_t c, int64_t V) {
  float4 v = *reinterpret_cast<const float4*>(x + c);
  if (c + 4 > V) {
    if (c >= V) v.x = -INFINITY;
    if (c + 1 >= V) v.y = -INFINITY;
    if (c + 2 >= V) v.z = -INFINITY;
    v.w = -INFINITY;
  }
  return v;
}

// Row r of the chunk (Vr logits, the first V real): loss[r] = lse -
// logit[target] (0 when ignored), valid[r] = 0/1, dlogits[r, :V] = grad_scale
// * (softmax - onehot) or 0, dlogits[r, V:Vr] = 0.
// Gemma 2's final soft cap on the real columns (padding stays -inf): cap * tanh(x / cap).
__device__ __forceinline__ float4 capped(float4 v, float cap) {
  if (cap <= 0.f) return v;
  auto f = [cap](float x) { return x == -INFINITY ? x : tanhf(x / cap) * cap; };
  return make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
}

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_row_kernel(bf16* dlogits, float* loss, int* valid, const float* logits, const int32_t* targets,
                             int64_t V, int64_t Vr, float grad_scale, bool want_grad, float softcap) {
  __shared__ float sm_m[32], sm_s[32];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * Vr;
  const int32_t t = targets[r];
  float m = -INFINITY, s = 0.f;
  for (int64_t c = threadIdx.x * 4; c < Vr; c += kRowThreads * 4) {
    const float4 v = capped(row_logits(x, c, V), softcap);
    const float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (mx == -INFINITY) continue;  // four padding columns (V < Vr)
    const float mn = fmaxf(m, mx);
    s = s * expf(m - mn) + expf(v.x - mn) + expf(v.y - mn) + expf(v.z - mn) + expf(v.w - mn);
    m = mn;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    softmax_combine(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm_m[warp] = m, sm_s[warp] = s;
  __syncthreads();
  m = lane < kRowThreads / 32 ? sm_m[lane] : -INFINITY;
  s = lane < kRowThreads / 32 ? sm_s[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    softmax_combine(m, s, m2, s2);
  }
  const float lse = m + logf(s);
  const bool ok = t >= 0 && t < V;
  if (threadIdx.x == 0) {
    loss[r] = ok ? lse - (softcap > 0.f ? tanhf(x[t] / softcap) * softcap : x[t]) : 0.f;
    valid[r] = ok ? 1 : 0;
  }
  if (!want_grad) return;
  bf16* d = dlogits + r * Vr;
  for (int64_t c = threadIdx.x * 4; c < Vr; c += kRowThreads * 4) {
    const float4 v = capped(row_logits(x, c, V), softcap);  // expf(-inf - lse) = 0: padding gets no gradient
    float g[4] = {0.f, 0.f, 0.f, 0.f};
    if (ok) {
      g[0] = grad_scale * (expf(v.x - lse) - (c == t ? 1.f : 0.f));
      g[1] = grad_scale * (expf(v.y - lse) - (c + 1 == t ? 1.f : 0.f));
      g[2] = grad_scale * (expf(v.z - lse) - (c + 2 == t ? 1.f : 0.f));
      g[3] = grad_scale * (expf(v.w - lse) - (c + 3 == t ? 1.f : 0.f));
      if (softcap > 0.f) {  // through the cap: 1 - tanh^2 (0 on padding, whose g is 0)
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (vs[i] != -INFINITY) g[i] *= 1.f - (vs[i] / softcap) * (vs[i] / softcap);
      }
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(d + c);
    out[0] = __floats2bfloat162_rn(g[0], g[1]);
    out[1] = __floats2bfloat162_rn(g[2], g[3]);
  }
}

// One block of 256: each thread sums rows tid, tid+256, ... in order (fp64),
// then a fixed shuffle tree. Adds the chunk's sums to *totals.
__global__ void cross_entropy_totals_kernel(CrossEntropyTotals* totals, const float* loss, const int* valid,
                                            int64_t rows) {
  __shared__ double sm_l[8];
  __shared__ long long sm_n[8];
  double l = 0.0;
  long long n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 256) {
    l += static_cast<double>(loss[r]);
    n += valid[r];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    l += __shfl_xor_sync(0xffffffffu, l, o);
    n += __shfl_xor_sync(0xffffffffu, n, o);
  }
  if ((threadIdx.x & 31) == 0) sm_l[threadIdx.x >> 5] = l, sm_n[threadIdx.x >> 5] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tl = 0.0;
    long long tn = 0;
    for (int w = 0; w < 8; ++w) tl += sm_l[w], tn += sm_n[w];
    totals->loss_sum += tl;
    totals->n_valid += tn;
  }
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

size_t lm_head_cross_entropy_scratch_bytes(int64_t chunk_rows, int64_t V) {
  const size_t r = static_cast<size_t>(chunk_rows), v = static_cast<size_t>(lm_head_rows(V));
  return round256(r * v * 4) + round256(r * v * 2) + 2 * round256(r * 4);
}

void lm_head_cross_entropy(Blas& blas, bf16* dh, float* dw, CrossEntropyTotals* totals, const bf16* h, const bf16* w,
                           const int32_t* targets, int64_t N, int64_t C, int64_t V, float grad_scale,
                           int64_t chunk_rows, Scratch scratch, cudaStream_t stream, float softcap) {
  RT_CHECK(chunk_rows > 0 && chunk_rows % 8 == 0,
           "[cuda lm_head_cross_entropy] chunk_rows must be a positive "
           "multiple of 8, got ",
           chunk_rows);
  RT_CHECK(C % 8 == 0 && V > 0, "[cuda lm_head_cross_entropy] C must be a multiple of 8 and V positive, got C=", C,
           " V=", V);
  const int64_t Vr = lm_head_rows(V);
  const size_t need = lm_head_cross_entropy_scratch_bytes(chunk_rows, V);
  RT_CHECK(scratch.bytes >= need, "[cuda lm_head_cross_entropy] scratch has ", scratch.bytes, " bytes, needs ", need,
           " (lm_head_cross_entropy_scratch_bytes)");
  const size_t r = static_cast<size_t>(chunk_rows), v = static_cast<size_t>(Vr);
  char* p = static_cast<char*>(scratch.ptr);
  float* logits = reinterpret_cast<float*>(p);
  bf16* dlogits = reinterpret_cast<bf16*>(p + round256(r * v * 4));
  float* loss = reinterpret_cast<float*>(p + round256(r * v * 4) + round256(r * v * 2));
  int* valid = reinterpret_cast<int*>(p + round256(r * v * 4) + round256(r * v * 2) + round256(r * 4));
  const bool want_grad = dh || dw;
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, N - r0);
    blas.matmul_nt(logits, DType::f32, h + r0 * C, w, rows, Vr, C, 0.f, stream);  // [rows,Vr] = h @ w^T
    cross_entropy_row_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        dlogits, loss, valid, logits, targets + r0, V, Vr, grad_scale, want_grad, softcap);
    CUDA_CHECK_LAUNCH();
    if (dh) blas.matmul_nn(dh + r0 * C, DType::bf16, dlogits, w, rows, C, Vr, 0.f, stream);  // [rows,C]
    if (dw) blas.matmul_tn(dw, DType::f32, dlogits, h + r0 * C, Vr, C, rows, 1.f, stream);   // [Vr,C] +=
    cross_entropy_totals_kernel<<<1, 256, 0, stream>>>(totals, loss, valid, rows);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace rt::cuda
