// Softmax pieces shared by both attention kernel sets, on accumulator
// fragments (layout in utils.cuh). Scores stay raw (q.k, unscaled): the row
// max m is a raw-score max and p = 2^(s * c - m * c) with c = log2(e)/sqrt(D),
// one FFMA + one ex2.approx.ftz per element; lse is stored in natural-log
// units and read back times log2(e).
#pragma once
#include "cuda/attention/mask.cuh"
#include "cuda/attention/utils.cuh"

namespace rt::cuda::attn {

// Gemma 2's attention-logit soft cap (both sets' CAP instances). The
// capped score c tanh(s / c), s = z / sqrt(D), in the kernels' raw units:
// z' = K tanh(z / K), K = c sqrt(D) (AttnShape's cap_*), so everything after
// it (the online softmax in raw units, lse = m * scale + log t in natural-log
// units, P = 2^(z' * scale log2(e) - lse2)) is unchanged and lse is that of
// the capped scores, as the CPU and the fallback define it. tanh(x) = 1 - 2 /
// (1 + e^(2x)): one ex2.approx (relative error ~2^-22) and one rcp.approx;
// the absolute error of z' is a few ulp of K (c times ~1e-7 in natural
// units), where tanh.approx's 2^-11 relative would be c * 5e-4 (2.5% of P at
// c = 50). Large |z| give e = inf or 0 and z' = +-K exactly, never NaN.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// sc (raw scores, finite: apply before any -inf mask) becomes the capped z'.
template <class A>
__device__ __forceinline__ void softcap_scores(A& sc, const AttnShape& s) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = exp2_ftz(frag(sc, j, e) * s.cap_a2);  // e^(2 z / K)
      frag(sc, j, e) = fmaf(s.cap_m2k, rcp_approx(1.f + x), s.cap_k);
    }
}

// Forward, one key tile: sc (this thread's 2 rows x the tile's keys, masked
// keys already -inf) becomes p = 2^(s*c - m_new*c); the rows' running max m,
// lane-partial sum l (reduced over the quad at the end: softmax_row_sum) and
// output accumulator o are rescaled by alpha = 2^(m_old*c - m_new*c).
template <class S, class O>
__device__ __forceinline__ void softmax_online(S& sc, O& o, float (&m)[2], float (&l)[2], float c) {
  constexpr int NS = frag_n<S>, NO = frag_n<O>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // each row is spread over the 4 lanes of a quad; 4 independent max and sum
    // chains (short dependency chains: with two warps per scheduler,
    // fixed-latency stalls are what the profile shows)
    float mq[4] = {m[r], m[r], m[r], m[r]};
#pragma unroll
    for (int j = 0; j < NS; ++j) mq[j & 3] = fmaxf(mq[j & 3], fmaxf(frag(sc, j, 2 * r), frag(sc, j, 2 * r + 1)));
    float mx = fmaxf(fmaxf(mq[0], mq[1]), fmaxf(mq[2], mq[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // a row with every key so far masked keeps m = -inf: use 0 so no inf - inf
    const float mc = mx == -INFINITY ? 0.f : mx * c;
    const float alpha = exp2_ftz(m[r] * c - mc);  // m = -inf on a row's first tile: 0
    m[r] = mx;
    float ssum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      frag(sc, j, 2 * r) = exp2_ftz(fmaf(frag(sc, j, 2 * r), c, -mc));
      frag(sc, j, 2 * r + 1) = exp2_ftz(fmaf(frag(sc, j, 2 * r + 1), c, -mc));
      ssum[j & 3] += frag(sc, j, 2 * r) + frag(sc, j, 2 * r + 1);
    }
    l[r] = fmaf(l[r], alpha, (ssum[0] + ssum[1]) + (ssum[2] + ssum[3]));  // lane-partial
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      frag(o, j, 2 * r) *= alpha;
      frag(o, j, 2 * r + 1) *= alpha;
    }
  }
}

// Forward end: a row's softmax denominator from the quad's lane-partial sums.
__device__ __forceinline__ float softmax_row_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l;
}

// Forward end of a row: its raw-score max m, denominator t (softmax_row_sum,
// relative to m) and, for gpt-oss, the head's sink logit (sinks [H] bf16,
// nullable): the sink joins the max and the denominator (cpu/attention.cpp)
// and weighs no value. Sets the row's lse (natural log) and returns the
// factor the output accumulator is scaled by (1 / t without a sink). The
// backward needs nothing more: P = exp(s - lse) leaves the sink's share out,
// and delta = rowsum(dO * O) of this output is sum_j P_j dP_j (the sink's dP
// is 0); only d sink needs its own sum (cuda/attention/sinks.h).
__device__ __forceinline__ float softmax_row_finish(float m, float t, float scale, const bf16* sinks, int h,
                                                    float& lse) {
  const float mn = m * scale;  // the max in natural-log units
  if (!sinks) {
    lse = mn + logf(t);
    return 1.f / t;
  }
  const float sk = __bfloat162float(sinks[h]);
  const float mx = fmaxf(mn, sk);
  const float a = expf(mn - mx);  // the rows' sum rescaled to the joint max
  const float tt = fmaf(t, a, expf(sk - mx));
  lse = mx + logf(tt);
  return a / tt;
}

// Backward, P from the forward's lse, queries as rows (the dQ kernels):
// p = 2^(s*c - lse2[row]), lse2 = lse * log2(e) of the thread's rows row0 +
// {0, 8}; with `mask`, keys k0 + col after the row give 0.
template <class A>
__device__ __forceinline__ void probs_rows(A& p, float c, const float (&lse2)[2], bool mask, int k0, int row0) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = exp2_ftz(fmaf(frag(p, j, e), c, -lse2[e >> 1]));
      if (mask && k0 + frag_col(j, e) > row0 + frag_row(e)) x = 0.f;
      frag(p, j, e) = x;
    }
}
// dS = P * (dP - delta[row]), queries as rows.
template <class A>
__device__ __forceinline__ void dscores_rows(A& dp, A& p, const float (&delta)[2]) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) frag(dp, j, e) = frag(p, j, e) * (frag(dp, j, e) - delta[e >> 1]);
}

// Backward, P^T with keys as rows and queries as columns (the dK/dV
// kernels): lse2[col] is the lse * log2(e) of the tile's query column col;
// with `mask`, queries q0 + col before the key (row0 + ...) give 0.
template <class A>
__device__ __forceinline__ void probs_cols(A& pt, float c, const float* lse2, bool mask, int q0, int row0) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = frag_col(j, e);
      float x = exp2_ftz(fmaf(frag(pt, j, e), c, -lse2[col]));
      if (mask && q0 + col < row0 + frag_row(e)) x = 0.f;
      frag(pt, j, e) = x;
    }
}
// dS^T = P^T * (dP^T - delta[col]), delta indexed as lse2 above.
template <class A>
__device__ __forceinline__ void dscores_cols(A& dpt, A& pt, const float* delta) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) frag(dpt, j, e) = frag(pt, j, e) * (frag(dpt, j, e) - delta[frag_col(j, e)]);
}

// Backward through the cap: dS = P (dP - delta) (1 - tanh^2), tanh = z'/K.
// The CAP kernels have dP while the tile still holds z' (softcap_scores; the
// mma_sync ones compute it first, the wgmma ones wait for both products) and
// fold the rest in first: dp = (dP - delta[row]) (1 - (z'/K)^2), queries
// as rows; then P overwrites z' (probs_rows/cols, masks) and dS = P * dp
// (dscores_capped). Masked entries: P = 0, so dS = 0 (z' and dp are finite).
template <class A>
__device__ __forceinline__ void softcap_dp_rows(A& dp, A& zc, const float (&delta)[2], float inv_k) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float t = frag(zc, j, e) * inv_k;
      frag(dp, j, e) = (frag(dp, j, e) - delta[e >> 1]) * fmaf(-t, t, 1.f);
    }
}
// The same with keys as rows and queries as columns (delta[col], as dscores_cols).
template <class A>
__device__ __forceinline__ void softcap_dp_cols(A& dpt, A& zct, const float* delta, float inv_k) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float t = frag(zct, j, e) * inv_k;
      frag(dpt, j, e) = (frag(dpt, j, e) - delta[frag_col(j, e)]) * fmaf(-t, t, 1.f);
    }
}
// dS = P * dp (either orientation; dp from softcap_dp_rows/cols).
template <class A>
__device__ __forceinline__ void dscores_capped(A& dp, A& p) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) frag(dp, j, e) *= frag(p, j, e);
}

// The dQ kernels' per-row lse * log2(e) and delta of rows row0 + {0, 8} of
// head row (b*H + h); rows past T get P = 0.
__device__ __forceinline__ void row_stats_load(float (&lse2)[2], float (&dl)[2], const float* lse, const float* delta,
                                               int64_t bh, int row0, int T) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const int64_t idx = bh * T + row;
    lse2[r] = row < T ? lse[idx] * kLog2e : INFINITY;
    dl[r] = row < T ? delta[idx] : 0.f;
  }
}

}  // namespace rt::cuda::attn
