#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops.h"

namespace rt {

std::vector<int32_t> sample_tokens(const HostState& state, const std::vector<int32_t>& prompt,
                                   const SampleOptions& opt) {
  const ModelSpec& s = state.spec();
  RT_CHECK(!prompt.empty(), "[sample] the prompt is empty");
  for (int32_t id : prompt)
    RT_CHECK(id >= 0 && id < s.vocab, "[sample] prompt id ", id, " is outside the vocab (", s.vocab, ")");
  CpuOps ops(s);
  ModelWeightsT<float> w = state.weights();
  std::map<int64_t, std::unique_ptr<ModelRunner<CpuOps>>> runners;
  std::mt19937_64 rng(opt.seed);
  std::vector<int32_t> ctx = prompt, out;
  std::vector<float> logits(static_cast<size_t>(s.vocab));
  const int64_t V = opt.vocab_limit > 0 ? std::min<int64_t>(opt.vocab_limit, s.vocab) : s.vocab;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    if (opt.stop && opt.stop->load()) break;
    // keep the most recent max_sequence() tokens (max_positions, or a sliding window)
    const int64_t keep = std::min<int64_t>(static_cast<int64_t>(ctx.size()), s.max_sequence());
    const int64_t start = static_cast<int64_t>(ctx.size()) - keep;
    const int64_t T = std::min<int64_t>((keep + 63) / 64 * 64, std::max<int64_t>(s.max_sequence(), keep));
    auto& r = runners[T];
    if (!r) r = std::make_unique<ModelRunner<CpuOps>>(ops, s, 1, T);
    std::vector<int32_t> ids(static_cast<size_t>(T), 0), pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
    std::copy(ctx.begin() + start, ctx.end(), ids.begin());
    const float* hf = r->forward_hidden(w, ids.data(), pos.data());
    cpu::linear_forward(logits.data(), hf + (keep - 1) * s.hidden, w.lm_head, nullptr, 1, s.hidden, s.vocab);
    int32_t next;
    if (opt.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    } else {
      std::vector<int32_t> idx(static_cast<size_t>(V));
      for (int32_t i = 0; i < V; ++i) idx[i] = i;
      int64_t k = opt.top_k > 0 ? std::min<int64_t>(opt.top_k, V) : V;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      std::vector<double> p(static_cast<size_t>(k));
      double mx = logits[idx[0]], sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / opt.temperature);
      // draw without std::uniform_real_distribution (implementation-defined)
      double u = (static_cast<double>(rng() >> 11) * 0x1.0p-53) * sum, acc = 0;
      next = idx[k - 1];
      for (int64_t i = 0; i < k; ++i) {
        acc += p[i];
        if (u < acc) {
          next = idx[i];
          break;
        }
      }
    }
    out.push_back(next);
    ctx.push_back(next);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), next) != opt.stop_ids.end()) break;
  }
  return out;
}

}  // namespace rt
