// Gemma, Gemma 2 and Gemma 3 (text) config.json parsing (model/spec_gemma.cpp):
// the fixtures' 5.x dialect, hand-written 4.x configs, refusals and presets.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "model/spec.h"
#include "testutil.h"

namespace {

using rt::Family;
using rt::ModelSpec;

std::string error_of(const std::string& text) {
  try {
    rt::spec_from_config_text(text, "config.json");
  } catch (const rt::Error& e) {
    return e.what();
  }
  return "";
}
#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

ModelSpec fixture(const std::string& name) {
  return rt::spec_from_config_file(rt::test::fixture_dir() + "/hf/" + name + "/config.json");
}

TEST(SpecGemma, Gemma1Fixture) {
  const ModelSpec s = fixture("gemma_geglu");
  EXPECT_EQ(s.family, Family::gemma);
  EXPECT_EQ(s.norm_offset, 1.0);
  EXPECT_EQ(s.mlp_act, rt::MlpAct::gelu_tanh);
  EXPECT_EQ(s.embedding_multiplier, static_cast<double>(std::sqrt(48.f)));  // sqrt(hidden) as fp32
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_FALSE(s.sandwich_norms);
  EXPECT_EQ(s.attention_scale, 0.0);  // 1/sqrt(head_dim)
  EXPECT_TRUE(s.local_layers.empty());
  EXPECT_EQ(s.final_softcap, 0.0);
}

TEST(SpecGemma, Gemma2Fixture) {
  const ModelSpec s = fixture("gemma2_softcap_window");
  EXPECT_EQ(s.family, Family::gemma2);
  EXPECT_TRUE(s.sandwich_norms);
  EXPECT_FALSE(s.qk_norm);
  EXPECT_EQ(s.attn_softcap, 2.0);
  EXPECT_EQ(s.final_softcap, 3.0);
  EXPECT_EQ(s.attention_scale, 1.0 / std::sqrt(24.0));
  EXPECT_EQ(s.local_window, 5);
  EXPECT_EQ(s.local_layers, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(s.layer_window(0), 5);
  EXPECT_EQ(s.layer_window(1), 0);
  EXPECT_FALSE(s.rope_local_on);
  EXPECT_FALSE(s.tie_embeddings);
}

TEST(SpecGemma, Gemma3FixtureHasTwoRopes) {
  const ModelSpec s = fixture("gemma3_local_rope");
  EXPECT_EQ(s.family, Family::gemma3);
  EXPECT_TRUE(s.qk_norm);
  EXPECT_FALSE(s.qk_norm_whole);
  EXPECT_EQ(s.attn_softcap, 0.0);
  EXPECT_EQ(s.final_softcap, 0.0);
  EXPECT_TRUE(s.rope_local_on);
  EXPECT_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.rope.scaling, rt::RopeScaling::linear);
  EXPECT_EQ(s.rope.factor, 4.0);
  EXPECT_EQ(s.rope_local.theta, 100.0);
  EXPECT_EQ(s.rope_local.scaling, rt::RopeScaling::none);
  EXPECT_TRUE(s.layer_rope_local(0));
  EXPECT_FALSE(s.layer_rope_local(1));
}

// transformers 4.x: no layer_types, sliding_window_pattern, rope_theta +
// rope_scaling for the global layers, rope_local_base_freq for the local ones.
TEST(SpecGemma, Gemma3FourDialect) {
  const std::string cfg = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 7, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512, "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh"})";
  const ModelSpec s = rt::spec_from_config_text(cfg, "config.json");
  EXPECT_EQ(s.head_dim, 256);  // Gemma3TextConfig's default
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_EQ(s.local_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.rope.scaling, rt::RopeScaling::linear);
  EXPECT_EQ(s.rope.factor, 8.0);
  EXPECT_EQ(s.rope_local.theta, 1e4);
  EXPECT_EQ(s.attention_scale, 1.0 / 16.0);
}

// Gemma 2 in 4.x: no layer_types (even layers slide), default caps 50 and 30.
TEST(SpecGemma, Gemma2FourDialectDefaults) {
  const std::string cfg = R"({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 100, "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh",
    "cache_implementation": "hybrid"})";
  const ModelSpec s = rt::spec_from_config_text(cfg, "config.json");
  EXPECT_EQ(s.local_layers, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(s.local_window, 4096);
  EXPECT_EQ(s.attn_softcap, 50.0);
  EXPECT_EQ(s.final_softcap, 30.0);
  EXPECT_EQ(s.attention_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
}

TEST(SpecGemma, Gemma1LegacyGeluMeansTanh) {
  const std::string cfg = R"({"architectures": ["GemmaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
    "vocab_size": 100, "hidden_act": "gelu"})";
  EXPECT_EQ(rt::spec_from_config_text(cfg, "config.json").mlp_act, rt::MlpAct::gelu_tanh);
}

TEST(SpecGemma, Refusals) {
  EXPECT_HAS(error_of(R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"})"),
             "needs a \"text_config\" object");
  EXPECT_HAS(error_of(R"({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {"hidden_size": 64,
    "num_attention_heads": 4, "head_dim": 16, "use_bidirectional_attention": true}})"),
             "config.json text_config: Gemma3ForCausalLM with unsupported settings");
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100)";
  EXPECT_HAS(error_of(R"({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "gelu", )" + base + "}"),
             "hidden_activation \"gelu\" is not supported");
  EXPECT_HAS(error_of(R"({"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": true, )" + base +
                      "}"),
             "use_bidirectional_attention");
  EXPECT_HAS(error_of(R"({"architectures": ["Gemma2ForCausalLM"], "layer_types": ["full_attention"], )" + base + "}"),
             "layer_types has 1 entries for 2 layers");
  EXPECT_HAS(error_of(R"({"architectures": ["GemmaForCausalLM"], "attention_bias": true, )" + base + "}"),
             "attention_bias true");
}

// A Gemma3ForConditionalGeneration config.json in the hub's shape (as
// google/gemma-3-4b-it's, written by transformers 4.50: text_config gives
// only what differs from Gemma3TextConfig's defaults, the eos ids are at the
// top level): its language model is the gemma-3-4b preset's.
TEST(SpecGemma, MultimodalConfigIsItsLanguageModel) {
  const std::string cfg = R"({"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
    "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14,
      "vision_use_head": false}})";
  const ModelSpec s = rt::spec_from_config_text(cfg, "config.json");
  const ModelSpec p = rt::spec_preset("gemma-3-4b");
  EXPECT_EQ(s.family, rt::Family::gemma3);
  EXPECT_EQ(s.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(s.dtype, "bfloat16");
  EXPECT_EQ(s.pad_id, std::optional<int64_t>(0));  // Gemma3TextConfig's default
  // every field a run depends on, against the preset (ids, dtype and pad aside: the preset has none)
  ModelSpec a = s, b = p;
  a.dtype = b.dtype = "float32";
  a.pad_id = b.pad_id = std::nullopt;
  EXPECT_EQ(rt::spec_to_config_json(a), rt::spec_to_config_json(b));
  EXPECT_EQ(s.params_total(), p.params_total());
  // the top level's tie_word_embeddings decides (transformers ties by it)
  nlohmann::json j = nlohmann::json::parse(cfg);
  j["tie_word_embeddings"] = false;
  j["text_config"]["tie_word_embeddings"] = true;
  EXPECT_FALSE(rt::spec_from_config_text(j.dump(), "config.json").tie_embeddings);
  // the list of supported architectures names it
  EXPECT_HAS(error_of(R"({"architectures": ["NoSuchForCausalLM"]})"), "Gemma3ForConditionalGeneration (its language");
  // without architectures, model_type gemma3 names the multimodal config
  j.erase("architectures");
  EXPECT_EQ(rt::spec_from_config_text(j.dump(), "config.json").hidden, 2560);
}

// Published totals (the safetensors metadata of the checkpoints).
TEST(SpecGemma, PresetParameterTotals) {
  EXPECT_EQ(rt::spec_preset("gemma-2-2b").params_total(), 2614341888);
  EXPECT_EQ(rt::spec_preset("gemma-2-9b").params_total(), 9241705984);
  EXPECT_EQ(rt::spec_preset("gemma-3-1b").params_total(), 999885952);
  const ModelSpec g = rt::spec_preset("gemma-3-4b");
  EXPECT_EQ(g.rope.scaling, rt::RopeScaling::linear);
  EXPECT_EQ(g.layer_window(5), 0);
  EXPECT_EQ(g.layer_window(4), 1024);
}

}  // namespace
