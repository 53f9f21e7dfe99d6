// Causal attention with Gemma's sliding window and attention-logit soft cap
// (cpu/attention.cpp states the maths): a simple, correct fallback, not a
// fast one: what RAMTRAIN_ATTENTION=masked runs for windows, sinks and the
// soft cap (the fused kernels of attention.cu and attention_sm90.cu take them
// otherwise), and the tests' reference. One
// warp per query row (forward, dQ) or key row (dK/dV); q/k/v/dO rows are read
// in bf16, everything is computed in fp32.
// Forward: two passes over the row's keys in chunks of 32 (one key per lane):
// the online max/sum, then out = sum_j p_j v_j with p_j broadcast by shuffle
// and each lane owning D/32 output columns. lse is the natural log, as the
// fused kernels'. Backward: the dQ kernel also writes D_t = rowsum(dO * O)
// into scratch [B,H,T]; the dK/dV kernel owns a key row and loops over the
// heads of its group and the queries that see it (t in j .. j + window - 1,
// doc_start[t] <= j), so every sum runs in a fixed order (deterministic).
// Sinks (gpt-oss): lane 0 starts the online max/sum with the head's sink
// logit, so lse counts it and every p_j = exp(s_j - lse) leaves its share
// out; D_t = rowsum(dO * O) = sum_j P_j dP_j is unchanged (the sink has no
// value) and d sink[h] = -sum_t exp(sink - lse_t) D_t, one block per head
// summing its rows in a fixed order.
// Letters: B, T, H, G, D as in cuda/ops.h; R = H / G; D % 32 == 0, D <= 256.
#include <algorithm>

#include "cuda/attention/sinks.h"
#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

constexpr int kWarps = 4;      // rows per block
constexpr int kMaxCols = 8;    // D / 32 columns per lane (D <= 256)

struct MaskedArgs {
  int64_t B, T, H, G, D, window;
  float scale, softcap;
  const int32_t* doc_start;
  const bf16* sinks;  // [H] or null
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float dot_row(const float* a, const bf16* b, int64_t D) {
  float s = 0.f;
  for (int64_t d = 0; d < D; ++d) s += a[d] * __bfloat162float(b[d]);
  return s;
}

// The (capped) score of a dot product: z * scale, then softcap * tanh(. / softcap).
__device__ __forceinline__ float masked_score(float dot, const MaskedArgs& a) {
  const float s = dot * a.scale;
  return a.softcap > 0.f ? tanhf(s / a.softcap) * a.softcap : s;
}

// First key query t of sequence b sees.
__device__ __forceinline__ int64_t masked_first_key(const MaskedArgs& a, int64_t b, int64_t t) {
  int64_t j0 = a.doc_start ? a.doc_start[b * a.T + t] : 0;
  if (a.window > 0) j0 = max(j0, t - a.window + 1);
  return j0;
}

__global__ void __launch_bounds__(32 * kWarps)
    masked_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, MaskedArgs a) {
  __shared__ float sq[kWarps][256];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + w;
  if (r >= a.B * a.H * a.T) return;
  const int64_t t = r % a.T, h = (r / a.T) % a.H, b = r / (a.T * a.H), g = h / (a.H / a.G), D = a.D;
  const bf16* qt = q + ((b * a.T + t) * a.H + h) * D;
  for (int64_t d = lane; d < D; d += 32) sq[w][d] = __bfloat162float(qt[d]);
  __syncwarp();
  const int64_t j0 = masked_first_key(a, b, t);
  auto kv_row = [&](int64_t j) { return ((b * a.T + j) * a.G + g) * D; };
  float m = -INFINITY, l = 0.f;
  if (a.sinks && lane == 0) m = __bfloat162float(a.sinks[h]), l = 1.f;  // the sink: exp(sink - sink)
  for (int64_t c0 = j0; c0 <= t; c0 += 32) {
    const int64_t j = c0 + lane;
    if (j <= t) {
      const float s = masked_score(dot_row(sq[w], k + kv_row(j), D), a);
      const float mn = fmaxf(m, s);
      l = l * expf(m - mn) + expf(s - mn);
      m = mn;
    }
  }
  const float mx = warp_max(m);
  l = m == -INFINITY ? 0.f : l * expf(m - mx);
  l = detail::warp_sum(l);
  const float row_lse = mx + logf(l);
  float acc[kMaxCols] = {};
  const int cols = static_cast<int>(D / 32);
  for (int64_t c0 = j0; c0 <= t; c0 += 32) {
    const int64_t j = c0 + lane;
    const float p = j <= t ? expf(masked_score(dot_row(sq[w], k + kv_row(j), D), a) - row_lse) : 0.f;
    for (int jj = 0; jj < 32 && c0 + jj <= t; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const bf16* vj = v + kv_row(c0 + jj);
      for (int i = 0; i < cols; ++i) acc[i] += pj * __bfloat162float(vj[lane + 32 * i]);
    }
  }
  bf16* ot = out + ((b * a.T + t) * a.H + h) * D;
  for (int i = 0; i < cols; ++i) ot[lane + 32 * i] = __float2bfloat16(acc[i]);
  if (lane == 0) lse[(b * a.H + h) * a.T + t] = row_lse;
}

// dq (=) and D_t = rowsum(dO * O) into delta [B,H,T].
__global__ void __launch_bounds__(32 * kWarps)
    masked_dq_kernel(bf16* dq, float* delta, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* out, const float* lse, MaskedArgs a) {
  __shared__ float sq[kWarps][256], sdo[kWarps][256];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + w;
  if (r >= a.B * a.H * a.T) return;
  const int64_t t = r % a.T, h = (r / a.T) % a.H, b = r / (a.T * a.H), g = h / (a.H / a.G), D = a.D;
  const int64_t row = ((b * a.T + t) * a.H + h) * D;
  float dt = 0.f;
  for (int64_t d = lane; d < D; d += 32) {
    sq[w][d] = __bfloat162float(q[row + d]);
    sdo[w][d] = __bfloat162float(dout[row + d]);
    dt += sdo[w][d] * __bfloat162float(out[row + d]);
  }
  __syncwarp();
  dt = detail::warp_sum(dt);
  const int64_t li = (b * a.H + h) * a.T + t;
  if (lane == 0) delta[li] = dt;
  const float row_lse = lse[li];
  const int64_t j0 = masked_first_key(a, b, t);
  auto kv_row = [&](int64_t j) { return ((b * a.T + j) * a.G + g) * D; };
  float acc[kMaxCols] = {};
  const int cols = static_cast<int>(D / 32);
  for (int64_t c0 = j0; c0 <= t; c0 += 32) {
    const int64_t j = c0 + lane;
    float ds = 0.f;
    if (j <= t) {
      const float s = masked_score(dot_row(sq[w], k + kv_row(j), D), a);
      const float p = expf(s - row_lse);
      ds = p * (dot_row(sdo[w], v + kv_row(j), D) - dt);
      if (a.softcap > 0.f) ds *= 1.f - (s / a.softcap) * (s / a.softcap);  // 1 - tanh^2
    }
    for (int jj = 0; jj < 32 && c0 + jj <= t; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const bf16* kj = k + kv_row(c0 + jj);
      for (int i = 0; i < cols; ++i) acc[i] += dsj * __bfloat162float(kj[lane + 32 * i]);
    }
  }
  for (int i = 0; i < cols; ++i) dq[row + lane + 32 * i] = __float2bfloat16(acc[i] * a.scale);
}

// dk, dv (=) of one key row, over the heads of its group and the queries that see it.
__global__ void __launch_bounds__(32 * kWarps)
    masked_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                       const float* lse, const float* delta, MaskedArgs a) {
  __shared__ float sk[kWarps][256], sv[kWarps][256];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + w;
  if (r >= a.B * a.G * a.T) return;
  const int64_t j = r % a.T, g = (r / a.T) % a.G, b = r / (a.T * a.G), D = a.D, R = a.H / a.G;
  const int64_t kv = ((b * a.T + j) * a.G + g) * D;
  for (int64_t d = lane; d < D; d += 32) {
    sk[w][d] = __bfloat162float(k[kv + d]);
    sv[w][d] = __bfloat162float(v[kv + d]);
  }
  __syncwarp();
  const int64_t t_end = a.window > 0 ? min(a.T - 1, j + a.window - 1) : a.T - 1;
  float acck[kMaxCols] = {}, accv[kMaxCols] = {};
  const int cols = static_cast<int>(D / 32);
  for (int64_t h = g * R; h < (g + 1) * R; ++h) {
    for (int64_t c0 = j; c0 <= t_end; c0 += 32) {
      const int64_t t = c0 + lane;
      float p = 0.f, ds = 0.f;
      if (t <= t_end && (!a.doc_start || a.doc_start[b * a.T + t] <= j)) {
        const int64_t row = ((b * a.T + t) * a.H + h) * D;
        const int64_t li = (b * a.H + h) * a.T + t;
        float z = 0.f, dp = 0.f;
        for (int64_t d = 0; d < D; ++d) {
          z += __bfloat162float(q[row + d]) * sk[w][d];
          dp += __bfloat162float(dout[row + d]) * sv[w][d];
        }
        const float s = masked_score(z, a);
        p = expf(s - lse[li]);
        ds = p * (dp - delta[li]);
        if (a.softcap > 0.f) ds *= 1.f - (s / a.softcap) * (s / a.softcap);
      }
      for (int tt = 0; tt < 32 && c0 + tt <= t_end; ++tt) {
        const float pt = __shfl_sync(0xffffffffu, p, tt), dst = __shfl_sync(0xffffffffu, ds, tt);
        const int64_t row = ((b * a.T + c0 + tt) * a.H + h) * D;
        for (int i = 0; i < cols; ++i) {
          acck[i] += dst * __bfloat162float(q[row + lane + 32 * i]);
          accv[i] += pt * __bfloat162float(dout[row + lane + 32 * i]);
        }
      }
    }
  }
  for (int i = 0; i < cols; ++i) {
    dk[kv + lane + 32 * i] = __float2bfloat16(acck[i] * a.scale);
    dv[kv + lane + 32 * i] = __float2bfloat16(accv[i]);
  }
}

MaskedArgs masked_args(int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t window, float softcap,
                       const int32_t* doc_start, const char* where, const bf16* sinks) {
  RT_CHECK(B >= 0 && T >= 0 && H > 0 && G > 0 && H % G == 0, "[cuda ", where, "] bad shape B=", B, " T=", T,
           " H=", H, " G=", G);
  RT_CHECK(D % 32 == 0 && D > 0 && D <= 32 * kMaxCols, "[cuda ", where, "] head_dim ", D,
           " must be a multiple of 32 up to ", 32 * kMaxCols);
  RT_CHECK(window >= 0 && softcap >= 0.f, "[cuda ", where, "] window ", window, " and softcap ", softcap,
           " must be >= 0");
  return MaskedArgs{B, T, H, G, D, window, 1.f / sqrtf(static_cast<float>(D)), softcap, doc_start, sinks};
}

// dsinks[h] += -sum over (b, t) of exp(sink_h - lse) * delta, one block per head, fixed order.
__global__ void sink_grad_kernel(float* dsinks, const bf16* sinks, const float* lse, const float* delta, int64_t B,
                                 int64_t H, int64_t T) {
  __shared__ float part[256];
  const int64_t h = blockIdx.x;
  const float sk = __bfloat162float(sinks[h]);
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < B * T; i += blockDim.x) {
    const int64_t li = ((i / T) * H + h) * T + i % T;
    acc -= expf(sk - lse[li]) * delta[li];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int o = 128; o > 0; o >>= 1) {
    if (static_cast<int>(threadIdx.x) < o) part[threadIdx.x] += part[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] += part[0];
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>(detail::ceil_div(rows, kWarps)); }

}  // namespace

void attention_masked_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                              int64_t H, int64_t G, int64_t D, int64_t window, float softcap, cudaStream_t stream,
                              const int32_t* doc_start, const bf16* sinks) {
  const MaskedArgs a = masked_args(B, T, H, G, D, window, softcap, doc_start, "attention_masked_forward", sinks);
  if (B * T == 0) return;
  masked_forward_kernel<<<blocks_for(B * H * T), 32 * kWarps, 0, stream>>>(out, lse, q, k, v, a);
  CUDA_CHECK_LAUNCH();
}

void attention_masked_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                               const bf16* v, const bf16* out, const float* lse, int64_t B, int64_t T, int64_t H,
                               int64_t G, int64_t D, int64_t window, float softcap, Scratch scratch,
                               cudaStream_t stream, const int32_t* doc_start, const bf16* sinks, float* dsinks) {
  RT_CHECK(!dsinks || sinks, "[cuda attention_masked_backward] a sink gradient without sinks");
  const MaskedArgs a = masked_args(B, T, H, G, D, window, softcap, doc_start, "attention_masked_backward", sinks);
  const size_t need = attention_backward_scratch_bytes(B, T, H);
  RT_CHECK(scratch.bytes >= need, "[cuda attention_masked_backward] scratch has ", scratch.bytes, " bytes, needs ",
           need, " (attention_backward_scratch_bytes)");
  if (B * T == 0) return;
  float* delta = static_cast<float*>(scratch.ptr);
  masked_dq_kernel<<<blocks_for(B * H * T), 32 * kWarps, 0, stream>>>(dq, delta, dout, q, k, v, out, lse, a);
  CUDA_CHECK_LAUNCH();
  masked_dkdv_kernel<<<blocks_for(B * G * T), 32 * kWarps, 0, stream>>>(dk, dv, dout, q, k, v, lse, delta, a);
  CUDA_CHECK_LAUNCH();
  if (dsinks) attention_sink_grad(dsinks, sinks, lse, delta, B, H, T, stream);
}

void attention_sink_grad(float* dsinks, const bf16* sinks, const float* lse, const float* delta, int64_t B, int64_t H,
                         int64_t T, cudaStream_t stream) {
  if (B * T == 0) return;
  sink_grad_kernel<<<static_cast<unsigned>(H), 256, 0, stream>>>(dsinks, sinks, lse, delta, B, H, T);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
