// Phi3ForCausalLM configs (model/spec_phi.cpp): both dialects, partial
// rotary, LongRoPE, the sliding window, refusals, the config writer, the
// presets, and the fused tensors of the weight map.
#include <gtest/gtest.h>

#include <cmath>

#include "model/spec.h"
#include "model/weight_map.h"
#include "testutil.h"

namespace {

using rt::Family;
using rt::ModelSpec;
using rt::RopeScaling;

// Phi-3.5-mini's layout, shrunk: head_dim 8 (4 rotated pairs), transformers 4.x spelling.
const char* kPhi35_4x = R"({
  "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32064,
  "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 262144,
  "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.5, 2.0],
                   "long_factor": [1.2, 3.0, 9.0, 20.0]},
  "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"
})";
// The same model as transformers 5.x writes it (rope_parameters, no rope_scaling).
const char* kPhi35_5x = R"({
  "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32064,
  "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "sliding_window": 262144,
  "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                      "original_max_position_embeddings": 4096,
                      "short_factor": [1.0, 1.1, 1.5, 2.0], "long_factor": [1.2, 3.0, 9.0, 20.0]},
  "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000, "dtype": "bfloat16"
})";

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

void expect_same_phi(const ModelSpec& a, const ModelSpec& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.scaling, b.rope.scaling);
  EXPECT_EQ(a.rope.partial_rotary_factor, b.rope.partial_rotary_factor);
  EXPECT_EQ(a.rope.original_max_positions, b.rope.original_max_positions);
  EXPECT_EQ(a.rope.short_factor, b.rope.short_factor);
  EXPECT_EQ(a.rope.long_factor, b.rope.long_factor);
  EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
  EXPECT_EQ(a.pad_id, b.pad_id);
}

TEST(SpecPhi, LongRopeInBothDialects) {
  const ModelSpec a = rt::spec_from_config_text(kPhi35_4x, "phi35.json");
  EXPECT_EQ(a.family, Family::phi3);
  EXPECT_EQ(a.head_dim, 8);
  EXPECT_EQ(a.rotary_dim(), 8);
  EXPECT_EQ(a.rope.scaling, RopeScaling::longrope);
  EXPECT_EQ(a.rope.original_max_positions, 4096);
  EXPECT_EQ(a.rope.long_factor, (std::vector<double>{1.2, 3.0, 9.0, 20.0}));
  // transformers: sqrt(1 + ln(131072 / 4096) / ln(4096))
  EXPECT_DOUBLE_EQ(a.rope.attention_factor, std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(a.sliding_window, 0);  // 262144 >= 131072 positions: no window
  EXPECT_EQ(a.max_sequence(), 131072);
  expect_same_phi(a, rt::spec_from_config_text(kPhi35_5x, "phi35_5x.json"), "4.x vs 5.x");
  // "su" (older Phi-3 configs) is LongRoPE; an explicit attention_factor is kept
  const ModelSpec su = rt::spec_from_config_text(with(kPhi35_4x, "\"longrope\"", "\"su\""), "su.json");
  EXPECT_EQ(su.rope.scaling, RopeScaling::longrope);
  const ModelSpec af = rt::spec_from_config_text(
      with(kPhi35_5x, "\"rope_theta\": 10000.0,", "\"rope_theta\": 10000.0, \"attention_factor\": 1.25,"), "af.json");
  EXPECT_EQ(af.rope.attention_factor, 1.25);
}

TEST(SpecPhi, OriginalContextIsTheTopLevelFieldAsInPhi3Config) {
  // Phi3Config puts the top-level original_max_position_embeddings (default 4096) over the rope object's
  const ModelSpec a =
      rt::spec_from_config_text(with(kPhi35_5x, "\"original_max_position_embeddings\": 4096,\n  \"rms", "\"rms"),
                                "no_top.json");
  EXPECT_EQ(a.rope.original_max_positions, 4096);
  const ModelSpec b = rt::spec_from_config_text(
      with(kPhi35_5x, "\"original_max_position_embeddings\": 4096,\n  \"rms",
           "\"original_max_position_embeddings\": 8192,\n  \"rms"),
      "top.json");
  EXPECT_EQ(b.rope.original_max_positions, 8192);
}

TEST(SpecPhi, PartialRotaryTopLevelOrInTheRopeObject) {
  // Phi-4-mini: 0.75 of head_dim 8 = 6 dims rotate (3 pairs)
  std::string cfg = with(kPhi35_4x, "\"rope_theta\": 10000.0,", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.75,");
  cfg = with(cfg, "[1.0, 1.1, 1.5, 2.0]", "[1.0, 1.1, 1.5]");
  cfg = with(cfg, "[1.2, 3.0, 9.0, 20.0]", "[1.2, 3.0, 9.0]");
  const ModelSpec a = rt::spec_from_config_text(cfg, "top.json");
  EXPECT_EQ(a.rope.partial_rotary_factor, 0.75);
  EXPECT_EQ(a.rotary_dim(), 6);
  std::string cfg5 = with(kPhi35_5x, "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75");
  cfg5 = with(cfg5, "[1.0, 1.1, 1.5, 2.0]", "[1.0, 1.1, 1.5]");
  cfg5 = with(cfg5, "[1.2, 3.0, 9.0, 20.0]", "[1.2, 3.0, 9.0]");
  expect_same_phi(a, rt::spec_from_config_text(cfg5, "obj.json"), "top level vs rope_parameters");
}

TEST(SpecPhi, SlidingWindowBelowTheContextLimitsTheSequence) {
  // Phi-3-mini-4k: sliding_window 2047 of 4096 positions, plain RoPE
  const std::string cfg = with(with(with(kPhi35_4x, "\"sliding_window\": 262144", "\"sliding_window\": 2047"),
                                    "\"max_position_embeddings\": 131072", "\"max_position_embeddings\": 4096"),
                               R"("rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.5, 2.0],
                   "long_factor": [1.2, 3.0, 9.0, 20.0]},)",
                               "\"rope_scaling\": null,");
  const ModelSpec a = rt::spec_from_config_text(cfg, "phi3mini.json");
  EXPECT_EQ(a.rope.scaling, RopeScaling::none);
  EXPECT_EQ(a.rope.attention_factor, 1.0);
  EXPECT_EQ(a.sliding_window, 2047);
  EXPECT_EQ(a.max_sequence(), 2047);
  EXPECT_NE(a.max_sequence_why().find("sliding_window (2047"), std::string::npos);
}

TEST(SpecPhi, UnsupportedSettingsAreRefusedTogether) {
  std::string cfg = with(kPhi35_4x, "\"resid_pdrop\": 0.0", "\"resid_pdrop\": 0.1");
  cfg = with(cfg, "\"type\": \"longrope\"", "\"type\": \"llama3\"");
  rt::test::expect_error([&] { rt::spec_from_config_text(cfg, "bad.json"); },
                         {"bad.json", "resid_pdrop 0.1 (dropout) is not supported", "rope_type \"llama3\"",
                          "supported: default, longrope"});
  rt::test::expect_error(
      [&] { rt::spec_from_config_text(with(kPhi35_4x, "[1.2, 3.0, 9.0, 20.0]", "[1.2, 3.0]"), "short.json"); },
      {"short.json", "long_factor has 2 entries", "one per rotated pair: 4"});
  rt::test::expect_error(
      [&] {
        rt::spec_from_config_text(with(kPhi35_4x, ",\n                   \"long_factor\": [1.2, 3.0, 9.0, 20.0]", ""),
                                  "nolong.json");
      },
      {"nolong.json", "rope_scaling.long_factor is missing"});
  // 0.7 of head_dim 8 rotates 5 dims: odd
  rt::test::expect_error(
      [&] {
        rt::spec_from_config_text(
            with(kPhi35_5x, "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.7"), "odd.json");
      },
      {"odd.json", "rotates 5 of head_dim 8"});
  // partial rotary stays refused outside Phi3
  ModelSpec llama = rt::spec_preset("tiny-byte");
  llama.rope.partial_rotary_factor = 0.5;
  rt::test::expect_error([&] { llama.validate("x"); }, {"supported for Phi3ForCausalLM only"});
}

TEST(SpecPhi, ConfigWriterRoundTripsAndPresetsCount) {
  for (const char* name : {"phi-3-mini", "phi-3.5-mini", "phi-4", "phi-4-mini"}) {
    const ModelSpec p = rt::spec_preset(name);
    expect_same_phi(p, rt::spec_from_config_text(rt::spec_to_config_json(p), name), name);
  }
  const ModelSpec a = rt::spec_from_config_text(kPhi35_4x, "phi35.json");
  ModelSpec b = rt::spec_from_config_text(rt::spec_to_config_json(a), "written.json");
  expect_same_phi(a, b, "written config");
  ModelSpec af = a;  // an attention factor of its own survives
  af.rope.attention_factor = 1.5;
  EXPECT_EQ(rt::spec_from_config_text(rt::spec_to_config_json(af), "af.json").rope.attention_factor, 1.5);
  // parameter counts from the published shapes (fused tensors count as their parts)
  EXPECT_EQ(rt::spec_preset("phi-3-mini").params_total(), 3821079552);
  EXPECT_EQ(rt::spec_preset("phi-3.5-mini").params_total(), 3821079552);
  EXPECT_EQ(rt::spec_preset("phi-4").params_total(), 14659507200);
  EXPECT_EQ(rt::spec_preset("phi-4-mini").params_total(), 3836021760);
  EXPECT_EQ(rt::spec_preset("phi-4-mini").rotary_dim(), 96);
  EXPECT_EQ(rt::spec_preset("phi-3-mini").max_sequence(), 2047);
}

TEST(SpecPhi, WeightMapFusesQkvAndGateUp) {
  const ModelSpec s = rt::spec_from_config_text(kPhi35_4x, "phi35.json");
  const std::vector<rt::FusedTensor> f = rt::fused_tensors(s);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].name, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(f[0].shape, (std::vector<int64_t>{32 + 2 * 32, 32}));
  EXPECT_EQ(f[0].parts.front(), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(f[1].name, "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(f[1].shape, (std::vector<int64_t>{2 * 64, 32}));
  std::vector<rt::FoundTensor> found;
  for (const auto& e : rt::hf_weight_map(s)) found.push_back({e.name, e.shape});
  EXPECT_EQ(rt::weight_map_check(s, found), "");
  // the unfused names are not what a Phi3 checkpoint holds
  std::vector<rt::FoundTensor> unfused;
  for (const auto& e : rt::weight_map(s)) unfused.push_back({e.name, e.shape});
  const std::string r = rt::weight_map_check(s, unfused);
  EXPECT_NE(r.find("missing: model.layers.0.self_attn.qkv_proj.weight [96, 32]"), std::string::npos) << r;
  EXPECT_NE(r.find("unexpected: model.layers.0.self_attn.q_proj.weight"), std::string::npos) << r;
  EXPECT_TRUE(rt::fused_tensors(rt::spec_preset("tiny-byte")).empty());
}

}  // namespace
