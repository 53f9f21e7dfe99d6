// KvDecoder (engine/kv_decode.h) against the full forward it replaces in
// sampling: feeding a sequence token by token gives, at every position, the
// final hidden state ModelRunner::forward_hidden gives for that row.
// Tolerance: the two differ only in fp32 summation order (one query row's dot
// products and softmax here, the blocked attention and T-row GEMMs there), a
// few ulp per op through 2 layers (measured 1.2-2.9e-7 of the row's largest
// |value|); 1e-5 leaves room for other BLAS builds and is far below what a
// wrong position, mask or weight gives (a decoder one position off: 0.1-0.34).
#include "engine/kv_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

const char* kQwen2Moe = R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
  "hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 10, "shared_expert_intermediate_size": 14,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
  "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
  "use_sliding_window": false})";
const char* kOlmoe = R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
  "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 4, "vocab_size": 11, "num_experts": 6, "num_experts_per_tok": 3,
  "norm_topk_prob": false, "clip_qkv": null, "rope_theta": 100.0, "max_position_embeddings": 64,
  "eos_token_id": null, "pad_token_id": null})";

// Max |a - b| over a row, relative to the row's largest |b|.
double row_rel(const float* a, const float* b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return d / m;
}

void check_model(const rt::ModelSpec& s, const std::string& what) {
  SCOPED_TRACE(what);
  rt::HostState st(s, false);
  st.init_random(5);
  const rt::ModelWeightsT<float> w = st.weights();
  rt::CpuOps ops(s);
  const int64_t T = 24;
  std::mt19937 rng(9);
  std::vector<int32_t> ids(T), pos(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>(rng() % s.vocab), pos[t] = static_cast<int32_t>(t);
  rt::ModelRunner<rt::CpuOps> full(ops, s, 1, T);
  const float* ref = full.forward_hidden(w, ids.data(), pos.data());
  rt::KvDecoder dec(ops, s, w, T);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* h = dec.step(ids[t]);
    worst = std::max(worst, row_rel(h, ref + t * s.hidden, s.hidden));
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_EQ(dec.size(), T);
  rt::test::expect_error([&] { dec.step(0); }, {"the key/value cache is full"});
  // The check can fail: a decoder one position ahead differs far beyond the bound.
  rt::KvDecoder off(ops, s, w, T + 1);
  off.step(ids[0]);
  double shifted = 0;
  for (int64_t t = 0; t < T; ++t)
    shifted = std::max(shifted, row_rel(off.step(ids[t]), ref + t * s.hidden, s.hidden));
  EXPECT_GT(shifted, 1e-2);
  std::printf("%s: worst row difference %.2e, one position off %.2e\n", what.c_str(), worst, shifted);
}

TEST(KvDecode, EveryFamilyMatchesTheFullForward) {
  const std::string hf = rt::test::fixture_dir() + "/hf/";
  for (const char* m : {"llama_gqa_rope3", "mistral", "qwen2_bias_tied", "qwen3_qknorm_hd", "olmo2_postnorm",
                        "granite_mult", "smollm3_nope", "gemma_geglu", "gemma2_softcap_window", "gemma3_local_rope",
                        "gptoss_sinks_window"})  // gpt-oss: sinks (0 at this init: still in every row), window 5 < T
    check_model(rt::spec_from_config_file(hf + m + "/config.json"), m);
  check_model(rt::spec_from_config_text(kQwen2Moe, "qwen2_moe"), "qwen2_moe (shared expert)");
  check_model(rt::spec_from_config_text(kOlmoe, "olmoe"), "olmoe (whole q/k norms)");
  // Phi3: fused weights, partial rotary, LongRoPE's short factors and scale. The
  // decoder picks the factors per token from its position, the full forward
  // per call from the largest (transformers does both: prefill vs generate),
  // so both stay below original_max_position_embeddings here (T = 24).
  check_model(rt::spec_from_config_file(hf + "phi3_longrope_short/config.json"), "phi3_longrope_short");
  rt::ModelSpec phi4 = rt::spec_from_config_file(hf + "phi4mini_partial_tied/config.json");
  phi4.rope.original_max_positions = 64;
  check_model(phi4, "phi4mini_partial_tied (short factors)");
}

// Sampling past the cache's capacity keeps going (the newest context fed
// again) and stays seeded.
TEST(KvDecode, SamplingPastTheContextLengthContinues) {
  rt::ModelSpec s = rt::test::tiny_spec();
  s.max_positions = 8;
  rt::HostState st(s, false);
  st.init_random(2);
  rt::SampleOptions o;
  o.max_new_tokens = 30;
  o.seed = 4;
  const auto a = rt::sample_tokens(st, {1, 2, 3}, o), b = rt::sample_tokens(st, {1, 2, 3}, o);
  EXPECT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);
  o.temperature = 0;  // greedy: the first new token is the full forward's argmax
  const auto g = rt::sample_tokens(st, {1, 2, 3}, o);
  rt::CpuOps ops(s);
  rt::ModelRunner<rt::CpuOps> full(ops, s, 1, 3);
  const std::vector<int32_t> ids = {1, 2, 3}, pos = {0, 1, 2};
  const float* hf = full.forward_hidden(st.weights(), ids.data(), pos.data());
  std::vector<float> logits(static_cast<size_t>(s.vocab));
  rt::cpu::linear_forward(logits.data(), hf + 2 * s.hidden, st.weights().lm_head, nullptr, 1, s.hidden, s.vocab);
  EXPECT_EQ(g[0], std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace
