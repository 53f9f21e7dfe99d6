// Gemma, Gemma 2 and Gemma 3 (text) config.json fields, both dialects
// (transformers 4.x: rope_theta, rope_scaling, rope_local_base_freq,
// sliding_window_pattern; 5.x: rope_parameters per layer type, layer_types).
//
// What each family means (transformers' modeling_gemma*.py):
// - every RMSNorm scales by (1 + w) (norm_offset 1), the embedding's output by
//   sqrt(hidden_size) rounded to the embedding's dtype (fp32 here), the MLP is
//   GeGLU with gelu's tanh approximation; head_dim defaults to 256 and the
//   embeddings are tied unless tie_word_embeddings says otherwise.
// - Gemma 1: softmax scale 1/sqrt(head_dim); pre-norms as Llama.
// - Gemma 2: softmax scale query_pre_attn_scalar^-0.5, sandwich norms,
//   attention-logit and final-logit soft-capping (defaults 50 and 30), every
//   other layer (0, 2, ...) attends to a sliding window (default 4096).
// - Gemma 3: as Gemma 2 without soft-capping by default, q/k RMSNorms per
//   head, 5 of every 6 layers sliding (sliding_window_pattern), those rotating
//   with rope_local_base_freq (default 1e4) and the global ones with
//   rope_theta (default 1e6) and rope_scaling (linear for the 4B+ models).
// Gemma3ForConditionalGeneration (the multimodal 4B+ checkpoints): its nested
// text_config is read as a gemma3_text config (model/spec_multimodal.h).
#include "model/spec_gemma.h"


#include <cmath>

#include "core/error.h"
#include "model/spec_json.h"

namespace rt::detail {

namespace {

using json = nlohmann::json;

// A soft cap: absent -> dflt, null -> 0 (off).
double get_cap(const json& j, const std::string& source, const char* key, double dflt) {
  if (!j.contains(key)) return dflt;
  if (j.at(key).is_null()) return 0.0;
  return get_double(j, source, key, 0.0);
}

}  // namespace

void gemma_parse(const json& j, const std::string& source, ModelSpec& s, std::vector<std::string>* unsupported) {
  const bool g1 = s.family == Family::gemma, g3 = s.family == Family::gemma3;
  s.norm_offset = 1.0;
  // sqrt(hidden_size) as the embedding's dtype holds it (HF: torch.tensor(hidden**0.5, dtype))
  s.embedding_multiplier = static_cast<float>(std::sqrt(static_cast<double>(s.hidden)));
  // The activation: Gemma 1 names it hidden_act (4.x also hidden_activation,
  // which wins when set; the legacy "gelu" means the tanh approximation),
  // Gemma 2/3 hidden_activation.
  std::string act = has(j, "hidden_activation") ? get_string(j, source, "hidden_activation", "")
                    : g1                        ? get_string(j, source, "hidden_act", "gelu_pytorch_tanh")
                                                : "gelu_pytorch_tanh";
  if (g1 && act == "gelu") act = "gelu_pytorch_tanh";
  if (act == "gelu_pytorch_tanh")
    s.mlp_act = MlpAct::gelu_tanh;
  else
    unsupported->push_back(cat(has(j, "hidden_activation") ? "hidden_activation" : "hidden_act", " \"", act,
                               "\" is not supported for ", s.architecture,
                               "; supported: gelu_pytorch_tanh (GeGLU with gelu's tanh approximation)"));
  if (has(j, "attention_bias") && j.at("attention_bias").is_boolean() && j.at("attention_bias").get<bool>())
    unsupported->push_back(cat("attention_bias true is not supported for ", s.architecture, "; supported: false"));
  if (g1) return;

  s.sandwich_norms = true;
  s.qk_norm = g3;
  const double qpas = get_double(j, source, "query_pre_attn_scalar", 256.0);
  if (!(qpas > 0.0) || !std::isfinite(qpas))
    unsupported->push_back(cat("query_pre_attn_scalar ", qpas, " must be positive"));
  else
    s.attention_scale = 1.0 / std::sqrt(qpas);
  s.attn_softcap = get_cap(j, source, "attn_logit_softcapping", g3 ? 0.0 : 50.0);
  s.final_softcap = get_cap(j, source, "final_logit_softcapping", g3 ? 0.0 : 30.0);
  if (s.attn_softcap < 0.0 || s.final_softcap < 0.0)
    unsupported->push_back("attn_logit_softcapping and final_logit_softcapping must be positive or null");
  if (has(j, "use_bidirectional_attention") && j.at("use_bidirectional_attention").is_boolean() &&
      j.at("use_bidirectional_attention").get<bool>())
    unsupported->push_back("use_bidirectional_attention true is not supported; supported: false (causal)");

  // ---- sliding-window layers: layer_types, else the pattern (Gemma 2: every other layer)
  const int64_t window = j.contains("sliding_window") && j.at("sliding_window").is_null()
                             ? 0
                             : get_int(j, source, "sliding_window", 4096);
  if (window < 0) unsupported->push_back(cat("sliding_window ", window, " must be positive or null"));
  std::vector<uint8_t> local;
  if (auto lt = layer_types_read(j, source, s.n_layers, unsupported)) {
    local = std::move(*lt);
  } else {
    const int64_t every = g3 ? get_int(j, source, "sliding_window_pattern", 6) : 2;
    if (every <= 0) unsupported->push_back(cat("sliding_window_pattern ", every, " must be positive"));
    for (int64_t i = 0; i < s.n_layers && every > 0; ++i) local.push_back((i + 1) % every != 0 ? 1 : 0);
  }
  if (window > 0) {
    s.local_window = window;
    s.local_layers = local;
  }

  if (!g3) return;
  // ---- Gemma 3's two RoPEs. 5.x: rope_parameters {"full_attention": {...},
  // "sliding_attention": {...}}; 4.x: rope_theta + rope_scaling for the global
  // layers, rope_local_base_freq for the local ones. A non-null rope_scaling
  // updates the global one (as 5.x reads it).
  const double global_theta = get_double(j, source, "rope_theta", 1e6);
  const double local_theta = get_double(j, source, "rope_local_base_freq", 1e4);
  s.rope = RopeConfig{};
  s.rope.theta = global_theta;
  s.rope_local = RopeConfig{};
  s.rope_local.theta = local_theta;
  if (has(j, "rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    if (!rp.is_object()) wrong(source, "rope_parameters", "an object", rp);
    for (auto it = rp.begin(); it != rp.end(); ++it) {
      if (it.key() == "full_attention" && it->is_object())
        spec_rope_read(*it, "rope_parameters.full_attention", source, global_theta, &s.rope, unsupported);
      else if (it.key() == "sliding_attention" && it->is_object())
        spec_rope_read(*it, "rope_parameters.sliding_attention", source, local_theta, &s.rope_local, unsupported);
      else if (!it->is_null())
        unsupported->push_back(cat("rope_parameters.", it.key(),
                                   " is not supported for Gemma 3; give full_attention and sliding_attention"));
    }
  }
  if (has(j, "rope_scaling")) {
    if (!j.at("rope_scaling").is_object()) wrong(source, "rope_scaling", "an object or null", j.at("rope_scaling"));
    if (!j.at("rope_scaling").empty())
      spec_rope_read(j.at("rope_scaling"), "rope_scaling", source, s.rope.theta, &s.rope, unsupported);
  }
  s.rope_local_on = true;
}

ModelSpec gemma_preset(ModelSpec s, double query_pre_attn_scalar, int64_t window, int64_t global_every,
                       double attn_softcap, double final_softcap, double local_theta, double linear_factor) {
  const bool g1 = s.family == Family::gemma, g3 = s.family == Family::gemma3;
  s.norm_offset = 1.0;
  s.embedding_multiplier = static_cast<float>(std::sqrt(static_cast<double>(s.hidden)));
  s.mlp_act = MlpAct::gelu_tanh;
  if (g1) return s;
  s.sandwich_norms = true;
  s.qk_norm = g3;
  s.attention_scale = 1.0 / std::sqrt(query_pre_attn_scalar);
  s.attn_softcap = attn_softcap;
  s.final_softcap = final_softcap;
  s.local_window = window;
  for (int64_t i = 0; i < s.n_layers; ++i) s.local_layers.push_back((i + 1) % global_every != 0 ? 1 : 0);
  if (g3) {
    s.rope_local_on = true;
    s.rope_local = RopeConfig{};
    s.rope_local.theta = local_theta;
    if (linear_factor != 1.0) {
      s.rope.scaling = RopeScaling::linear;
      s.rope.factor = linear_factor;
    }
  }
  return s;
}

void gemma_config_write(const ModelSpec& s, nlohmann::ordered_json& o) {
  using ojson = nlohmann::ordered_json;
  const bool g1 = s.family == Family::gemma, g3 = s.family == Family::gemma3;
  RT_CHECK(s.norm_offset == 1.0 && s.mlp_act == MlpAct::gelu_tanh && s.sandwich_norms == !g1 &&
               s.qk_norm == g3 && !s.qk_norm_whole && !s.qkv_bias && !s.post_norms && !s.is_moe() &&
               s.rope_layers.empty() && s.residual_multiplier == 1.0 && s.logits_scaling == 1.0 &&
               s.embedding_multiplier == static_cast<float>(std::sqrt(static_cast<double>(s.hidden))) &&
               s.rope_local_on == g3 && (!g1 || (s.attention_scale == 0.0 && s.local_layers.empty() &&
                                                 s.attn_softcap == 0.0 && s.final_softcap == 0.0)),
           "[config] spec_to_config_json: this ", s.architecture, " spec has settings ", family_name(s.family),
           "'s config.json cannot express");
  auto rope_obj = [](const RopeConfig& r) {
    ojson p;
    if (r.scaling == RopeScaling::linear) {
      p["rope_type"] = "linear";
      p["factor"] = r.factor;
    } else {
      RT_CHECK(r.scaling == RopeScaling::none, "[config] spec_to_config_json: Gemma's RoPE is default or linear");
      p["rope_type"] = "default";
    }
    p["rope_theta"] = r.theta;
    return p;
  };
  if (g1) {
    o["hidden_act"] = "gelu_pytorch_tanh";
    o.erase("hidden_activation");
  } else {
    o.erase("hidden_act");
    o["hidden_activation"] = "gelu_pytorch_tanh";
    // query_pre_attn_scalar back from the scale (an integer in every published config)
    const double q = 1.0 / (s.attention_scale * s.attention_scale);
    o["query_pre_attn_scalar"] =
        std::fabs(q - std::round(q)) < 1e-9 * q ? ojson(static_cast<int64_t>(std::round(q))) : ojson(q);
    o["attn_logit_softcapping"] = s.attn_softcap > 0.0 ? ojson(s.attn_softcap) : ojson(nullptr);
    o["final_logit_softcapping"] = s.final_softcap > 0.0 ? ojson(s.final_softcap) : ojson(nullptr);
    o["sliding_window"] = s.local_window > 0 ? ojson(s.local_window) : ojson(nullptr);
    std::vector<std::string> types;
    for (int64_t i = 0; i < s.n_layers; ++i)
      types.push_back(s.layer_window(i) > 0 ? "sliding_attention" : "full_attention");
    o["layer_types"] = types;
  }
  if (g3) {
    o["rope_theta"] = s.rope.theta;
    o["rope_local_base_freq"] = s.rope_local.theta;
    ojson scaling = rope_obj(s.rope);  // 4.x: the global layers' scaling, without the theta
    scaling.erase("rope_theta");
    o["rope_scaling"] = s.rope.scaling == RopeScaling::none ? ojson(nullptr) : scaling;
    RT_CHECK(s.rope_local.scaling == RopeScaling::none,
             "[config] spec_to_config_json: Gemma 3's local RoPE has no scaling in transformers 4.x");
    ojson rp;
    rp["full_attention"] = rope_obj(s.rope);
    rp["sliding_attention"] = rope_obj(s.rope_local);
    o["rope_parameters"] = rp;
  }
}

}  // namespace rt::detail
