// LM head + cross-entropy on the CPU (declared in cpu/ops.h), in chunks of
// chunk_rows tokens so the [N, V] logits never exist at once.
// Letters: N tokens, C hidden, V vocab, Nc = rows of the current chunk.
// h [N,C], w [V,C], targets [N] (in [0, V) or -100 = ignored).
//
// Per chunk: logits[Nc,V] = h_chunk @ w^T; per row, logsumexp with max
// subtraction (exp in fp32, the sum in double); loss = lse - logit[target].
// dlogits = grad_scale * (softmax - onehot) for valid rows, 0 for ignored rows;
// dh_chunk = dlogits @ w (=), dw += dlogits^T @ h_chunk. The loss sum is a
// double summed in row order. All splits are fixed by the shapes, so results
// are bit-identical for any thread count (they may differ in the last bits
// between chunk sizes, since the GEMM blocks differ).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"

namespace rt::cpu {

namespace {
constexpr int32_t kIgnoreIndex = -100;
constexpr int64_t kRowGrain = 4;  // logits rows per task (each row is V long)
}  // namespace

double lm_head_cross_entropy(float* dh, float* dw, const float* h, const float* w, const int32_t* targets, int64_t N,
                             int64_t C, int64_t V, float grad_scale, int64_t chunk_rows, int64_t* n_valid,
                             float softcap) {
  RT_CHECK(N >= 0 && C > 0 && V > 0, "[cpu/lm_head_cross_entropy] bad shape N=", N, " C=", C, " V=", V);
  RT_CHECK(chunk_rows > 0, "[cpu/lm_head_cross_entropy] chunk_rows must be positive, got ", chunk_rows);
  int64_t valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    RT_CHECK(t == kIgnoreIndex || (t >= 0 && t < V), "[cpu/lm_head_cross_entropy] target ", t, " at row ", n,
             " is outside [0, ", V,
             ") and is not the ignore index -100: check the tokenizer's vocab size "
             "against the model's vocab_size");
    if (t != kIgnoreIndex) ++valid;
  }
  if (n_valid) *n_valid = valid;
  const bool need_grad = dh != nullptr || dw != nullptr;
  const int64_t chunk = std::min(chunk_rows, std::max<int64_t>(N, 1));
  std::vector<float> logits(static_cast<size_t>(chunk * V));  // [Nc, V], becomes dlogits
  std::vector<double> row_loss(static_cast<size_t>(chunk));
  double total = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk), rows = r1 - r0;
    const float* hc = h + r0 * C;  // [Nc, C]
    matmul_nt(logits.data(), hc, w, rows, V, C);
    parallel_for(rows, kRowGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* l = logits.data() + i * V;
        const int32_t t = targets[r0 + i];
        if (t == kIgnoreIndex) {
          row_loss[i] = 0;
          if (need_grad)
            for (int64_t j = 0; j < V; ++j) l[j] = 0.f;
          continue;
        }
        // soft cap (HF order: divide, tanh, multiply); the backward's factor 1 - tanh^2 from the capped value
        if (softcap > 0.f)
          for (int64_t j = 0; j < V; ++j) l[j] = std::tanh(l[j] / softcap) * softcap;
        std::vector<float> capped;
        if (softcap > 0.f && need_grad) capped.assign(l, l + V);
        float mx = l[0];
        for (int64_t j = 1; j < V; ++j) mx = std::max(mx, l[j]);
        double sum = 0;
        for (int64_t j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
        const double lse = static_cast<double>(mx) + std::log(sum);
        row_loss[i] = lse - static_cast<double>(l[t]);
        if (need_grad) {
          const float lse_f = static_cast<float>(lse);
          const float p_t = std::exp(l[t] - lse_f);
          for (int64_t j = 0; j < V; ++j) l[j] = grad_scale * std::exp(l[j] - lse_f);
          l[t] = grad_scale * (p_t - 1.f);
          if (softcap > 0.f)
            for (int64_t j = 0; j < V; ++j) {
              const float th = capped[j] / softcap;
              l[j] *= 1.f - th * th;
            }
        }
      }
    });
    for (int64_t i = 0; i < rows; ++i) total += row_loss[i];
    if (dh) matmul_nn(dh + r0 * C, logits.data(), w, rows, C, V);  // dh_chunk[Nc,C] = dlogits @ w
    if (dw) matmul_tn(dw, logits.data(), hc, V, C, rows, 1.f);     // dw[V,C] += dlogits^T @ h_chunk
  }
  return total;
}

}  // namespace rt::cpu
