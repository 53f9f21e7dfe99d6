// ModelSpec parsing, refusals, validation, config writing and presets.
// Reference values: the config texts below are the published config.json files
// of the named models (4.x dialect) and their transformers-5.x equivalents
// (rope_parameters, dtype); parameter totals are the models' published counts.
#include "model/spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "testutil.h"

namespace {

using rt::Family;
using rt::ModelSpec;
using rt::RopeScaling;

// The error message of `f()`, or a failure when it does not throw rt::Error.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const rt::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT rt::Error: ") + e.what();
  }
  return "NO ERROR";
}

std::string parse_error(const std::string& text, const std::string& source = "m/config.json") {
  return error_of([&] { rt::spec_from_config_text(text, source); });
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// Field-by-field equality with a readable failure.
void expect_same_spec(const ModelSpec& a, const ModelSpec& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.rms_eps, b.rms_eps);  // exact: JSON numbers round-trip doubles
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.scaling, b.rope.scaling);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
  EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
  EXPECT_EQ(a.rope.original_max_positions, b.rope.original_max_positions);
  EXPECT_EQ(a.rope.partial_rotary_factor, b.rope.partial_rotary_factor);  // Phi3
  EXPECT_EQ(a.rope.short_factor, b.rope.short_factor);
  EXPECT_EQ(a.rope.long_factor, b.rope.long_factor);
  EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.qk_norm_whole, b.qk_norm_whole);
  EXPECT_EQ(a.post_norms, b.post_norms);
  EXPECT_EQ(a.embedding_multiplier, b.embedding_multiplier);
  EXPECT_EQ(a.residual_multiplier, b.residual_multiplier);
  EXPECT_EQ(a.logits_scaling, b.logits_scaling);
  EXPECT_EQ(a.attention_scale, b.attention_scale);
  EXPECT_EQ(a.rope_layers, b.rope_layers);
  EXPECT_EQ(a.norm_offset, b.norm_offset);  // Gemma
  EXPECT_EQ(a.mlp_act, b.mlp_act);
  EXPECT_EQ(a.sandwich_norms, b.sandwich_norms);
  EXPECT_EQ(a.attn_softcap, b.attn_softcap);
  EXPECT_EQ(a.final_softcap, b.final_softcap);
  EXPECT_EQ(a.local_window, b.local_window);
  EXPECT_EQ(a.local_layers, b.local_layers);
  EXPECT_EQ(a.rope_local_on, b.rope_local_on);
  EXPECT_EQ(a.rope_local.theta, b.rope_local.theta);
  EXPECT_EQ(a.rope_local.scaling, b.rope_local.scaling);
  EXPECT_EQ(a.moe.n_experts, b.moe.n_experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.expert_intermediate, b.moe.expert_intermediate);
  EXPECT_EQ(a.moe.norm_topk_prob, b.moe.norm_topk_prob);
  EXPECT_EQ(a.moe.router_aux_loss_coef, b.moe.router_aux_loss_coef);
  EXPECT_EQ(a.moe.output_router_logits, b.moe.output_router_logits);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.pad_id, b.pad_id);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
  EXPECT_EQ(a.dtype, b.dtype);
}

// meta-llama/Llama-3.1-8B config.json as published (transformers 4.43).
const char* kLlama31_4x = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// The same model as transformers 5.x writes it.
const char* kLlama31_5x = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": 128001,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": false,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 128256
})";

// mistralai/Mistral-7B-v0.3 config.json as published.
const char* kMistral_4x = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

const char* kMistral_5x = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 32768
})";

// Qwen/Qwen2.5-0.5B config.json as published.
const char* kQwen25_4x = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

const char* kQwen25_5x = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "bos_token_id": 151643, "eos_token_id": 151643, "dtype": "bfloat16",
  "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                  "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                  "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                  "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
                  "full_attention", "full_attention", "full_attention", "full_attention"],
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936
})";

// Qwen/Qwen3-0.6B config.json as published: head_dim 128 != 1024 / 16.
const char* kQwen3_4x = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

const char* kQwen3_5x = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "bos_token_id": 151643, "eos_token_id": 151645, "dtype": "bfloat16", "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936
})";

// A config text with one top-level field replaced (or removed when `value` is empty).
std::string with_field(const std::string& text, const std::string& key, const std::string& value) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  if (value.empty())
    j.erase(key);
  else
    j[key] = nlohmann::ordered_json::parse(value);
  return j.dump();
}

TEST(Spec, Llama31BothDialects) {
  ModelSpec a = rt::spec_from_config_text(kLlama31_4x, "llama4x.json");
  EXPECT_EQ(a.family, Family::llama);
  EXPECT_EQ(a.architecture, "LlamaForCausalLM");
  EXPECT_EQ(a.hidden, 4096);
  EXPECT_EQ(a.intermediate, 14336);
  EXPECT_EQ(a.n_layers, 32);
  EXPECT_EQ(a.n_heads, 32);
  EXPECT_EQ(a.n_kv_heads, 8);
  EXPECT_EQ(a.head_dim, 128);  // 4096 / 32
  EXPECT_EQ(a.kv_dim(), 1024);
  EXPECT_EQ(a.vocab, 128256);
  EXPECT_EQ(a.rms_eps, 1e-5);
  EXPECT_EQ(a.rope.theta, 500000.0);
  EXPECT_EQ(a.rope.scaling, RopeScaling::llama3);
  EXPECT_EQ(a.rope.factor, 8.0);
  EXPECT_EQ(a.rope.low_freq_factor, 1.0);
  EXPECT_EQ(a.rope.high_freq_factor, 4.0);
  EXPECT_EQ(a.rope.original_max_positions, 8192);
  EXPECT_FALSE(a.tie_embeddings);
  EXPECT_FALSE(a.qkv_bias);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_EQ(a.max_positions, 131072);
  EXPECT_EQ(a.bos_id, 128000);
  EXPECT_EQ(a.eos_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(a.dtype, "bfloat16");
  ModelSpec b = rt::spec_from_config_text(kLlama31_5x, "llama5x.json");
  expect_same_spec(a, b, "4.x vs 5.x dialect");
  expect_same_spec(a, rt::spec_preset("llama-3.1-8b"), "config vs preset");
}

TEST(Spec, MistralBothDialectsAndSlidingWindow) {
  ModelSpec a = rt::spec_from_config_text(kMistral_4x, "mistral.json");
  EXPECT_EQ(a.family, Family::mistral);
  EXPECT_EQ(a.vocab, 32768);
  EXPECT_EQ(a.rope.theta, 1e6);
  EXPECT_EQ(a.rope.scaling, RopeScaling::none);
  EXPECT_EQ(a.max_positions, 32768);
  EXPECT_EQ(a.bos_id, 1);
  expect_same_spec(a, rt::spec_from_config_text(kMistral_5x, "m5.json"), "4.x vs 5.x dialect");
  expect_same_spec(a, rt::spec_preset("mistral-7b"), "config vs preset");

  // Mistral-7B-v0.1 style: a 4096 window below 32768 positions. Accepted, and
  // runs take sequences of at most 4096 tokens, where the window is exactly
  // full causal attention; the window survives the config round trip.
  const ModelSpec v01 = rt::spec_from_config_text(with_field(kMistral_4x, "sliding_window", "4096"), "v01/config.json");
  EXPECT_EQ(v01.max_positions, 32768);
  EXPECT_EQ(v01.sliding_window, 4096);
  EXPECT_EQ(v01.max_sequence(), 4096);
  EXPECT_HAS(v01.max_sequence_why(), "sliding_window (4096; longer sequences would need windowed attention");
  const ModelSpec back = rt::spec_from_config_text(rt::spec_to_config_json(v01), "back.json");
  EXPECT_EQ(back.sliding_window, 4096);
  expect_same_spec(v01, back, "round trip");
  EXPECT_EQ(a.max_sequence(), 32768);  // null: no window
  // pad_token_id is kept for the exported config (HF's generate reads it).
  const ModelSpec padded = rt::spec_from_config_text(with_field(kMistral_4x, "pad_token_id", "11"), "p.json");
  EXPECT_EQ(padded.pad_id, 11);
  expect_same_spec(padded, rt::spec_from_config_text(rt::spec_to_config_json(padded), "pb.json"), "pad round trip");
  EXPECT_FALSE(a.pad_id.has_value());
  EXPECT_HAS(a.max_sequence_why(), "max_position_embeddings (32768)");
  // A window that covers every position never triggers.
  EXPECT_EQ(rt::spec_from_config_text(with_field(kMistral_4x, "sliding_window", "32768"), "x").max_sequence(), 32768);
  EXPECT_EQ(rt::spec_from_config_text(with_field(kMistral_4x, "sliding_window", "65536"), "x").max_sequence(), 32768);
  // Absent means MistralConfig's default of 4096.
  EXPECT_EQ(rt::spec_from_config_text(with_field(kMistral_4x, "sliding_window", ""), "x").max_sequence(), 4096);
  EXPECT_HAS(parse_error(with_field(kMistral_4x, "sliding_window", "0")), "sliding_window 0 is not a window");
}

TEST(Spec, Qwen25BothDialects) {
  ModelSpec a = rt::spec_from_config_text(kQwen25_4x, "qwen.json");
  EXPECT_EQ(a.family, Family::qwen2);
  EXPECT_EQ(a.head_dim, 64);  // 896 / 14
  EXPECT_EQ(a.n_kv_heads, 2);
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_TRUE(a.tie_embeddings);
  EXPECT_EQ(a.rms_eps, 1e-6);
  EXPECT_EQ(a.bos_id, 151643);
  EXPECT_EQ(a.eos_ids, std::vector<int64_t>{151643});
  // sliding_window 32768 is ignored because use_sliding_window is false.
  expect_same_spec(a, rt::spec_from_config_text(kQwen25_5x, "q5.json"), "4.x vs 5.x dialect");
  expect_same_spec(a, rt::spec_preset("qwen2.5-0.5b"), "config vs preset");

  std::string msg = parse_error(with_field(kQwen25_4x, "use_sliding_window", "true"));
  EXPECT_HAS(msg, "use_sliding_window true is not supported");
  EXPECT_HAS(msg, "supported: full causal attention");
  msg = parse_error(with_field(kQwen25_5x, "layer_types", R"(["full_attention", "sliding_attention"])"));
  EXPECT_HAS(msg, "sliding_attention");
}

TEST(Spec, Qwen3HeadDimDiffersFromHiddenOverHeads) {
  ModelSpec a = rt::spec_from_config_text(kQwen3_4x, "qwen3.json");
  EXPECT_EQ(a.family, Family::qwen3);
  EXPECT_EQ(a.head_dim, 128);  // from the config, not 1024 / 16 = 64
  EXPECT_EQ(a.q_dim(), 2048);
  EXPECT_EQ(a.kv_dim(), 1024);
  EXPECT_TRUE(a.qk_norm);
  EXPECT_FALSE(a.qkv_bias);
  EXPECT_EQ(a.rope.theta, 1e6);  // written as the integer 1000000
  EXPECT_EQ(a.eos_ids, std::vector<int64_t>{151645});
  expect_same_spec(a, rt::spec_from_config_text(kQwen3_5x, "q3.json"), "4.x vs 5.x dialect");
  // By hand: per layer 1024*2048 (q) + 2*1024*1024 (k, v) + 2048*1024 (o) + 2*128 (q/k norms)
  // + 3*1024*3072 (MLP) + 2*1024 (norms) = 15,730,944; the model card's "0.44B non-embedding".
  EXPECT_EQ(a.params_per_layer(), 15730944);
  EXPECT_EQ(a.params_total(), 28 * 15730944 + 151936LL * 1024 + 1024);  // tied: one embedding
  // head_dim null falls back to hidden / heads; absent takes Qwen3Config's default 128.
  EXPECT_EQ(rt::spec_from_config_text(with_field(kQwen3_4x, "head_dim", "null"), "x").head_dim, 64);
  EXPECT_EQ(rt::spec_from_config_text(with_field(kQwen3_4x, "head_dim", ""), "x").head_dim, 128);
  EXPECT_HAS(parse_error(with_field(kQwen3_4x, "attention_bias", "true")), "attention_bias true is not supported");
}

TEST(Spec, ModelTypeWhenArchitecturesMissing) {
  ModelSpec a = rt::spec_from_config_text(with_field(kQwen3_4x, "architectures", ""), "x");
  EXPECT_EQ(a.family, Family::qwen3);
  EXPECT_EQ(a.architecture, "Qwen3ForCausalLM");
  std::string t = with_field(with_field(kLlama31_4x, "architectures", ""), "model_type", "\"gpt2\"");
  std::string msg = parse_error(t);
  EXPECT_HAS(msg, "model_type gpt2 is not supported");
  EXPECT_HAS(msg, "llama, mistral, qwen2, qwen3");
}

TEST(Spec, UnknownArchitectureListsSupported) {
  std::string msg = parse_error(with_field(kLlama31_4x, "architectures", R"(["GPT2LMHeadModel"])"), "gpt2/config.json");
  EXPECT_HAS(msg,
             "[config] gpt2/config.json: architecture GPT2LMHeadModel is not supported; supported: "
             "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM");
}

TEST(Spec, RopeTypesOtherThanDefaultLinearAndLlama3AreRefused) {
  // 4.x: rope_scaling with "type" (older) or "rope_type".
  std::string msg =
      parse_error(with_field(kQwen25_4x, "rope_scaling",
                             R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"),
                  "yarn/config.json");
  EXPECT_HAS(msg, "[config] yarn/config.json");
  EXPECT_HAS(msg, "\"yarn\" is not supported; supported RoPE types: default, linear, llama3");
  for (const char* t : {"dynamic", "longrope"}) {
    std::string rs = std::string(R"({"rope_type": ")") + t + R"(", "factor": 2.0})";
    EXPECT_HAS(parse_error(with_field(kLlama31_4x, "rope_scaling", rs)),
               "supported RoPE types: default, linear, llama3");
  }
  // linear (Gemma 3's global layers; transformers applies it to any family): inv_freq / factor
  ModelSpec lin = rt::spec_from_config_text(
      with_field(kLlama31_4x, "rope_scaling", R"({"rope_type": "linear", "factor": 2.0})"), "lin");
  EXPECT_EQ(lin.rope.scaling, RopeScaling::linear);
  EXPECT_EQ(lin.rope.factor, 2.0);
  // 5.x: rope_parameters.
  msg = parse_error(
      with_field(kQwen3_5x, "rope_parameters", R"({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0})"));
  EXPECT_HAS(msg, "rope_parameters.rope_type \"yarn\" is not supported; supported RoPE types: default, linear, llama3");
  // llama3 needs all of its parameters.
  msg = parse_error(with_field(kLlama31_4x, "rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})"),
                    "l/config.json");
  EXPECT_HAS(msg, "[config] l/config.json: required field \"rope_scaling.low_freq_factor\" is missing");
  // {"type": "default"} is plain RoPE.
  ModelSpec d = rt::spec_from_config_text(with_field(kMistral_4x, "rope_scaling", R"({"type": "default"})"), "x");
  EXPECT_EQ(d.rope.scaling, RopeScaling::none);
}

TEST(Spec, RopeParametersNestedPerAttentionType) {
  std::string t = with_field(kLlama31_5x, "rope_parameters",
                             R"({"full_attention": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}})");
  expect_same_spec(rt::spec_from_config_text(t, "x"), rt::spec_from_config_text(kLlama31_4x, "y"), "nested");
  t = with_field(kQwen3_5x, "rope_parameters",
                 R"({"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})");
  EXPECT_HAS(parse_error(t), "supported: one RoPE setting for all layers");
  // 5.x precedence: a non-null rope_scaling wins over rope_parameters.
  t = with_field(kLlama31_4x, "rope_parameters", R"({"rope_type": "default", "rope_theta": 10000.0})");
  EXPECT_EQ(rt::spec_from_config_text(t, "x").rope.scaling, RopeScaling::llama3);
}

TEST(Spec, MissingRequiredFieldNamesFieldAndFile) {
  std::string msg = parse_error(with_field(kLlama31_4x, "intermediate_size", ""), "/models/llama/config.json");
  EXPECT_HAS(msg, "[config] /models/llama/config.json: required field \"intermediate_size\" is missing");
  msg = parse_error(with_field(kQwen25_4x, "vocab_size", "null"), "q/config.json");
  EXPECT_HAS(msg, "q/config.json: required field \"vocab_size\" is missing");
}

TEST(Spec, WrongTypesGiveClearErrors) {
  std::string msg = parse_error(with_field(kLlama31_4x, "hidden_size", "\"4096\""), "s/config.json");
  EXPECT_HAS(msg, "[config] s/config.json: field \"hidden_size\" must be an integer, found a string \"4096\"");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "rms_norm_eps", "\"1e-5\"")), "\"rms_norm_eps\" must be a number");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "num_hidden_layers", "32.5")),
             "\"num_hidden_layers\" must be an integer");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "tie_word_embeddings", "1")), "must be true or false");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "architectures", "\"LlamaForCausalLM\"")),
             "\"architectures\" must be a list of strings");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "eos_token_id", R"(["a"])")), "\"eos_token_id\" must be an integer");
  EXPECT_HAS(parse_error(with_field(kLlama31_4x, "rope_scaling", "7")), "\"rope_scaling\" must be an object or null");
  EXPECT_HAS(parse_error("{\"hidden_size\": ", "bad/config.json"), "[config] bad/config.json: not valid JSON");
  EXPECT_HAS(parse_error("[1, 2]", "arr.json"), "[config] arr.json: expected a JSON object");
  // An integral float is an integer.
  EXPECT_EQ(rt::spec_from_config_text(with_field(kLlama31_4x, "hidden_size", "4096.0"), "x").hidden, 4096);
}

TEST(Spec, UnsupportedLlamaSettingsAreListedTogether) {
  std::string t = with_field(with_field(kLlama31_4x, "attention_bias", "true"), "mlp_bias", "true");
  t = with_field(t, "hidden_act", "\"gelu\"");
  std::string msg = parse_error(t, "l/config.json");
  EXPECT_HAS(msg, "[config] l/config.json: LlamaForCausalLM with unsupported settings:");
  EXPECT_HAS(msg, "hidden_act \"gelu\" is not supported; supported: silu");
  EXPECT_HAS(msg, "attention_bias true is not supported for Llama");
  EXPECT_HAS(msg, "mlp_bias true is not supported");
}

TEST(Spec, HeadsNotDividing) {
  // No head_dim and 4096 % 30 != 0.
  std::string msg = parse_error(with_field(kLlama31_4x, "num_attention_heads", "30"), "h/config.json");
  EXPECT_HAS(msg, "[config] h/config.json: hidden_size 4096 is not divisible by num_attention_heads 30");
  // head_dim given, heads % kv_heads != 0, odd head_dim and a zero dim: all listed in one message.
  std::string t = with_field(kQwen3_4x, "num_key_value_heads", "3");
  t = with_field(t, "head_dim", "127");
  t = with_field(t, "intermediate_size", "0");
  msg = parse_error(t, "v/config.json");
  EXPECT_HAS(msg, "[config] v/config.json: inconsistent model shape (3 problems)");
  EXPECT_HAS(msg, "num_attention_heads 16 is not a multiple of num_key_value_heads 3");
  EXPECT_HAS(msg, "head_dim 127 must be even");
  EXPECT_HAS(msg, "intermediate_size must be positive, found 0");
  EXPECT_HAS(parse_error(with_field(kQwen3_4x, "eos_token_id", "151936")),
             "eos_token_id 151936 is outside the vocabulary");
}

TEST(Spec, TokenIdsAndDefaults) {
  ModelSpec a = rt::spec_from_config_text(with_field(kLlama31_4x, "eos_token_id", "[128001, 128008, 128009]"), "x");
  EXPECT_EQ(a.eos_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  a = rt::spec_from_config_text(with_field(with_field(kLlama31_4x, "eos_token_id", "null"), "bos_token_id", "null"),
                                "x");
  EXPECT_TRUE(a.eos_ids.empty());
  EXPECT_EQ(a.bos_id, -1);
  // Absent fields take the config class's defaults (transformers 5.24 LlamaConfig / Qwen2Config).
  std::string t = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "vocab_size": 100})";
  a = rt::spec_from_config_text(t, "x");
  EXPECT_EQ(a.n_kv_heads, 4);
  EXPECT_EQ(a.head_dim, 16);
  EXPECT_EQ(a.rms_eps, 1e-6);
  EXPECT_EQ(a.rope.theta, 10000.0);
  EXPECT_EQ(a.max_positions, 2048);
  EXPECT_EQ(a.bos_id, 1);
  EXPECT_EQ(a.eos_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(a.tie_embeddings);
  EXPECT_EQ(a.dtype, "float32");
  a = rt::spec_from_config_text(R"({"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 128,
                                    "num_hidden_layers": 2, "num_attention_heads": 64, "vocab_size": 100})",
                                "x");
  EXPECT_EQ(a.n_kv_heads, 32);  // Qwen2Config's default when the key is absent
  EXPECT_EQ(a.bos_id, -1);
  EXPECT_EQ(a.max_positions, 32768);
}

TEST(Spec, FromFileAndDirectory) {
  rt::test::TempDir dir;
  rt::write_file_atomic(dir.file("config.json"), kQwen3_4x);
  EXPECT_EQ(rt::spec_from_config_file(dir.path()).head_dim, 128);
  EXPECT_EQ(rt::spec_from_config_file(dir.file("config.json")).family, Family::qwen3);
  rt::write_file_atomic(dir.file("bad.json"), "{\"architectures\": [\"LlamaForCausalLM\"]}");
  EXPECT_HAS(error_of([&] { rt::spec_from_config_file(dir.file("bad.json")); }),
             dir.file("bad.json") + ": required field \"hidden_size\" is missing");
  std::string msg = error_of([&] { rt::spec_from_config_file(dir.file("nowhere")); });
  EXPECT_HAS(msg, "nowhere");
  EXPECT_HAS(msg, "not found");
}

// Published totals (HF model cards / safetensors metadata).
TEST(Spec, PresetParameterTotals) {
  EXPECT_EQ(rt::spec_preset("llama-3.1-8b").params_total(), 8030261248);
  EXPECT_EQ(rt::spec_preset("llama-3.1-70b").params_total(), 70553706496);
  EXPECT_EQ(rt::spec_preset("qwen2.5-7b").params_total(), 7615616512);
  EXPECT_EQ(rt::spec_preset("mistral-7b").params_total(), 7248023552);
  EXPECT_EQ(rt::spec_preset("qwen2.5-0.5b").params_total(), 494032768);
  EXPECT_EQ(rt::spec_preset("qwen2.5-14b").params_total(), 14770033664);
  EXPECT_EQ(rt::spec_preset("qwen2.5-32b").params_total(), 32763876352);
  EXPECT_EQ(rt::spec_preset("qwen2.5-72b").params_total(), 72706203648);
  EXPECT_EQ(rt::spec_preset("qwen3-8b").params_total(), 8190735360);
  // OLMo 2 (the model cards say 1.48B and 7.30B; these are the shapes' exact sums)
  EXPECT_EQ(rt::spec_preset("olmo-2-1b").params_total(), 1484916736);
  EXPECT_EQ(rt::spec_preset("olmo-2-7b").params_total(), 7298617344);
  // Granite 3.3 (model cards: 2.53B, 8.17B; tied) and SmolLM3 (3.08B, tied): the shapes' sums
  EXPECT_EQ(rt::spec_preset("granite-3.3-2b").params_total(), 2533539840);
  EXPECT_EQ(rt::spec_preset("granite-3.3-8b").params_total(), 8170864640);
  EXPECT_EQ(rt::spec_preset("smollm3-3b").params_total(), 3075098624);
  // tiny-byte by hand: per layer 256*256 (q) + 2*128*256 (k, v) + 256*256 (o) + 3*256*704 (MLP) + 2*256 (norms)
  // = 737,792; 6 layers + 2*264*256 (untied embed, head) + 256 (final norm).
  ModelSpec t = rt::spec_preset("tiny-byte");
  EXPECT_EQ(t.params_per_layer(), 737792);
  EXPECT_EQ(t.params_total(), 6 * 737792 + 2 * 264 * 256 + 256);
  EXPECT_EQ(t.vocab, 264);  // 258 byte-tokenizer ids padded to a multiple of 8
  EXPECT_EQ(t.head_dim, 64);
  EXPECT_EQ(t.bos_id, 256);
  EXPECT_EQ(t.eos_ids, std::vector<int64_t>{257});
  EXPECT_EQ(rt::spec_preset("qwen2.5-0.5b").params_lm_head(), 0);
  EXPECT_EQ(rt::spec_preset("qwen2.5-7b").params_lm_head(), 152064LL * 3584);
}

TEST(Spec, EveryPresetRoundTripsThroughConfigJson) {
  ASSERT_EQ(rt::preset_names().size(), 29u);
  for (const auto& name : rt::preset_names()) {
    ModelSpec s = rt::spec_preset(name);
    s.validate(name);
    std::string text = rt::spec_to_config_json(s);
    expect_same_spec(rt::spec_from_config_text(text, name), s, name);
    // Both dialects are present.
    nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_TRUE(j.contains("rope_theta") && j.contains("rope_scaling") && j.contains("rope_parameters")) << name;
    EXPECT_EQ(j["torch_dtype"], j["dtype"]) << name;
    const auto& rp = s.family == rt::Family::gemma3 ? j["rope_parameters"]["full_attention"] : j["rope_parameters"];
    EXPECT_EQ(rp["rope_theta"].get<double>(), s.rope.theta) << name;
  }
  // Preset files list eos lists and null ids faithfully too.
  ModelSpec s = rt::spec_preset("llama-3.1-8b");
  s.eos_ids = {128001, 128008, 128009};
  s.bos_id = -1;
  expect_same_spec(rt::spec_from_config_text(rt::spec_to_config_json(s), "x"), s, "eos list");
}

TEST(Spec, ConfigJsonRefusesWhatHfCannotExpress) {
  ModelSpec s = rt::spec_preset("tiny-byte");
  s.qkv_bias = true;  // Llama has no q/k/v-only bias
  EXPECT_HAS(error_of([&] { rt::spec_to_config_json(s); }), "qkv_bias");
  s = rt::spec_preset("tiny-byte");
  s.n_kv_heads = 3;
  EXPECT_HAS(error_of([&] { rt::spec_to_config_json(s); }), "not a multiple of num_key_value_heads 3");
}

TEST(Spec, UnknownPresetListsNames) {
  std::string msg = error_of([] { rt::spec_preset("llama-9000"); });
  EXPECT_HAS(msg,
             "[preset] unknown preset \"llama-9000\"; available: tiny-byte, llama-3.1-8b, llama-3.1-70b, mistral-7b, "
             "qwen2.5-0.5b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen2.5-72b, qwen3-8b");
}

// allenai/OLMo-2-1124-7B's config.json fields (transformers 4.x dialect):
// no head_dim (hidden / heads), no bos, eos 100257, pad 100277.
const char* kOlmo2_4x = R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.47.0", "use_cache": true, "vocab_size": 100352
})";
// The same in the 5.x dialect.
const char* kOlmo2_5x = R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "dtype": "bfloat16",
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "tie_word_embeddings": false,
  "vocab_size": 100352
})";

TEST(Spec, Olmo2BothDialectsPostNormsAndWholeQkNorms) {
  ModelSpec a = rt::spec_from_config_text(kOlmo2_4x, "olmo2.json");
  EXPECT_EQ(a.family, Family::olmo2);
  EXPECT_EQ(a.architecture, "Olmo2ForCausalLM");
  EXPECT_TRUE(a.post_norms && a.qk_norm && a.qk_norm_whole);
  EXPECT_FALSE(a.qkv_bias || a.is_moe());
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_EQ(a.rope.theta, 500000.0);
  EXPECT_EQ(a.bos_id, -1);
  EXPECT_EQ(a.eos_ids, std::vector<int64_t>{100257});
  EXPECT_EQ(a.pad_id, std::optional<int64_t>{100277});
  ModelSpec b = rt::spec_from_config_text(kOlmo2_5x, "olmo2_5x.json");
  expect_same_spec(a, b, "4.x vs 5.x dialect");
  ModelSpec p = rt::spec_preset("olmo-2-7b");
  p.pad_id = 100277;  // presets carry no pad id
  expect_same_spec(a, p, "config vs preset");
  // q_norm [H*D], k_norm [G*D]: 2 x 4096 per layer besides the two branch norms
  EXPECT_EQ(a.params_per_layer(), 4 * 4096LL * 4096 + 3 * 4096LL * 11008 + 4 * 4096);
  // OLMo2Config's defaults when fields are absent: eos 50279, eps 1e-5, 2048 positions, kv heads = heads
  ModelSpec d = rt::spec_from_config_text(R"({"architectures": ["Olmo2ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 50304})",
                                          "olmo2_min.json");
  EXPECT_EQ(d.eos_ids, std::vector<int64_t>{50279});
  EXPECT_EQ(d.rms_eps, 1e-5);
  EXPECT_EQ(d.max_positions, 2048);
  EXPECT_EQ(d.n_kv_heads, 4);
  EXPECT_EQ(d.bos_id, -1);
  EXPECT_HAS(parse_error(with_field(kOlmo2_4x, "attention_bias", "true")), "attention_bias true is not supported");
  // HF cannot express the OLMo2 layer under another family, nor other families' layers under OLMo2
  ModelSpec q = rt::spec_preset("qwen3-8b");
  q.post_norms = true;
  EXPECT_HAS(error_of([&] { rt::spec_to_config_json(q); }), "post_norms");
  // post-branch norms with experts are refused
  ModelSpec m = rt::spec_preset("olmoe-1b-7b");
  m.post_norms = true;
  EXPECT_HAS(error_of([&] { m.validate("x"); }), "post-branch norms (OLMo2) with mixture-of-experts");
}

// A Granite 3.x 8B config.json (transformers 4.49): tied, vocab 49,159.
const char* kGranite_4x = R"({
  "architectures": ["GraniteForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12800,
  "logits_scaling": 16.0, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "granite",
  "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
  "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.49.0", "use_cache": true,
  "vocab_size": 49159
})";

TEST(Spec, GraniteMultipliersBothDialects) {
  ModelSpec a = rt::spec_from_config_text(kGranite_4x, "granite.json");
  EXPECT_EQ(a.family, Family::granite);
  EXPECT_EQ(a.embedding_multiplier, 12.0);
  EXPECT_EQ(a.residual_multiplier, 0.22);
  EXPECT_EQ(a.logits_scaling, 16.0);
  EXPECT_EQ(a.attention_scale, 0.0078125);
  EXPECT_EQ(a.attention_softmax_scale(), 0.0078125);
  EXPECT_TRUE(a.tie_embeddings);
  std::string t5 = with_field(with_field(kGranite_4x, "rope_theta", ""), "rope_scaling", "");
  t5 = with_field(t5, "rope_parameters", R"({"rope_type": "default", "rope_theta": 10000000.0})");
  expect_same_spec(a, rt::spec_from_config_text(t5, "granite5.json"), "4.x vs 5.x dialect");
  ModelSpec p = rt::spec_preset("granite-3.3-8b");
  p.pad_id = 0;
  expect_same_spec(a, p, "config vs preset");
  // GraniteConfig's defaults: every multiplier 1 (the softmax scale too, not 1/sqrt(head_dim))
  ModelSpec d = rt::spec_from_config_text(R"({"architectures": ["GraniteForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})",
                                          "granite_min.json");
  EXPECT_EQ(d.embedding_multiplier, 1.0);
  EXPECT_EQ(d.attention_softmax_scale(), 1.0);
  EXPECT_FALSE(d.tie_embeddings);
  EXPECT_HAS(parse_error(with_field(kGranite_4x, "logits_scaling", "0")), "logits_scaling must be positive");
  EXPECT_HAS(parse_error(with_field(kGranite_4x, "mlp_bias", "true")), "mlp_bias true is not supported");
  // other families carry no multipliers into config.json
  ModelSpec q = rt::spec_preset("qwen3-8b");
  q.residual_multiplier = 0.5;
  EXPECT_HAS(error_of([&] { rt::spec_to_config_json(q); }), "only Granite");
  // the default softmax scale stays 1/sqrt(head_dim) elsewhere
  EXPECT_EQ(rt::spec_preset("qwen3-8b").attention_softmax_scale(), 1.0 / std::sqrt(128.0));
}

// A SmolLM3-3B-style config.json (5.x dialect): a NoPE layer every 4th layer.
const char* kSmolLM3_5x = R"({
  "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "bos_token_id": 128000, "dtype": "bfloat16",
  "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008,
  "max_position_embeddings": 65536, "mlp_bias": false, "model_type": "smollm3", "no_rope_layer_interval": 4,
  "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"},
  "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 128256
})";

TEST(Spec, SmolLM3NoRopeLayers) {
  ModelSpec a = rt::spec_from_config_text(kSmolLM3_5x, "smol.json");
  EXPECT_EQ(a.family, Family::smollm3);
  ASSERT_EQ(a.rope_layers.size(), 36u);
  for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(a.layer_uses_rope(i), (i + 1) % 4 != 0) << "layer " << i;
  ModelSpec p = rt::spec_preset("smollm3-3b");
  p.pad_id = 128004;
  expect_same_spec(a, p, "config vs preset");
  // the same as an explicit list (4.x dialect: rope_theta at the top)
  std::string list = "[";
  for (int i = 0; i < 36; ++i) list += std::string(i ? ", " : "") + ((i + 1) % 4 != 0 ? "1" : "0");
  std::string t4 = with_field(with_field(kSmolLM3_5x, "rope_parameters", ""), "rope_theta", "5000000.0");
  t4 = with_field(with_field(t4, "no_rope_layer_interval", ""), "no_rope_layers", list + "]");
  expect_same_spec(a, rt::spec_from_config_text(t4, "smol4.json"), "interval vs list, 5.x vs 4.x");
  // another interval; tied by default (SmolLM3Config); refusals
  ModelSpec b = rt::spec_from_config_text(
      with_field(with_field(kSmolLM3_5x, "no_rope_layer_interval", "3"), "tie_word_embeddings", ""), "s3.json");
  EXPECT_FALSE(b.layer_uses_rope(2));
  EXPECT_TRUE(b.layer_uses_rope(3));
  EXPECT_TRUE(b.tie_embeddings);
  EXPECT_HAS(parse_error(with_field(kSmolLM3_5x, "no_rope_layers", "[1, 0]")), "no_rope_layers has 2 entries for 36");
  EXPECT_HAS(parse_error(with_field(kSmolLM3_5x, "no_rope_layers", "[2]")), "no_rope_layers");
  EXPECT_HAS(parse_error(with_field(kSmolLM3_5x, "use_sliding_window", "true")), "use_sliding_window true");
  ModelSpec q = rt::spec_preset("qwen3-8b");
  q.rope_layers.assign(36, 1);
  EXPECT_HAS(error_of([&] { rt::spec_to_config_json(q); }), "only SmolLM3");
}

TEST(Spec, FamilyNames) {
  EXPECT_STREQ(rt::family_name(Family::llama), "llama");
  EXPECT_STREQ(rt::family_name(Family::mistral), "mistral");
  EXPECT_STREQ(rt::family_name(Family::qwen2), "qwen2");
  EXPECT_STREQ(rt::family_name(Family::qwen3), "qwen3");
  EXPECT_STREQ(rt::family_name(Family::olmo2), "olmo2");
  EXPECT_STREQ(rt::family_architecture(Family::olmo2), "Olmo2ForCausalLM");
}

}  // namespace
