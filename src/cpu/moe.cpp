// CPU reference of the MoE MLP (declared in cpu/moe.h). Each expert runs on
// the rows routed to it, gathered in increasing token order, through the
// reference linear and SwiGLU ops; outputs are added to out[n] in increasing
// expert order, as transformers' index_add_ loop over experts does.
// Uses the global pool (through cpu/ops.h): do not call from a pool task.
#include "cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "cpu/ops.h"

namespace rt::cpu {

namespace {

void check_shape(int64_t N, int64_t C, int64_t E, int64_t K, int64_t F) {
  RT_CHECK(N > 0 && C > 0 && E > 0 && F > 0 && K >= 1 && K <= E, "[cpu/moe] bad shape: N ", N, ", C ", C, ", E ", E,
           ", K ", K, ", F ", F, " (need 1 <= K <= E)");
}

// The row softmax of logits [E] into p (max subtracted, fp32).
void softmax_row(float* p, const float* l, int64_t E) {
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}

// probs[N, E] = row softmax of x router^T (max subtracted, fp32); with
// topk_softmax (gpt-oss) the logits x router^T + bias themselves.
void router_probs(float* probs, const float* x, const float* router, int64_t N, int64_t C, int64_t E,
                  const MoeVariant& v) {
  linear_forward(probs, x, router, v.router_bias, N, C, E);
  if (v.topk_softmax) return;
  for (int64_t n = 0; n < N; ++n) softmax_row(probs + n * E, probs + n * E, E);  // in place: each element read first
}

// The routing of every row: idx/w [N, K].
struct Routing {
  std::vector<int32_t> idx;
  std::vector<float> w;
};
Routing route(const float* probs, int64_t N, int64_t E, int64_t K, bool norm_topk, bool topk_softmax) {
  Routing r{std::vector<int32_t>(static_cast<size_t>(N * K)), std::vector<float>(static_cast<size_t>(N * K))};
  std::vector<float> sel(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    float* w = r.w.data() + n * K;
    moe_topk(probs + n * E, E, K, norm_topk && !topk_softmax, r.idx.data() + n * K, w);
    if (topk_softmax) {  // gpt-oss: w holds the K largest logits, largest first
      std::copy(w, w + K, sel.begin());
      softmax_row(w, sel.data(), K);
    }
  }
  return r;
}

// The rows routed to expert e (increasing n) and the slot j of e in each row's top-K.
void expert_rows(const Routing& r, int64_t N, int64_t K, int32_t e, std::vector<int64_t>* rows,
                 std::vector<int64_t>* slots) {
  rows->clear();
  slots->clear();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (r.idx[static_cast<size_t>(n * K + j)] == e) {
        rows->push_back(n);
        slots->push_back(j);
      }
}

// One expert's forward on its gathered rows xe [R, C]: g, u, a [R, F], o [R, C].
void expert_forward(float* g, float* u, float* a, float* o, const float* xe, const float* wg, const float* wu,
                    const float* wd, int64_t R, int64_t C, int64_t F, const MoeVariant& v, int32_t e) {
  linear_forward(g, xe, wg, v.gate_bias ? v.gate_bias[e] : nullptr, R, C, F);
  linear_forward(u, xe, wu, v.up_bias ? v.up_bias[e] : nullptr, R, C, F);
  if (v.glu_limit > 0.f)
    swiglu_clamped_forward(a, g, u, R * F, v.glu_limit, v.glu_alpha);
  else
    swiglu_forward(a, g, u, R * F);
  if (o) linear_forward(o, a, wd, v.down_bias ? v.down_bias[e] : nullptr, R, F, C);
}

}  // namespace

void moe_topk(const float* p, int64_t E, int64_t K, bool norm_topk, int32_t* idx, float* w) {
  // selection by repeated arg-max: K is small (2..8) and E at most a few hundred
  for (int64_t j = 0; j < K; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
    }
    idx[j] = best;
    w[j] = p[best];
  }
  if (norm_topk) {
    float sum = 0.f;
    for (int64_t j = 0; j < K; ++j) sum += w[j];
    for (int64_t j = 0; j < K; ++j) w[j] /= sum;
  }
}

void moe_forward(float* out, float* probs, const float* x, const float* router, const float* const* gate,
                 const float* const* up, const float* const* down, int64_t N, int64_t C, int64_t E, int64_t K,
                 int64_t F, bool norm_topk, int64_t* tokens_per_expert, double* prob_sum, const MoeVariant& v) {
  check_shape(N, C, E, K, F);
  router_probs(probs, x, router, N, C, E, v);
  if (prob_sum) {  // the softmax over all experts (gpt-oss: of its logits), for the routing statistics
    std::vector<float> p(static_cast<size_t>(E));
    for (int64_t n = 0; n < N; ++n) {
      const float* pn = probs + n * E;
      if (v.topk_softmax) softmax_row(p.data(), pn, E), pn = p.data();
      for (int64_t e = 0; e < E; ++e) prob_sum[e] += static_cast<double>(pn[e]);
    }
  }
  if (!out && !tokens_per_expert) return;
  const Routing r = route(probs, N, E, K, norm_topk, v.topk_softmax);
  if (tokens_per_expert)
    for (int32_t e : r.idx) ++tokens_per_expert[e];
  if (!out) return;
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(N * C));
  std::vector<int64_t> rows, slots;
  std::vector<float> xe, g, u, a, o;
  for (int32_t e = 0; e < E; ++e) {
    expert_rows(r, N, K, e, &rows, &slots);
    const int64_t R = static_cast<int64_t>(rows.size());
    if (R == 0) continue;
    xe.resize(static_cast<size_t>(R * C));
    g.resize(static_cast<size_t>(R * F));
    u.resize(g.size());
    a.resize(g.size());
    o.resize(xe.size());
    for (int64_t i = 0; i < R; ++i) std::memcpy(&xe[i * C], x + rows[i] * C, sizeof(float) * C);
    expert_forward(g.data(), u.data(), a.data(), o.data(), xe.data(), gate[e], up[e], down[e], R, C, F, v, e);
    for (int64_t i = 0; i < R; ++i) {
      const float wt = r.w[static_cast<size_t>(rows[i] * K + slots[i])];
      float* dst = out + rows[i] * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += o[i * C + c] * wt;
    }
  }
}

void moe_backward(float* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                  const float* dout, const float* x, const float* probs, const float* router, const float* const* gate,
                  const float* const* up, const float* const* down, int64_t N, int64_t C, int64_t E, int64_t K,
                  int64_t F, bool norm_topk, const float* dprob, const MoeVariant& v, const MoeBiasGrads& gb) {
  check_shape(N, C, E, K, F);
  RT_CHECK(!(dprob && v.topk_softmax), "[cpu/moe] the load-balancing loss is not supported with top-k softmax routing");
  const Routing r = route(probs, N, E, K, norm_topk, v.topk_softmax);
  std::vector<float> dw(static_cast<size_t>(N * K), 0.f);  // d loss / d routing weight [N, K]
  std::memset(dx, 0, sizeof(float) * static_cast<size_t>(N * C));
  std::vector<int64_t> rows, slots;
  std::vector<float> xe, g, u, a, o, d_o, d_a, d_g, d_u, dxe, dxe2;
  for (int32_t e = 0; e < E; ++e) {
    expert_rows(r, N, K, e, &rows, &slots);
    const int64_t R = static_cast<int64_t>(rows.size());
    if (R == 0) continue;
    xe.resize(static_cast<size_t>(R * C));
    g.resize(static_cast<size_t>(R * F));
    u.resize(g.size());
    a.resize(g.size());
    o.resize(xe.size());
    d_o.resize(xe.size());
    d_a.resize(g.size());
    d_g.resize(g.size());
    d_u.resize(g.size());
    dxe.resize(xe.size());
    dxe2.resize(xe.size());
    for (int64_t i = 0; i < R; ++i) std::memcpy(&xe[i * C], x + rows[i] * C, sizeof(float) * C);
    expert_forward(g.data(), u.data(), a.data(), o.data(), xe.data(), gate[e], up[e], down[e], R, C, F, v, e);
    // out[n] += w * o: dw = <dout[n], o>, d_o = w * dout[n]
    for (int64_t i = 0; i < R; ++i) {
      const size_t s = static_cast<size_t>(rows[i] * K + slots[i]);
      const float* dy = dout + rows[i] * C;
      float dot = 0.f;
      for (int64_t c = 0; c < C; ++c) {
        dot += dy[c] * o[i * C + c];
        d_o[i * C + c] = dy[c] * r.w[s];
      }
      dw[s] = dot;
    }
    linear_backward(d_a.data(), ddown[e], gb.down ? gb.down[e] : nullptr, d_o.data(), a.data(), down[e], R, F, C);
    if (v.glu_limit > 0.f)
      swiglu_clamped_backward(d_g.data(), d_u.data(), d_a.data(), g.data(), u.data(), R * F, v.glu_limit, v.glu_alpha);
    else
      swiglu_backward(d_g.data(), d_u.data(), d_a.data(), g.data(), u.data(), R * F);
    linear_backward(dxe.data(), dgate[e], gb.gate ? gb.gate[e] : nullptr, d_g.data(), xe.data(), gate[e], R, C, F);
    linear_backward(dxe2.data(), dup[e], gb.up ? gb.up[e] : nullptr, d_u.data(), xe.data(), up[e], R, C, F);
    for (int64_t i = 0; i < R; ++i) {
      float* dst = dx + rows[i] * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += dxe[i * C + c] + dxe2[i * C + c];
    }
  }
  // routing weights -> probabilities -> router logits
  std::vector<float> dl(static_cast<size_t>(N * E));
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = dprob ? dprob[e] : 0.f;
    const float* w = r.w.data() + n * K;
    const float* dwn = dw.data() + n * K;
    if (v.topk_softmax) {  // w = softmax(l_S): dl_S_j = w_j (dw_j - sum_i w_i dw_i), 0 elsewhere
      float wdw = 0.f;
      for (int64_t j = 0; j < K; ++j) wdw += w[j] * dwn[j];
      float* dln = dl.data() + n * E;
      std::fill(dln, dln + E, 0.f);
      for (int64_t j = 0; j < K; ++j) dln[r.idx[static_cast<size_t>(n * K + j)]] = w[j] * (dwn[j] - wdw);
      continue;
    }
    if (norm_topk) {
      // w_j = p_j / S, S = sum of the selected p: dp_j += (dw_j - sum_i dw_i w_i) / S
      float S = 0.f, wdw = 0.f;
      for (int64_t j = 0; j < K; ++j) {
        S += p[r.idx[static_cast<size_t>(n * K + j)]];
        wdw += dwn[j] * w[j];
      }
      for (int64_t j = 0; j < K; ++j) dp[r.idx[static_cast<size_t>(n * K + j)]] += (dwn[j] - wdw) / S;
    } else {
      for (int64_t j = 0; j < K; ++j) dp[r.idx[static_cast<size_t>(n * K + j)]] += dwn[j];
    }
    // softmax: dl_e = p_e (dp_e - sum_j p_j dp_j)
    float pdp = 0.f;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dl[static_cast<size_t>(n * E + e)] = p[e] * (dp[e] - pdp);
  }
  std::vector<float> dxr(static_cast<size_t>(N * C));
  linear_backward(dxr.data(), drouter, gb.router, dl.data(), x, router, N, C, E);
  add_inplace(dx, dxr.data(), N * C);
}

void moe_shared_gate_forward(float* y, const float* o, const float* z, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float s = 1.f / (1.f + std::exp(-z[n]));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] += s * o[n * C + c];
  }
}

void moe_shared_gate_backward(float* d_o, float* dz, const float* dy, const float* o, const float* z, int64_t N,
                              int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float s = 1.f / (1.f + std::exp(-z[n]));
    float dot = 0.f;
    for (int64_t c = 0; c < C; ++c) {
      dot += dy[n * C + c] * o[n * C + c];
      d_o[n * C + c] = s * dy[n * C + c];
    }
    dz[n] = s * (1.f - s) * dot;
  }
}

}  // namespace rt::cpu
