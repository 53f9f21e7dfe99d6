#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops.h"
#include "engine/kv_decode.h"

namespace rt {

std::vector<int32_t> sample_tokens(const HostState& state, const std::vector<int32_t>& prompt,
                                   const SampleOptions& opt) {
  const ModelSpec& s = state.spec();
  RT_CHECK(!prompt.empty(), "[sample] the prompt is empty");
  for (int32_t id : prompt)
    RT_CHECK(id >= 0 && id < s.vocab, "[sample] prompt id ", id, " is outside the vocab (", s.vocab, ")");
  CpuOps ops(s);
  ModelWeightsT<float> w = state.weights();
  std::mt19937_64 rng(opt.seed);
  std::vector<int32_t> ctx = prompt, out;
  std::vector<float> logits(static_cast<size_t>(s.vocab));
  const int64_t V = opt.vocab_limit > 0 ? std::min<int64_t>(opt.vocab_limit, s.vocab) : s.vocab;
  KvDecoder dec(ops, s, w, s.max_sequence());
  // The cache holds positions 0 .. max_sequence() - 1 (max_positions, or a
  // sliding window). When it is full, the newest three quarters of the
  // context are fed again from position 0 (RoPE is relative, so the model
  // sees the same recent text), which keeps a long generation linear.
  const float* hf = nullptr;
  auto refeed = [&](int64_t keep) {
    dec.reset();
    for (size_t t = ctx.size() - static_cast<size_t>(keep); t < ctx.size(); ++t) hf = dec.step(ctx[t]);
  };
  refeed(std::min<int64_t>(static_cast<int64_t>(ctx.size()), dec.capacity()));
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    if (opt.stop && opt.stop->load()) break;
    if (step > 0) {  // the token chosen last feeds the cache
      if (dec.size() == dec.capacity())
        refeed(std::max<int64_t>(dec.capacity() * 3 / 4, 1));  // ends with that token
      else
        hf = dec.step(ctx.back());
    }
    cpu::linear_forward(logits.data(), hf, w.lm_head, nullptr, 1, s.hidden, s.vocab);
    if (const float cap = static_cast<float>(s.final_softcap); cap > 0.f)  // Gemma 2's final soft cap
      for (auto& l : logits) l = std::tanh(l / cap) * cap;
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
