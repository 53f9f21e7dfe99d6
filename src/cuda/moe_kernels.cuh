// The MoE kernels on the permuted rows (cuda/moe.cu's only include of this
// file: its anonymous namespace keeps them private to that translation
// unit): the gather of x, the weighted combines over each token's experts,
// the backward's scatter of dout, the fused routing-weight gradient + SwiGLU
// backward, the router gradient and the bias kernels (per row's expert:
// ExpertPtrs). Deterministic: fixed orders, no atomics.
#pragma once
#include <cstdint>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/moe_routing_kernels.cuh"
#include "cuda/ops.h"
#include "cuda/swiglu_math.cuh"

namespace rt::cuda {
namespace {

// xe[r, :] = x[perm[r] / K, :] for the rows permuted rows, zeros where
// perm[r] is -1 (padding); 8 bf16 per step.
__global__ void gather_kernel(bf16* xe, const bf16* x, const int32_t* perm, int64_t rows, int64_t C, int K) {
  const int64_t C8 = C / 8, total = rows * C8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / C8, c8 = v % C8;
    const int32_t s = perm[r];
    detail::bf16x8 val{};
    if (s >= 0) val = reinterpret_cast<const detail::bf16x8*>(x + s / K * C)[c8];
    reinterpret_cast<detail::bf16x8*>(xe + r * C)[c8] = val;
  }
}

// The slot of row n's j-th smallest expert index (the CPU's summation order).
__device__ __forceinline__ int nth_by_expert(const int32_t* idx_row, int K, int prev_expert) {
  int best = -1;
  for (int j = 0; j < K; ++j)
    if (idx_row[j] > prev_expert && (best < 0 || idx_row[j] < idx_row[best])) best = j;
  return best;
}

// 8 values of a permuted row from column 8 c8 (C a multiple of 8, rows
// 16-byte aligned): fp32 rows, bf16 rows, or
// the sum (in fp32) of two bf16 rows (the grouped backward's gate and up
// input gradients where they are two products).
struct F32Rows {
  const float* p;
  int64_t C;
  __device__ void load8(int64_t r, int64_t c8, float* f) const {
    const float4* q = reinterpret_cast<const float4*>(p + r * C) + 2 * c8;
    const float4 lo = q[0], hi = q[1];
    f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
  }
};
struct Bf16Rows {
  const bf16* p;
  int64_t C;
  __device__ void load8(int64_t r, int64_t c8, float* f) const {
    detail::bf16x8_to_float(reinterpret_cast<const detail::bf16x8*>(p + r * C)[c8], f);
  }
};
struct Bf16PairRows {
  const bf16 *p, *q;
  int64_t C;
  __device__ void load8(int64_t r, int64_t c8, float* f) const {
    float g[8];
    detail::bf16x8_to_float(reinterpret_cast<const detail::bf16x8*>(p + r * C)[c8], f);
    detail::bf16x8_to_float(reinterpret_cast<const detail::bf16x8*>(q + r * C)[c8], g);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] += g[i];
  }
};

// ord_row/ord_w [N, K]: token n's rows (row_of) and routing weights in
// increasing expert index (the CPU's summation order), once per call instead
// of once per output element; one thread per token.
__global__ void order_by_expert_kernel(int32_t* ord_row, float* ord_w, const int32_t* row_of, const int32_t* idx,
                                       const float* w, int64_t N, int K) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int32_t* ir = idx + n * K;
  int prev = -1;
  for (int t = 0; t < K; ++t) {
    const int j = nth_by_expert(ir, K, prev);
    prev = ir[j];
    ord_row[n * K + t] = row_of[n * K + j];
    ord_w[n * K + t] = w[n * K + j];
  }
}

// For 8 columns from 8 c8 of token n: acc = the sum over n's experts in
// increasing index (the CPU's order) of w * rows(row, c) (w null: of
// rows(row, c)), in fp32; each column the scalar loop's operations.
template <class Rows>
__device__ __forceinline__ void sum8_by_expert(const Rows& rows, const int32_t* ord_row, const float* ord_w, int64_t n,
                                               int64_t c8, int K, float* acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int t = 0; t < K; ++t) {
    float v[8];
    rows.load8(ord_row[n * K + t], c8, v);
    if (ord_w) {
      const float wt = ord_w[n * K + t];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(v[i], wt, acc[i]);  // fmaf: what `acc += v * w` contracted to
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += v[i];
    }
  }
}

// out[n, c] = bf16(sum over n's experts in increasing index of w * o(row, c));
// 8 columns a thread (C % 8 == 0: check_dims).
template <class Rows>
__global__ void combine_out_kernel(bf16* out, Rows o, const int32_t* ord_row, const float* ord_w, int64_t N, int64_t C,
                                   int K) {
  const int64_t C8 = C / 8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < N * C8;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc[8];
    sum8_by_expert(o, ord_row, ord_w, v / C8, v % C8, K, acc);
    reinterpret_cast<detail::bf16x8*>(out)[v] = detail::float_to_bf16x8(acc);
  }
}

// Per permuted row r in use (slot s = perm[r], token n = s / K): dy[r] =
// dout[n] (a copy) and, kDo, d_o[r] = bf16(w[s] dout[n]); zeros on a
// padding row (perm -1). The backward's d_a product runs on dy (unweighted,
// so that the routing weight's gradient comes out of the same product:
// act_grad_kernel), the down weight gradient on dy and w a, or on d_o and a
// where the down bias's gradient needs d_o. 8 bf16 per step.
template <bool kDo>
__global__ void scatter_dout_kernel(bf16* dy, bf16* d_o, const bf16* dout, const float* w, const int32_t* perm,
                                    int64_t rows, int64_t C, int K) {
  const int64_t C8 = C / 8, total = rows * C8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / C8, c8 = v % C8;
    const int32_t s = perm[r];
    detail::bf16x8 y{}, o{};
    if (s >= 0) {
      y = reinterpret_cast<const detail::bf16x8*>(dout + s / K * C)[c8];
      if (kDo) {
        float f[8];
        detail::bf16x8_to_float(y, f);
        for (float& t : f) t *= w[s];
        o = detail::float_to_bf16x8(f);
      }
    }
    reinterpret_cast<detail::bf16x8*>(dy + r * C)[c8] = y;
    if (kDo) reinterpret_cast<detail::bf16x8*>(d_o + r * C)[c8] = o;
  }
}

// Per permuted row r (slot s = perm[r]), one warp, from g, u and ga = dy Wd
// (the unweighted gradient of a: out[n] += w o, o = a Wd^T + bd): a =
// bf16(SwiGLU(g, u)) (the forward's bits: swiglu_math.cuh) is recomputed
// here, not read; dw[s] = <ga[r], a[r]> (fp32; <dout[n], bd> is added by
// bias_dot_kernel); the SwiGLU backward of d_a = w[s] ga[r] (fp32, not
// rounded) into d_g, d_u (bf16; zeros on a padding row), row r of each at
// r ld (ld F: two arrays; 2F: one [P, 2F] array, d_u = d_g + F); and a's row
// for the down weight gradient: a_out[r] = a (kWeighted false: the gradient
// is d_o^T a) or bf16(w[s] a) (kWeighted: it is dy^T (w a)), zeros on a
// padding row. kVec: F % 8 == 0, 8 bf16 per step.
template <bool kVec, bool kClamped, bool kWeighted>
__global__ void act_grad_kernel(float* dw, bf16* d_g, bf16* d_u, int64_t ld, bf16* a_out, const bf16* ga, const bf16* g,
                                const bf16* u, const float* w, const int32_t* perm, int64_t rows, int64_t F,
                                float limit, float alpha) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int32_t s = perm[r];
  const float wt = s >= 0 ? w[s] : 0.f;
  const int64_t base = r * F, gbase = r * ld;
  // one element: a (rounded as the forward's), its dot term, d_g, d_u and a_out's value
  auto one = [&](float gav, float gv, float uv, float* dot, float* dg, float* du) {
    const float av = __bfloat162float(
        __float2bfloat16(kClamped ? detail::swiglu_clamped_value(gv, uv, limit, alpha) : detail::swiglu_value(gv, uv)));
    *dot += gav * av;
    if (kClamped)
      detail::swiglu_clamped_grad(wt * gav, gv, uv, limit, alpha, dg, du);
    else
      detail::swiglu_grad(wt * gav, gv, uv, dg, du);
    return s < 0 ? 0.f : kWeighted ? wt * av : av;
  };
  float dot = 0.f;
  if (kVec) {
    using detail::bf16x8;
    const auto *ga8 = reinterpret_cast<const bf16x8*>(ga + base), *g8 = reinterpret_cast<const bf16x8*>(g + base),
               *u8 = reinterpret_cast<const bf16x8*>(u + base);
    auto *dg8 = reinterpret_cast<bf16x8*>(d_g + gbase), *du8 = reinterpret_cast<bf16x8*>(d_u + gbase),
         *a8 = reinterpret_cast<bf16x8*>(a_out + base);
    for (int64_t v = lane; v < F / 8; v += 32) {
      float fga[8], fg[8], fu[8], odg[8], odu[8], oa[8];
      detail::bf16x8_to_float(ga8[v], fga);
      detail::bf16x8_to_float(g8[v], fg);
      detail::bf16x8_to_float(u8[v], fu);
      for (int i = 0; i < 8; ++i) oa[i] = one(fga[i], fg[i], fu[i], &dot, &odg[i], &odu[i]);
      dg8[v] = detail::float_to_bf16x8(odg);
      du8[v] = detail::float_to_bf16x8(odu);
      a8[v] = detail::float_to_bf16x8(oa);
    }
  } else {
    for (int64_t f = lane; f < F; f += 32) {
      float dg, du;
      const float av = one(__bfloat162float(ga[base + f]), __bfloat162float(g[base + f]), __bfloat162float(u[base + f]),
                           &dot, &dg, &du);
      d_g[gbase + f] = __float2bfloat16(dg);
      d_u[gbase + f] = __float2bfloat16(du);
      a_out[base + f] = __float2bfloat16(av);
    }
  }
  dot = detail::warp_sum(dot);
  if (lane == 0 && s >= 0) dw[s] = dot;
}

// Each expert's pointer (weights or biases) as a kernel parameter, so that
// kernels find a permuted row's expert on the device (perm, idx) without the
// host's layout; at most kMaxExpertPtrs experts (4 KB of parameters).
constexpr int64_t kMaxExpertPtrs = kMoeMaxGroupedExperts;
struct ExpertPtrs {
  const void* p[kMaxExpertPtrs];
};
template <class T>
ExpertPtrs expert_ptrs(const T* const* v, int64_t E) {
  RT_CHECK(E <= kMaxExpertPtrs, "[cuda moe] ", E, " experts: expert biases and the grouped GEMMs take at most ",
           kMaxExpertPtrs);
  ExpertPtrs r{};
  for (int64_t e = 0; e < E; ++e) r.p[e] = v[e];
  return r;
}

// dw[s] += <dout[n], bd_e> for every permuted row r with a slot s = perm[r]
// (token n = s / K, expert e = idx[s]): gpt-oss's down bias (o = a Wd^T +
// bd). One warp per row.
__global__ void bias_dot_kernel(float* dw, const bf16* dout, ExpertPtrs bias, const int32_t* perm, const int32_t* idx,
                                int64_t rows, int64_t C, int K) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int32_t s = perm[r];
  if (s < 0) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const bf16* dy = dout + s / K * C;
  const bf16* bd = static_cast<const bf16*>(bias.p[idx[s]]);
  float dot = 0.f;
  for (int64_t c = lane; c < C; c += 32) dot += __bfloat162float(dy[c]) * __bfloat162float(bd[c]);
  dot = detail::warp_sum(dot);
  if (lane == 0) dw[s] += dot;
}

// dl[n, :] (bf16) = d loss / d router logits of row n, through the top-k
// weights (norm_topk: w_j = p_j / S) and the softmax; dprob [E] or null.
// topk_softmax (gpt-oss): w = softmax(l_S), dl_S_j = w_j (dw_j - sum_i w_i dw_i), 0 elsewhere.
// One warp per row, lanes over the experts (the sum over e a fixed tree).
__global__ void router_grad_kernel(bf16* dl, const float* p, const int32_t* idx, const float* w, const float* dw,
                                   const float* dprob, int64_t N, int64_t E, int K, bool norm_topk, bool topk_softmax) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  int sel[kMaxK];
  float extra[kMaxK];
  float S = 0.f, wdw = 0.f;
  for (int j = 0; j < K; ++j) {  // every lane the same, in the same order
    sel[j] = idx[n * K + j];
    if (!topk_softmax) S += p[n * E + sel[j]];
    wdw += dw[n * K + j] * w[n * K + j];
  }
  for (int j = 0; j < K; ++j)
    extra[j] = topk_softmax ? w[n * K + j] * (dw[n * K + j] - wdw)
               : norm_topk  ? (dw[n * K + j] - wdw) / S
                            : dw[n * K + j];
  // topk_softmax: dl itself (0 off the selected); else d loss / d p[n, e]
  auto term_of = [&](int64_t e) {
    float v = !topk_softmax && dprob ? dprob[e] : 0.f;
    for (int j = 0; j < K; ++j)
      if (sel[j] == e) v += extra[j];
    return v;
  };
  if (topk_softmax) {
    for (int64_t e = lane; e < E; e += 32) dl[n * E + e] = __float2bfloat16(term_of(e));
    return;
  }
  const float* pr = p + n * E;
  float pdp = 0.f;
  for (int64_t e = lane; e < E; e += 32) pdp += pr[e] * term_of(e);
  pdp = detail::warp_sum(pdp);
  for (int64_t e = lane; e < E; e += 32) dl[n * E + e] = __float2bfloat16(pr[e] * (term_of(e) - pdp));
}

// dx[n, c] = bf16(sum over n's experts in increasing index of dxe(row, c), + dxr[n, c]);
// 8 columns a thread (C % 8 == 0: check_dims).
template <class Rows>
__global__ void combine_dx_kernel(bf16* dx, Rows dxe, const float* dxr, const int32_t* ord_row, int64_t N, int64_t C,
                                  int K) {
  const int64_t C8 = C / 8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < N * C8;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc[8], r[8];
    sum8_by_expert(dxe, ord_row, nullptr, v / C8, v % C8, K, acc);
    F32Rows{dxr, C}.load8(v / C8, v % C8, r);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += r[i];
    reinterpret_cast<detail::bf16x8*>(dx)[v] = detail::float_to_bf16x8(acc);
  }
}

__device__ __forceinline__ float as_f32(float v) { return v; }
__device__ __forceinline__ float as_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16(v); }

// rows [R, cols] += bias [cols] (bf16 rows: rounded once; fp32 rows).
template <class T>
__global__ void add_bias_kernel(T* rows, const bf16* bias, int64_t R, int64_t cols) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < R * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(rows + i, as_f32(rows[i]) + __bfloat162float(bias[i % cols]));
}
template <class T>
void add_bias(T* rows, const bf16* bias, int64_t R, int64_t cols, cudaStream_t stream) {
  add_bias_kernel<T><<<detail::blocks_for(R * cols, 256), 256, 0, stream>>>(rows, bias, R, cols);
  CUDA_CHECK_LAUNCH();
}

// rows [P, cols] += the bias of each row's expert (perm, idx; padding rows
// untouched), as add_bias_kernel per expert.
template <class T>
__global__ void add_expert_bias_kernel(T* rows, ExpertPtrs bias, const int32_t* perm, const int32_t* idx, int64_t P,
                                       int64_t cols) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < P * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = perm[i / cols];
    if (s < 0) continue;
    const bf16* b = static_cast<const bf16*>(bias.p[idx[s]]);
    store(rows + i, as_f32(rows[i]) + __bfloat162float(b[i % cols]));
  }
}

}  // namespace
}  // namespace rt::cuda
