// Causal self-attention with GQA on the CPU (declared in cpu/ops.h), fp32,
// plain loops (no BLAS, so it stays parallel whatever OpenBLAS build is linked).
// Letters: B sequences, T length, H query heads, G kv heads, D head_dim,
// R = H / G query heads per kv head; query head h reads kv head h / R.
// q [B,T,H,D], k/v [B,T,G,D], out [B,T,H,D], lse [B,H,T].
//
// Forward, per query row t: s_j = (q_t . k_j) * scale for j0 <= j <= t (j0 =
// doc_start[b,t] with packed documents, else 0), softmax with
// max subtraction, out_t = sum_j p_j v_j, lse_t = max + log(sum exp).
// Backward recomputes p from lse: dP = dO V^T, dS = P * (dP - sum_j P dP),
// dq = scale * dS K, dk = scale * dS^T Q, dv = P^T dO, dk/dv summed over the R
// query heads of a group. Forward tasks: (b, h, block of kRowBlock query rows).
// Backward tasks: one per (b, g), looping over its heads and rows in a fixed
// order; each task owns its dq rows and its dk/dv rows, so results are
// bit-identical for any thread count. dq, dk, dv are written with '='.
// Window W > 0: j0 is also > t - W. Soft cap c > 0: s_j = c tanh(z_j / c) with
// z_j = (q_t . k_j) * scale, and the backward's dS picks up 1 - tanh^2.
// Sinks (gpt-oss, sink[h] per query head): the logit sink[h] joins each
// row's max and denominator and weighs no value, so P_sink = exp(sink - lse)
// and the rows' probabilities sum to 1 - P_sink; its dP is 0, so
// d sink[h] = sum over rows of P_sink (0 - D_t). The backward keeps one
// partial sum per (b, h) in its task and adds them over b in order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"

namespace rt::cpu {

namespace {

constexpr int64_t kRowBlock = 32;  // query rows per forward task

void attention_check(int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, const char* name) {
  RT_CHECK(B >= 0 && T >= 0 && H > 0 && G > 0 && D > 0, "[cpu/", name, "] bad shape B=", B, " T=", T, " H=", H,
           " G=", G, " D=", D);
  RT_CHECK(H % G == 0, "[cpu/", name, "] n_heads ", H, " is not a multiple of n_kv_heads ", G);
}

// Packed documents are contiguous runs: doc_start[b,t] is t or doc_start[b,t-1].
void doc_start_check(const int32_t* doc_start, int64_t B, int64_t T, const char* name) {
  if (!doc_start) return;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t d = doc_start[b * T + t];
      RT_CHECK(d == t || (t > 0 && d == doc_start[b * T + t - 1]), "[cpu/", name, "] doc_start[", b, ",", t, "] = ", d,
               ": each position must start a document (", t, ") or continue the one before", t > 0 ? " (" : "",
               t > 0 ? std::to_string(doc_start[b * T + t - 1]) : "", t > 0 ? ")" : "");
    }
}

// First key row t of sequence b sees (window > 0: no further back than t - window + 1).
int64_t first_key(const int32_t* doc_start, int64_t b, int64_t T, int64_t t, int64_t window) {
  const int64_t d = doc_start ? doc_start[b * T + t] : 0;
  return window > 0 ? std::max(d, t - window + 1) : d;
}

// The score of one (query, key) pair: z * scale, soft-capped when softcap > 0 (HF order: divide, tanh, multiply).
float score(float z, float scale, float softcap) {
  const float s = z * scale;
  return softcap > 0.f ? std::tanh(s / softcap) * softcap : s;
}

float dot(const float* a, const float* b, int64_t D) {
  float s = 0.f;
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t G, int64_t D, const int32_t* doc_start, int64_t window, float softcap,
                       const float* sinks) {
  attention_check(B, T, H, G, D, "attention_forward");
  RT_CHECK(window >= 0 && softcap >= 0.f, "[cpu/attention_forward] window ", window, " and softcap ", softcap,
           " must be >= 0");
  doc_start_check(doc_start, B, T, "attention_forward");
  if (B == 0 || T == 0) return;
  const int64_t R = H / G;
  const int64_t n_rb = (T + kRowBlock - 1) / kRowBlock;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  parallel_for(B * H * n_rb, 1, [&](int64_t task0, int64_t task1) {
    std::vector<float> p(static_cast<size_t>(T));  // scores, then probabilities, of one row
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t rb = task % n_rb, h = (task / n_rb) % H, b = task / (n_rb * H);
      const int64_t g = h / R;
      const int64_t t_end = std::min(T, (rb + 1) * kRowBlock);
      for (int64_t t = rb * kRowBlock; t < t_end; ++t) {
        const float* qt = q + ((b * T + t) * H + h) * D;
        const int64_t j0 = first_key(doc_start, b, T, t, window);
        float mx = sinks ? sinks[h] : -INFINITY;
        for (int64_t j = j0; j <= t; ++j) {
          p[j] = score(dot(qt, k + ((b * T + j) * G + g) * D, D), scale, softcap);
          mx = std::max(mx, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = j0; j <= t; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        if (sinks) sum += std::exp(sinks[h] - mx);
        const float inv = 1.f / sum;
        float* ot = out + ((b * T + t) * H + h) * D;
        std::fill(ot, ot + D, 0.f);
        for (int64_t j = j0; j <= t; ++j) {
          const float pj = p[j] * inv;
          const float* vj = v + ((b * T + j) * G + g) * D;
          for (int64_t d = 0; d < D; ++d) ot[d] += pj * vj[d];
        }
        lse[(b * H + h) * T + t] = mx + std::log(sum);
      }
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t H, int64_t G,
                        int64_t D, const int32_t* doc_start, int64_t window, float softcap, const float* sinks,
                        float* dsinks) {
  attention_check(B, T, H, G, D, "attention_backward");
  RT_CHECK(window >= 0 && softcap >= 0.f, "[cpu/attention_backward] window ", window, " and softcap ", softcap,
           " must be >= 0");
  doc_start_check(doc_start, B, T, "attention_backward");
  if (B == 0 || T == 0) return;
  RT_CHECK(!dsinks || sinks, "[cpu/attention_backward] a sink gradient without sinks");
  const int64_t R = H / G;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<double> dsink_part(static_cast<size_t>(dsinks ? B * H : 0), 0.0);  // [b, h]
  parallel_for(B * G, 1, [&](int64_t task0, int64_t task1) {
    std::vector<float> p(static_cast<size_t>(T)), ds(static_cast<size_t>(T)), acc(static_cast<size_t>(D)),
        cap_grad(static_cast<size_t>(softcap > 0.f ? T : 0));
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t b = task / G, g = task % G;
      auto kv_row = [&](int64_t j) { return ((b * T + j) * G + g) * D; };  // offset of row j in k/v/dk/dv
      for (int64_t j = 0; j < T; ++j) {
        std::memset(dk + kv_row(j), 0, sizeof(float) * D);
        std::memset(dv + kv_row(j), 0, sizeof(float) * D);
      }
      for (int64_t h = g * R; h < (g + 1) * R; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t row = ((b * T + t) * H + h) * D;
          const float* qt = q + row;
          const float* dout_t = dout + row;
          const float l = lse[(b * H + h) * T + t];
          // D_t = sum_j P_j dP_j (= rowsum(dO * O) in exact arithmetic). Summing
          // P*dP with the same rounded P the product below uses keeps the
          // cancellation in dP - D_t exact for sharp softmax rows; rowsum(dO * O)
          // with the forward's rounded O was measured 3x further from an fp64
          // reference on the llama fixture.
          // P is recomputed exactly as the forward normalised it (max, exp, sum):
          // exp(s - lse) with lse rounded to fp32 scales a whole row by
          // (1 + |lse| * 2^-24), and that error survives the cancellation in
          // dP - D_t of sharp rows (measured: 4x the fp64 distance of torch).
          const int64_t j0 = first_key(doc_start, b, T, t, window);
          float mx = sinks ? sinks[h] : -INFINITY;
          for (int64_t j = j0; j <= t; ++j) {
            p[j] = score(dot(qt, k + kv_row(j), D), scale, softcap);
            if (softcap > 0.f) cap_grad[j] = 1.f - (p[j] / softcap) * (p[j] / softcap);  // 1 - tanh^2
            mx = std::max(mx, p[j]);
          }
          float z = 0.f;  // same operations and order as the forward: the same P
          for (int64_t j = j0; j <= t; ++j) {
            p[j] = std::exp(p[j] - mx);
            z += p[j];
          }
          const float p_sink = sinks ? std::exp(sinks[h] - mx) : 0.f;
          z += p_sink;
          const float inv_z = 1.f / z;
          (void)l;
          double di = 0;
          for (int64_t j = j0; j <= t; ++j) {
            p[j] *= inv_z;
            ds[j] = dot(dout_t, v + kv_row(j), D);  // dP_j for now
            di += static_cast<double>(p[j]) * ds[j];
          }
          const float dif = static_cast<float>(di);
          if (dsinks) dsink_part[static_cast<size_t>(b * H + h)] -= static_cast<double>(p_sink * inv_z) * di;
          for (int64_t j = j0; j <= t; ++j) ds[j] = p[j] * (ds[j] - dif);  // dS = P * (dP - D_t)
          if (softcap > 0.f)
            for (int64_t j = j0; j <= t; ++j) ds[j] *= cap_grad[j];
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = j0; j <= t; ++j) {
            const float* kj = k + kv_row(j);
            for (int64_t d = 0; d < D; ++d) acc[d] += ds[j] * kj[d];
            float* dkj = dk + kv_row(j);
            float* dvj = dv + kv_row(j);
            const float dss = ds[j] * scale;
            for (int64_t d = 0; d < D; ++d) {
              dkj[d] += dss * qt[d];
              dvj[d] += p[j] * dout_t[d];
            }
          }
          float* dqt = dq + row;
          for (int64_t d = 0; d < D; ++d) dqt[d] = acc[d] * scale;
        }
      }
    }
  });
  if (dsinks)
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0.0;
      for (int64_t b = 0; b < B; ++b) acc += dsink_part[static_cast<size_t>(b * H + h)];
      dsinks[h] += static_cast<float>(acc);
    }
}

}  // namespace rt::cpu
