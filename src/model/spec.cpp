// ModelSpec: parsing HF config.json (transformers 4.x and 5.x dialects),
// writing one both load, parameter counts and validation (built-in presets:
// spec_presets.cpp).
//
// Rules:
// - Missing optional fields take transformers' own per-family defaults, so a
//   config means here what it means to transformers (e.g. Mistral's
//   sliding_window defaults to 4096, Qwen3's head_dim to 128).
// - Unsupported settings are refused, all at once, with what is supported;
//   nothing unsupported is silently ignored when it changes the math.
// - No nlohmann exception leaves this file: every error is an rt::Error that
//   starts with "[config] <file>:".
// - RoPE precedence follows transformers 5.x: a non-null rope_scaling (4.x)
//   wins over rope_parameters (5.x); rope_theta comes from the chosen object,
//   else from the top-level rope_theta, else 10000.
#include "model/spec.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/fs.h"
#include "core/quote.h"
#include "model/spec_gemma.h"
#include "model/spec_gptoss.h"
#include "model/spec_json.h"
#include "model/spec_multimodal.h"
#include "model/spec_phi.h"

namespace rt {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

struct FamilyInfo {
  Family family;
  const char* architecture;
  const char* model_type;
};
constexpr FamilyInfo kFamilies[] = {
    {Family::llama, "LlamaForCausalLM", "llama"},
    {Family::mistral, "MistralForCausalLM", "mistral"},
    {Family::qwen2, "Qwen2ForCausalLM", "qwen2"},
    {Family::qwen3, "Qwen3ForCausalLM", "qwen3"},
    {Family::qwen3_moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Family::qwen2_moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
    {Family::mixtral, "MixtralForCausalLM", "mixtral"},
    {Family::olmoe, "OlmoeForCausalLM", "olmoe"},
    {Family::olmo2, "Olmo2ForCausalLM", "olmo2"},
    {Family::granite, "GraniteForCausalLM", "granite"},
    {Family::smollm3, "SmolLM3ForCausalLM", "smollm3"},
    {Family::gemma, "GemmaForCausalLM", "gemma"},
    {Family::gemma2, "Gemma2ForCausalLM", "gemma2"},
    {Family::gemma3, "Gemma3ForCausalLM", "gemma3_text"},
    {Family::phi3, "Phi3ForCausalLM", "phi3"},
    {Family::gpt_oss, "GptOssForCausalLM", "gpt_oss"},
};

const FamilyInfo& family_info(Family f) {
  for (const auto& fi : kFamilies)
    if (fi.family == f) return fi;
  fail("[config] internal: unknown family");
}

std::string supported_architectures() {
  std::string s;
  for (const auto& fi : kFamilies) s += (s.empty() ? "" : ", ") + std::string(fi.architecture);
  return s + ", " + kGemma3Multimodal + " (its language model trains)";
}

std::string supported_model_types() {
  std::string s;
  for (const auto& fi : kFamilies) s += (s.empty() ? "" : ", ") + std::string(fi.model_type);
  return s;
}

// A JSON value shown in an error message, shortened.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

const char* type_word(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  if (v.is_null()) return "null";
  return "a number";
}

// Typed field access on one JSON object; `where` is the key path prefix used
// in messages ("" at top level, "rope_scaling." inside it).
struct Fields {
  const json& j;
  const std::string& source;
  std::string where;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  bool present(const char* key) const { return j.contains(key); }  // even when null

  [[noreturn]] void missing(const char* key) const {
    fail("[config] ", source, ": required field \"", where, key, "\" is missing; add it to the config");
  }
  [[noreturn]] void wrong(const char* key, const char* want) const {
    const json& v = j.at(key);
    fail("[config] ", source, ": field \"", where, key, "\" must be ", want, ", found ", type_word(v), " ", shown(v));
  }

  int64_t to_int(const char* key, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    wrong(key, "an integer");
  }
  int64_t get_int(const char* key) const {
    if (!has(key)) missing(key);
    return to_int(key, j.at(key));
  }
  int64_t get_int(const char* key, int64_t dflt) const { return has(key) ? get_int(key) : dflt; }

  double get_double(const char* key) const {
    if (!has(key)) missing(key);
    const json& v = j.at(key);
    if (!v.is_number()) wrong(key, "a number");
    return v.get<double>();
  }
  double get_double(const char* key, double dflt) const { return has(key) ? get_double(key) : dflt; }

  bool get_bool(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    if (!v.is_boolean()) wrong(key, "true or false");
    return v.get<bool>();
  }
  std::string get_string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    if (!v.is_string()) wrong(key, "a string");
    return v.get<std::string>();
  }
  // null or a list -> all ids; an int -> one id.
  std::vector<int64_t> get_id_list(const char* key, std::vector<int64_t> dflt) const {
    if (!present(key)) return dflt;
    const json& v = j.at(key);
    if (v.is_null()) return {};
    if (v.is_array()) {
      std::vector<int64_t> ids;
      for (const auto& e : v) {
        if (!e.is_number()) wrong(key, "an integer, a list of integers or null");
        ids.push_back(to_int(key, e));
      }
      return ids;
    }
    if (!v.is_number()) wrong(key, "an integer, a list of integers or null");
    return {to_int(key, v)};
  }
};

// transformers' per-family defaults for fields a config may leave out.
struct FamilyDefaults {
  int64_t max_positions;
  int64_t n_kv_heads;  // when the key is absent; -1: num_attention_heads
  int64_t bos_id;
  std::vector<int64_t> eos_ids;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
};
FamilyDefaults family_defaults(Family f) {
  switch (f) {
    case Family::llama:
      return {2048, -1, 1, {2}};
    case Family::mistral:
      return {131072, 8, 1, {2}};
    case Family::qwen2:
    case Family::qwen3:
      return {32768, 32, -1, {}};
    case Family::qwen3_moe:
      return {32768, 4, -1, {}};
    case Family::qwen2_moe:
      return {32768, 16, -1, {}};
    case Family::mixtral:
      return {131072, 8, 1, {2}, 1e-5, 1e6};
    case Family::olmoe:
      return {4096, -1, -1, {50279}, 1e-5};
    case Family::olmo2:
      return {2048, -1, -1, {50279}, 1e-5};
    case Family::granite:
      return {2048, -1, 1, {2}, 1e-6};
    case Family::smollm3:  // SmolLM3Config's default_theta
      return {32768, 4, 128000, {128001}, 1e-6, 2000000.0};
    case Family::gemma:  // GemmaConfig: 16 kv heads; Gemma2Config/Gemma3TextConfig: 4
      return {8192, 16, 2, {1}, 1e-6};
    case Family::gemma2:
      return {8192, 4, 2, {1}, 1e-6};
    case Family::gemma3:
      return {131072, 4, 2, {1}, 1e-6, 1e6};
    case Family::phi3:  // Phi3Config (pad_token_id 32000: spec_phi.cpp)
      return {4096, -1, 1, {32000}, 1e-5};
    case Family::gpt_oss:  // GptOssConfig (default_theta 150000)
      return {131072, 8, -1, {}, 1e-5, 150000.0};
  }
  return {2048, -1, -1, {}};
}

// YaRN's fields of a rope object, as transformers' _compute_yarn_parameters
// reads them: factor and original_max_position_embeddings required;
// attention_factor, else from mscale / mscale_all_dim when both are given,
// else 0.1 ln(factor) + 1 (1 when factor <= 1); beta_fast 32, beta_slow 1
// when absent or 0; truncate true when absent.
void yarn_read(const Fields& f, RopeConfig* rope, std::vector<std::string>* unsupported) {
  rope->scaling = RopeScaling::yarn;
  rope->factor = f.get_double("factor");
  rope->original_max_positions = f.get_int("original_max_position_embeddings");
  auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  const double ms = f.get_double("mscale", 0.0), ms_all = f.get_double("mscale_all_dim", 0.0);
  if (f.has("attention_factor"))
    rope->attention_factor = f.get_double("attention_factor");
  else if (ms != 0.0 && ms_all != 0.0)
    rope->attention_factor = mscale(rope->factor, ms) / mscale(rope->factor, ms_all);
  else
    rope->attention_factor = mscale(rope->factor, 1.0);
  rope->beta_fast = f.get_double("beta_fast", 0.0);
  if (rope->beta_fast == 0.0) rope->beta_fast = 32.0;
  rope->beta_slow = f.get_double("beta_slow", 0.0);
  if (rope->beta_slow == 0.0) rope->beta_slow = 1.0;
  rope->truncate = f.get_bool("truncate", true);
  if (!(rope->factor > 0.0) || !std::isfinite(rope->factor))
    unsupported->push_back(cat(f.where, "factor ", rope->factor, " must be positive"));
}

// Reads a rope object (rope_scaling or rope_parameters) into `rope`; yarn
// only where yarn_ok (gpt-oss: the other families' writers cannot express it).
void rope_read(const json& obj, const std::string& name, const std::string& source, double top_theta, RopeConfig* rope,
               std::vector<std::string>* unsupported, bool yarn_ok = false) {
  Fields f{obj, source, name + "."};
  rope->theta = f.get_double("rope_theta", top_theta);
  std::string type = f.has("rope_type") ? f.get_string("rope_type", "default") : f.get_string("type", "default");
  if (type == "default") {
    rope->scaling = RopeScaling::none;
  } else if (type == "linear") {
    rope->scaling = RopeScaling::linear;
    rope->factor = f.get_double("factor");
  } else if (type == "llama3") {
    rope->scaling = RopeScaling::llama3;
    rope->factor = f.get_double("factor");
    rope->low_freq_factor = f.get_double("low_freq_factor");
    rope->high_freq_factor = f.get_double("high_freq_factor");
    rope->original_max_positions = f.get_int("original_max_position_embeddings");
  } else if (type == "yarn" && yarn_ok) {
    yarn_read(f, rope, unsupported);  // spec_gptoss.cpp
  } else {
    unsupported->push_back(cat(name, ".rope_type \"", type,
                               "\" is not supported; supported RoPE types: default, linear, llama3",
                               yarn_ok ? ", yarn" : ""));
  }
  if (f.has("partial_rotary_factor") && f.get_double("partial_rotary_factor") != 1.0)
    unsupported->push_back(cat(name, ".partial_rotary_factor ", f.get_double("partial_rotary_factor"),
                               " is not supported; RoPE must rotate the whole head (1.0)"));
}

// The MoE fields of the three MoE families, with transformers' defaults.
// The expert count is "num_experts" (Qwen3-MoE, OLMoE) or "num_local_experts"
// (Mixtral); each config class maps one name to the other, so either is read.
void moe_parse(const Fields& f, ModelSpec& s, std::vector<std::string>* unsupported) {
  if (s.family != Family::qwen3_moe && s.family != Family::qwen2_moe && s.family != Family::mixtral &&
      s.family != Family::olmoe)
    return;
  const bool qwen_moe = s.family == Family::qwen3_moe || s.family == Family::qwen2_moe;
  MoeConfig& m = s.moe;
  const int64_t dflt_experts = s.family == Family::qwen3_moe   ? 128
                               : s.family == Family::qwen2_moe ? 60
                               : s.family == Family::mixtral   ? 8
                                                               : 64;
  const int64_t dflt_topk = s.family == Family::mixtral ? 2 : s.family == Family::qwen2_moe ? 4 : 8;
  const double dflt_coef = s.family == Family::olmoe ? 0.01 : 0.001;
  if (f.has("num_experts") && f.has("num_local_experts") && f.get_int("num_experts") != f.get_int("num_local_experts"))
    fail("[config] ", f.source, ": num_experts ", f.get_int("num_experts"), " and num_local_experts ",
         f.get_int("num_local_experts"), " disagree; keep one of them");
  m.n_experts = f.has("num_experts") ? f.get_int("num_experts") : f.get_int("num_local_experts", dflt_experts);
  m.top_k = f.get_int("num_experts_per_tok", dflt_topk);
  m.expert_intermediate =
      qwen_moe ? f.get_int("moe_intermediate_size", s.family == Family::qwen3_moe ? 768 : 1408) : s.intermediate;
  if (s.family == Family::qwen2_moe) m.shared_intermediate = f.get_int("shared_expert_intermediate_size", 5632);
  // Mixtral always renormalises the top-k probabilities (its config has no switch).
  m.norm_topk_prob = s.family == Family::mixtral ? true : f.get_bool("norm_topk_prob", false);
  m.router_aux_loss_coef = f.get_double("router_aux_loss_coef", dflt_coef);
  m.output_router_logits = f.get_bool("output_router_logits", false);
  if (m.n_experts <= 0)
    unsupported->push_back(cat("num_experts ", m.n_experts, " (every layer dense) is not supported for ",
                               s.architecture, "; supported: num_experts >= 1"));
  if (qwen_moe) {
    const int64_t step = f.get_int("decoder_sparse_step", 1);
    if (step != 1)
      unsupported->push_back(cat("decoder_sparse_step ", step,
                                 " (dense MLP layers between MoE layers) is not supported; supported: 1 (every "
                                 "layer MoE)"));
    if (f.has("mlp_only_layers")) {
      const json& v = f.j.at("mlp_only_layers");
      if (!v.is_array()) f.wrong("mlp_only_layers", "a list of layer indices or null");
      if (!v.empty())
        unsupported->push_back(
            cat("mlp_only_layers ", shown(v), " (dense MLP layers) is not supported; supported: [] (every layer MoE)"));
    }
  }
  if (s.family == Family::mixtral && f.get_double("router_jitter_noise", 0.0) != 0.0)
    unsupported->push_back(cat("router_jitter_noise ", f.get_double("router_jitter_noise", 0.0),
                               " (random router input noise in training) is not supported; supported: 0"));
  if (s.family == Family::olmoe) {
    if (f.has("clip_qkv"))
      unsupported->push_back(
          cat("clip_qkv ", f.get_double("clip_qkv"), " (clamping q, k and v) is not supported; supported: null"));
    if (s.n_heads * s.head_dim != s.hidden)
      unsupported->push_back(cat("num_attention_heads x head_dim = ", s.n_heads * s.head_dim,
                                 " differs from hidden_size ", s.hidden,
                                 "; OLMoE's q norm spans hidden_size, so they must agree"));
  }
}

ModelSpec spec_parse(const json& j, const std::string& source) {
  if (!j.is_object()) fail("[config] ", source, ": expected a JSON object at the top level, found ", type_word(j));
  if (config_is_multimodal(j))  // its language model: model/spec_multimodal.h
    return spec_parse(multimodal_text_config(j, source), source + " text_config");
  Fields f{j, source, ""};
  ModelSpec s;

  // ---- architecture
  const FamilyInfo* fam = nullptr;
  if (f.has("architectures") && !(j.at("architectures").is_array() && j.at("architectures").empty())) {
    const json& a = j.at("architectures");
    if (!a.is_array() || !a.at(0).is_string())
      fail("[config] ", source, ": field \"architectures\" must be a list of strings, found ", shown(a));
    std::string arch = a.at(0).get<std::string>();
    for (const auto& fi : kFamilies)
      if (arch == fi.architecture) fam = &fi;
    if (!fam)
      fail("[config] ", source, ": architecture ", arch, " is not supported; supported: ", supported_architectures());
  } else if (f.has("model_type")) {
    std::string mt = f.get_string("model_type", "");
    for (const auto& fi : kFamilies)
      if (mt == fi.model_type) fam = &fi;
    if (!fam)
      fail("[config] ", source, ": model_type ", mt, " is not supported; supported: ", supported_model_types(),
           " (architectures ", supported_architectures(), ")");
  } else {
    fail("[config] ", source,
         ": neither \"architectures\" nor \"model_type\" is given; set \"architectures\" to one of ",
         supported_architectures());
  }
  s.family = fam->family;
  s.architecture = fam->architecture;
  FamilyDefaults dflt = family_defaults(s.family);

  // ---- dimensions
  s.hidden = f.get_int("hidden_size");
  s.intermediate = f.get_int("intermediate_size");
  s.n_layers = f.get_int("num_hidden_layers");
  s.n_heads = f.get_int("num_attention_heads");
  // Absent: the config class's default (Mistral 8, Qwen2/Qwen3 32); null: one kv head per head.
  s.n_kv_heads = f.get_int("num_key_value_heads",
                           f.present("num_key_value_heads") || dflt.n_kv_heads < 0 ? s.n_heads : dflt.n_kv_heads);
  s.vocab = f.get_int("vocab_size");
  if (f.has("head_dim")) {
    s.head_dim = f.get_int("head_dim");
  } else if ((s.family == Family::qwen3 || s.is_gemma() || s.family == Family::gpt_oss) && !f.present("head_dim")) {
    // Qwen3Config's, the Gemma configs' and GptOssConfig's defaults
    s.head_dim = s.is_gemma() ? 256 : s.family == Family::gpt_oss ? 64 : 128;
  } else {
    if (s.n_heads <= 0 || s.hidden % s.n_heads != 0)
      fail("[config] ", source, ": hidden_size ", s.hidden, " is not divisible by num_attention_heads ", s.n_heads,
           " and head_dim is not given; set head_dim or fix the head count");
    s.head_dim = s.hidden / s.n_heads;
  }
  s.rms_eps = f.get_double("rms_norm_eps", dflt.rms_eps);
  s.tie_embeddings = f.get_bool("tie_word_embeddings", s.family == Family::smollm3 || s.is_gemma());  // SmolLM3, Gemma: tied
  s.max_positions = f.get_int("max_position_embeddings", dflt.max_positions);
  {
    std::vector<int64_t> bos =
        f.get_id_list("bos_token_id", dflt.bos_id >= 0 ? std::vector<int64_t>{dflt.bos_id} : std::vector<int64_t>{});
    if (bos.size() > 1) f.wrong("bos_token_id", "an integer or null");
    s.bos_id = bos.empty() ? -1 : bos[0];
  }
  s.eos_ids = f.get_id_list("eos_token_id", dflt.eos_ids);
  if (j.contains("pad_token_id") && j.at("pad_token_id").is_number_integer())
    s.pad_id = j.at("pad_token_id").get<int64_t>();
  s.dtype = f.has("dtype") ? f.get_string("dtype", "float32") : f.get_string("torch_dtype", "float32");

  // ---- family features and refusals
  std::vector<std::string> unsupported;
  std::string act = f.get_string("hidden_act", "silu");
  if (act != "silu" && !s.is_gemma())  // Gemma's activation: spec_gemma.cpp
    unsupported.push_back(cat("hidden_act \"", act, "\" is not supported; supported: silu (SwiGLU MLP)"));
  // Qwen2-MoE: q/k/v biases unless qkv_bias is false (Qwen2MoeConfig's default: true)
  s.qkv_bias = s.family == Family::qwen2 || (s.family == Family::qwen2_moe && f.get_bool("qkv_bias", true));
  s.qk_norm = s.family == Family::qwen3 || s.family == Family::qwen3_moe || s.family == Family::olmoe ||
              s.family == Family::olmo2;
  s.qk_norm_whole = s.family == Family::olmoe || s.family == Family::olmo2;  // OLMo2: q_norm [H*D], k_norm [G*D]
  s.post_norms = s.family == Family::olmo2;
  moe_parse(f, s, &unsupported);
  if (s.is_gemma()) detail::gemma_parse(j, source, s, &unsupported);
  if (s.family == Family::llama) {
    if (f.get_bool("attention_bias", false))
      unsupported.push_back(
          "attention_bias true is not supported for Llama (it adds biases to q, k, v and o); supported: false "
          "(q/k/v biases are supported only as in Qwen2)");
    if (f.get_bool("mlp_bias", false)) unsupported.push_back("mlp_bias true is not supported; supported: false");
  }
  if (s.family == Family::granite || s.family == Family::smollm3) {
    if (f.get_bool("attention_bias", false))
      unsupported.push_back(cat("attention_bias true is not supported for ", s.architecture, "; supported: false"));
    if (f.get_bool("mlp_bias", false)) unsupported.push_back("mlp_bias true is not supported; supported: false");
  }
  if (s.family == Family::granite) {  // GraniteConfig's defaults: 1.0 each (attention_multiplier too)
    s.embedding_multiplier = f.get_double("embedding_multiplier", 1.0);
    s.residual_multiplier = f.get_double("residual_multiplier", 1.0);
    s.logits_scaling = f.get_double("logits_scaling", 1.0);
    s.attention_scale = f.get_double("attention_multiplier", 1.0);
    if (!(s.attention_scale > 0.0))
      unsupported.push_back(
          cat("attention_multiplier ", s.attention_scale, " is not a softmax scale; give a positive one"));
  }
  if (s.family == Family::smollm3) {
    // no_rope_layers: per layer, 1 = RoPE, 0 = none; absent or null: a NoPE
    // layer every no_rope_layer_interval layers (the (k * interval)-th, 1-based)
    if (f.has("no_rope_layers")) {
      const json& v = j.at("no_rope_layers");
      if (!v.is_array()) f.wrong("no_rope_layers", "a list of 0 or 1 per layer");
      for (const auto& e : v) {
        if (!e.is_number() || (f.to_int("no_rope_layers", e) != 0 && f.to_int("no_rope_layers", e) != 1))
          f.wrong("no_rope_layers", "a list of 0 or 1 per layer");
        s.rope_layers.push_back(static_cast<uint8_t>(f.to_int("no_rope_layers", e)));
      }
    } else {
      const int64_t every = f.get_int("no_rope_layer_interval", 4);
      if (every <= 0)
        unsupported.push_back(cat("no_rope_layer_interval ", every, " must be positive"));
      else
        for (int64_t i = 0; i < s.n_layers; ++i) s.rope_layers.push_back((i + 1) % every != 0 ? 1 : 0);
    }
  }
  if ((s.family == Family::qwen3 || s.family == Family::qwen3_moe || s.family == Family::olmoe ||
       s.family == Family::olmo2) &&
      f.get_bool("attention_bias", false))
    unsupported.push_back(cat("attention_bias true is not supported for ", s.architecture, "; supported: false"));

  // Phi3: RoPE (partial, LongRoPE), window and the rest in spec_phi.cpp
  if (s.family == Family::phi3) return spec_phi3_finish(j, source, std::move(s), std::move(unsupported));
  // gpt-oss: YaRN, alternating windows, sinks, biases and its experts in spec_gptoss.cpp
  if (s.family == Family::gpt_oss) return spec_gptoss_finish(j, source, std::move(s), std::move(unsupported));

  // ---- RoPE
  double top_theta = f.get_double("rope_theta", dflt.rope_theta);
  s.rope.theta = top_theta;
  if (f.has("rope_scaling") && !j.at("rope_scaling").is_object()) f.wrong("rope_scaling", "an object or null");
  if (f.has("rope_scaling") && !j.at("rope_scaling").empty()) {
    rope_read(j.at("rope_scaling"), "rope_scaling", source, top_theta, &s.rope, &unsupported);
  } else if (f.has("rope_parameters") && s.family != Family::gemma3) {  // Gemma 3's two: spec_gemma.cpp
    const json* rp = &j.at("rope_parameters");
    if (!rp->is_object()) f.wrong("rope_parameters", "an object or null");
    std::string name = "rope_parameters";
    if (!rp->contains("rope_type") && !rp->contains("rope_theta") && !rp->contains("type")) {
      // nested per attention type, e.g. {"full_attention": {...}}
      std::vector<std::string> keys;
      for (auto it = rp->begin(); it != rp->end(); ++it)
        if (it->is_object()) keys.push_back(it.key());
      if (keys.size() == 1) {
        name += "." + keys[0];
        rp = &rp->at(keys[0]);
      } else if (keys.size() > 1) {
        unsupported.push_back(cat("rope_parameters holds ", keys.size(),
                                  " per-layer-type RoPE settings; supported: one RoPE setting for all layers"));
        rp = nullptr;
      }
    }
    if (rp && !rp->empty()) rope_read(*rp, name, source, top_theta, &s.rope, &unsupported);
  }
  if (f.has("partial_rotary_factor") && f.get_double("partial_rotary_factor") != 1.0)
    unsupported.push_back("partial_rotary_factor != 1 is not supported; RoPE must rotate the whole head");

  // ---- sliding window
  if (s.family == Family::mistral || s.family == Family::mixtral) {
    // MistralConfig's default is 4096 when the key is absent (MixtralConfig's
    // is null); null disables it.
    std::optional<int64_t> window;
    if (!f.present("sliding_window") && s.family == Family::mistral)
      window = 4096;
    else if (f.has("sliding_window"))
      window = f.get_int("sliding_window");
    if (window && *window <= 0)
      unsupported.push_back(cat("sliding_window ", *window, " is not a window; give a positive size or null"));
    else if (window && *window < s.max_positions)
      s.sliding_window = *window;  // sequences up to the window: exactly full causal attention
  } else if (s.family == Family::qwen2 || s.family == Family::qwen3 || s.family == Family::qwen3_moe ||
             s.family == Family::qwen2_moe || s.family == Family::smollm3) {
    if (f.get_bool("use_sliding_window", false))
      unsupported.push_back(
          "use_sliding_window true is not supported; supported: full causal attention (use_sliding_window false)");
    if (f.has("layer_types")) {
      const json& lt = j.at("layer_types");
      if (!lt.is_array()) f.wrong("layer_types", "a list of strings");
      for (const auto& t : lt) {
        if (!t.is_string()) f.wrong("layer_types", "a list of strings");
        if (t.get<std::string>() != "full_attention") {
          unsupported.push_back(cat("layer_types contains \"", t.get<std::string>(),
                                    "\"; supported: \"full_attention\" for every layer"));
          break;
        }
      }
    }
  }

  return detail::spec_finish(source, std::move(s), unsupported);
}

ojson rope_scaling_json(const RopeConfig& r) {
  ojson o;
  if (r.scaling == RopeScaling::linear) {
    o["rope_type"] = "linear";
    o["factor"] = r.factor;
    return o;
  }
  o["rope_type"] = "llama3";
  o["factor"] = r.factor;
  o["low_freq_factor"] = r.low_freq_factor;
  o["high_freq_factor"] = r.high_freq_factor;
  o["original_max_position_embeddings"] = r.original_max_positions;
  return o;
}

}  // namespace

void detail::spec_rope_read(const json& obj, const std::string& name, const std::string& source, double top_theta,
                            RopeConfig* rope, std::vector<std::string>* unsupported, bool yarn_ok) {
  rope_read(obj, name, source, top_theta, rope, unsupported, yarn_ok);
}

const char* family_name(Family f) { return family_info(f).model_type; }
const char* family_architecture(Family f) { return family_info(f).architecture; }

ModelSpec spec_from_config_text(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("[config] ", source, ": not valid JSON (", quote_input(e.what()), ")");
  }
  try {
    return spec_parse(j, source);
  } catch (const json::exception& e) {
    // A safety net: every access above is type-checked first.
    fail("[config] ", source, ": unexpected content (", quote_input(e.what()), ")");
  }
}

ModelSpec spec_from_config_file(const std::string& path) {
  std::string file = is_directory(path) ? path_join(path, "config.json") : path;
  if (!file_exists(file))
    fail("[config] ", file, ": not found; pass a HF model directory that holds config.json, or the config file itself");
  return spec_from_config_text(read_text_file(file), file);
}

std::string spec_to_config_json(const ModelSpec& s) {
  const FamilyInfo& fi = family_info(s.family);
  if (s.family == Family::phi3) return spec_phi3_config_json(s);
  if (s.family == Family::gpt_oss) return spec_gptoss_config_json(s);
  RT_CHECK(s.architecture.empty() || s.architecture == fi.architecture, "[config] spec_to_config_json: architecture ",
           s.architecture, " does not match family ", fi.model_type, " (expected ", fi.architecture, ")");
  RT_CHECK(s.is_gemma() || (s.norm_offset == 0.0 && s.mlp_act == MlpAct::silu && !s.sandwich_norms &&
                            s.attn_softcap == 0.0 && s.final_softcap == 0.0 && s.local_layers.empty() &&
                            !s.rope_local_on),
           "[config] spec_to_config_json: Gemma's features cannot be expressed for family ", fi.model_type);
  const bool moe_family = s.family == Family::qwen3_moe || s.family == Family::qwen2_moe ||
                          s.family == Family::mixtral || s.family == Family::olmoe;
  RT_CHECK(s.family == Family::qwen2_moe || s.qkv_bias == (s.family == Family::qwen2),
           "[config] spec_to_config_json: qkv_bias=", s.qkv_bias, " cannot be expressed for family ", fi.model_type,
           " (HF: only Qwen2 has q/k/v biases)");
  RT_CHECK(s.is_gemma() || (s.qk_norm == (s.family == Family::qwen3 || s.family == Family::qwen3_moe ||
                                          s.family == Family::olmoe || s.family == Family::olmo2) &&
                            s.qk_norm_whole == (s.family == Family::olmoe || s.family == Family::olmo2)),
           "[config] spec_to_config_json: qk_norm=", s.qk_norm, " qk_norm_whole=", s.qk_norm_whole,
           " cannot be expressed for family ", fi.model_type,
           " (HF: Qwen3 and Qwen3-MoE norm q/k per head, OLMoE and OLMo2 over the whole projection)");
  RT_CHECK(s.family == Family::granite || s.is_gemma() || (s.embedding_multiplier == 1.0 && s.residual_multiplier == 1.0 &&
                                           s.logits_scaling == 1.0 && s.attention_scale == 0.0),
           "[config] spec_to_config_json: multipliers (embedding ", s.embedding_multiplier, ", residual ",
           s.residual_multiplier, ", logits ", s.logits_scaling, ", attention ", s.attention_scale,
           ") cannot be expressed for family ", fi.model_type, " (HF: only Granite has them)");
  RT_CHECK(s.family == Family::smollm3 || s.rope_layers.empty(), "[config] spec_to_config_json: layers without RoPE ",
           "cannot be expressed for family ", fi.model_type, " (HF: only SmolLM3 has them)");
  RT_CHECK(s.post_norms == (s.family == Family::olmo2), "[config] spec_to_config_json: post_norms=", s.post_norms,
           " cannot be expressed for family ", fi.model_type, " (HF: only OLMo2 norms each branch's output)");
  RT_CHECK(s.is_moe() == moe_family, "[config] spec_to_config_json: ", s.moe.n_experts,
           " experts cannot be expressed for family ", fi.model_type);
  RT_CHECK(s.family != Family::mixtral || s.moe.norm_topk_prob,
           "[config] spec_to_config_json: Mixtral always renormalises the top-k probabilities");
  RT_CHECK((s.moe.shared_intermediate > 0) <= (s.family == Family::qwen2_moe),
           "[config] spec_to_config_json: a shared expert cannot be expressed for family ", fi.model_type,
           " (HF: Qwen2-MoE has one)");
  RT_CHECK(s.family == Family::qwen3_moe || s.family == Family::qwen2_moe || !s.is_moe() ||
               s.moe.expert_intermediate == s.intermediate,
           "[config] spec_to_config_json: ", fi.model_type, "'s experts are intermediate_size wide");
  s.validate("spec_to_config_json");

  ojson o;
  detail::config_write_dims(o, s, fi.architecture, fi.model_type);
  // transformers 4.x reads rope_theta + rope_scaling; 5.x reads rope_parameters
  // (and would let a non-null rope_scaling win, which then says the same).
  o["rope_theta"] = s.rope.theta;
  ojson rp;
  if (s.rope.scaling != RopeScaling::none) {
    o["rope_scaling"] = rope_scaling_json(s.rope);
    rp = rope_scaling_json(s.rope);
  } else {
    o["rope_scaling"] = nullptr;
    rp["rope_type"] = "default";
  }
  rp["rope_theta"] = s.rope.theta;
  o["rope_parameters"] = rp;
  if (s.family != Family::qwen2 && s.family != Family::qwen2_moe && s.family != Family::mixtral)
    o["attention_bias"] = false;
  if (s.family == Family::qwen2_moe) o["qkv_bias"] = s.qkv_bias;
  if (s.family == Family::llama || s.family == Family::granite || s.family == Family::smollm3) o["mlp_bias"] = false;
  if (s.family == Family::granite) {
    o["embedding_multiplier"] = s.embedding_multiplier;
    o["residual_multiplier"] = s.residual_multiplier;
    o["logits_scaling"] = s.logits_scaling;
    o["attention_multiplier"] = s.attention_softmax_scale();
  }
  if (s.family == Family::smollm3) {
    std::vector<int> layers(static_cast<size_t>(s.n_layers), 1);
    for (size_t i = 0; i < s.rope_layers.size() && i < layers.size(); ++i) layers[i] = s.rope_layers[i];
    o["no_rope_layers"] = layers;
    o["no_rope_layer_interval"] = 4;  // unread: the list is given
  }
  if (s.family == Family::mistral || s.family == Family::mixtral)
    o["sliding_window"] = s.sliding_window > 0 ? ojson(s.sliding_window) : ojson(nullptr);
  if (s.is_moe()) {
    if (s.family == Family::mixtral)
      o["num_local_experts"] = s.moe.n_experts;
    else
      o["num_experts"] = s.moe.n_experts;
    o["num_experts_per_tok"] = s.moe.top_k;
    if (s.family != Family::mixtral) o["norm_topk_prob"] = s.moe.norm_topk_prob;
    if (s.family == Family::qwen2_moe) o["shared_expert_intermediate_size"] = s.moe.shared_intermediate;
    if (s.family == Family::qwen3_moe || s.family == Family::qwen2_moe) {
      o["moe_intermediate_size"] = s.moe.expert_intermediate;
      o["decoder_sparse_step"] = 1;
      o["mlp_only_layers"] = ojson::array();
    }
    if (s.family == Family::mixtral) o["router_jitter_noise"] = 0.0;
    if (s.family == Family::olmoe) o["clip_qkv"] = nullptr;
    o["router_aux_loss_coef"] = s.moe.router_aux_loss_coef;
    o["output_router_logits"] = s.moe.output_router_logits;
  }
  if (s.family == Family::qwen2 || s.family == Family::qwen3 || s.family == Family::qwen3_moe ||
      s.family == Family::qwen2_moe || s.family == Family::smollm3) {
    o["use_sliding_window"] = false;
    o["sliding_window"] = nullptr;
    o["max_window_layers"] = s.n_layers;
  }
  detail::config_write_ids_and_dtype(o, s);
  o["attention_dropout"] = 0.0;
  o["use_cache"] = true;
  if (s.is_gemma()) detail::gemma_config_write(s, o);
  return o.dump(2) + "\n";
}

}  // namespace rt
