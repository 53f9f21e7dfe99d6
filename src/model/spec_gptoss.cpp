// gpt-oss config.json fields, both dialects (transformers 4.x: rope_theta +
// rope_scaling; 5.x: rope_parameters, swiglu_alpha), as GptOssConfig and
// modeling_gpt_oss.py mean them:
// - q, k, v and o projections with biases (attention_bias, default true);
//   a learned sink logit per head in every attention softmax;
// - layer_types (default: even layers "sliding_attention", odd ones
//   "full_attention"), the sliding ones attending to the sliding_window
//   (default 128) most recent keys, the token itself included;
// - YaRN RoPE (default: factor 32, beta_fast 32, beta_slow 1, truncate false,
//   original_max_position_embeddings 4096, rope_theta 150000);
// - every layer an MoE layer: num_local_experts (default 128) experts of
//   width intermediate_size, num_experts_per_tok (default 4) per token, the
//   router a linear with bias, the routing weights the softmax of the top-k
//   logits; experts with biases and the clamped SwiGLU (swiglu_limit default
//   7, swiglu_alpha default 1.702: transformers 4.x hard-codes that alpha).
// The hub checkpoints' MXFP4 expert tensors are the loader's business
// (io/state_tensors.cpp); their quantization_config does not change the math.
#include "model/spec_gptoss.h"

#include <cmath>

#include "core/error.h"
#include "model/spec_gemma.h"  // detail::spec_rope_read
#include "model/spec_json.h"

namespace rt {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

using detail::get_bool;
using detail::get_double;
using detail::get_int;
using detail::has;
using detail::wrong;

// GptOssConfig's RoPE when neither rope_scaling nor rope_parameters is given.
RopeConfig default_yarn(double theta) {
  RopeConfig r;
  r.theta = theta;
  r.scaling = RopeScaling::yarn;
  r.factor = 32.0;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  r.truncate = false;
  r.original_max_positions = 4096;
  r.attention_factor = 0.1 * std::log(32.0) + 1.0;
  return r;
}

}  // namespace

ModelSpec spec_gptoss_finish(const json& j, const std::string& source, ModelSpec s,
                             std::vector<std::string> unsupported) {
  // ---- attention: biases on q, k, v and o; sinks
  const bool bias = get_bool(j, source, "attention_bias", true);
  s.qkv_bias = bias;
  s.o_bias = bias;
  s.attn_sinks = true;

  // ---- RoPE: a non-null rope_scaling (4.x) wins over rope_parameters (5.x), as spec.cpp's rule
  const double top_theta = get_double(j, source, "rope_theta", 150000.0);
  if (has(j, "rope_scaling") && !j.at("rope_scaling").is_object())
    wrong(source, "rope_scaling", "an object", j.at("rope_scaling"));
  if (has(j, "rope_parameters") && !j.at("rope_parameters").is_object())
    wrong(source, "rope_parameters", "an object", j.at("rope_parameters"));
  if (has(j, "rope_scaling") && !j.at("rope_scaling").empty())
    detail::spec_rope_read(j.at("rope_scaling"), "rope_scaling", source, top_theta, &s.rope, &unsupported, true);
  else if (has(j, "rope_parameters") && !j.at("rope_parameters").empty())
    detail::spec_rope_read(j.at("rope_parameters"), "rope_parameters", source, top_theta, &s.rope, &unsupported, true);
  else
    s.rope = default_yarn(top_theta);
  // gpt-oss's RoPE is YaRN or plain; the other scalings read above are refused (its config writer has no others)
  if (s.rope.scaling != RopeScaling::none && s.rope.scaling != RopeScaling::yarn)
    unsupported.push_back("a RoPE scaling other than yarn or default is not supported for GptOssForCausalLM");
  if (has(j, "partial_rotary_factor") && get_double(j, source, "partial_rotary_factor", 1.0) != 1.0)
    unsupported.push_back("partial_rotary_factor != 1 is not supported; RoPE must rotate the whole head");

  // ---- sliding-window layers
  const int64_t window =
      j.contains("sliding_window") && j.at("sliding_window").is_null() ? 0 : get_int(j, source, "sliding_window", 128);
  std::vector<uint8_t> local;
  if (auto lt = detail::layer_types_read(j, source, s.n_layers, &unsupported)) {
    local = std::move(*lt);
  } else {
    for (int64_t i = 0; i < s.n_layers; ++i) local.push_back((i + 1) % 2 != 0 ? 1 : 0);
  }
  bool any_local = false;
  for (uint8_t l : local) any_local = any_local || l;
  if (any_local && window <= 0)
    unsupported.push_back(cat("sliding_window ", window, " with \"sliding_attention\" layers; give a positive window"));
  if (any_local && window > 0) {
    s.local_window = window;
    s.local_layers = std::move(local);
  }

  // ---- experts
  MoeConfig& m = s.moe;
  if (has(j, "num_experts") && has(j, "num_local_experts") &&
      get_int(j, source, "num_experts", 0) != get_int(j, source, "num_local_experts", 0))
    unsupported.push_back("num_experts and num_local_experts disagree; keep one of them");
  m.n_experts = has(j, "num_local_experts") ? get_int(j, source, "num_local_experts", 128)
                                            : get_int(j, source, "num_experts", 128);
  m.top_k = get_int(j, source, "num_experts_per_tok", get_int(j, source, "experts_per_token", 4));
  m.expert_intermediate = s.intermediate;
  m.norm_topk_prob = false;
  m.router_bias = true;
  m.topk_softmax = true;
  m.expert_bias = true;
  m.glu_limit = get_double(j, source, "swiglu_limit", 7.0);
  m.glu_alpha = get_double(j, source, "swiglu_alpha", 1.702);
  m.router_aux_loss_coef = get_double(j, source, "router_aux_loss_coef", 0.001);
  m.output_router_logits = get_bool(j, source, "output_router_logits", false);
  if (m.output_router_logits)
    unsupported.push_back(
        "output_router_logits true (gpt-oss's load-balancing loss over the softmax of all router logits) is not "
        "supported; supported: false");
  if (!(m.glu_limit > 0.0) || !std::isfinite(m.glu_limit))
    unsupported.push_back(cat("swiglu_limit ", m.glu_limit, " must be positive and finite"));
  if (!std::isfinite(m.glu_alpha)) unsupported.push_back(cat("swiglu_alpha ", m.glu_alpha, " must be finite"));

  return detail::spec_finish(source, std::move(s), unsupported);
}

void gptoss_validate(const ModelSpec& s, std::vector<std::string>* p) {
  const RopeConfig& r = s.rope;
  if (r.scaling == RopeScaling::yarn) {
    if (!(r.factor > 0.0) || !std::isfinite(r.factor))
      p->push_back(cat("yarn factor must be positive, found ", r.factor));
    if (r.original_max_positions <= 0)
      p->push_back(cat("yarn original_max_position_embeddings must be positive, found ", r.original_max_positions));
    if (!(r.attention_factor > 0.0) || !std::isfinite(r.attention_factor))
      p->push_back(cat("yarn attention_factor must be positive and finite, found ", r.attention_factor));
    if (!(r.beta_fast > 0.0) || !(r.beta_slow > 0.0))
      p->push_back(cat("yarn beta_fast ", r.beta_fast, " and beta_slow ", r.beta_slow, " must be positive"));
  }
  if (r.scaling == RopeScaling::yarn && s.family != Family::gpt_oss)
    p->push_back("YaRN RoPE is supported for GptOssForCausalLM only");
  if (s.family == Family::gpt_oss) {
    if (!s.is_moe()) p->push_back("GptOssForCausalLM needs num_local_experts >= 1");
    if (s.qkv_bias != s.o_bias) p->push_back("GptOssForCausalLM's attention_bias sets the q, k, v and o biases alike");
    return;
  }
  if (s.attn_sinks || s.o_bias || s.moe.router_bias || s.moe.topk_softmax || s.moe.expert_bias ||
      s.moe.glu_limit != 0.0)
    p->push_back(
        "attention sinks, o_proj biases, router and expert biases, top-k softmax routing and the clamped "
        "SwiGLU are supported for GptOssForCausalLM only");
}

std::string spec_gptoss_config_json(const ModelSpec& s) {
  RT_CHECK(s.family == Family::gpt_oss && s.is_moe() && s.attn_sinks && s.moe.router_bias && s.moe.topk_softmax &&
               s.moe.expert_bias && s.moe.glu_limit > 0.0 && !s.moe.norm_topk_prob && s.moe.shared_intermediate == 0,
           "[config] spec_to_config_json: GptOssForCausalLM always has sinks, router and expert biases, top-k "
           "softmax routing and the clamped SwiGLU, without a shared expert");
  RT_CHECK(!s.qk_norm && !s.post_norms && s.rope_layers.empty() && s.embedding_multiplier == 1.0 &&
               s.residual_multiplier == 1.0 && s.logits_scaling == 1.0 && s.attention_scale == 0.0 &&
               s.norm_offset == 0.0 && s.mlp_act == MlpAct::silu && !s.sandwich_norms && s.attn_softcap == 0.0 &&
               s.final_softcap == 0.0 && !s.rope_local_on && s.sliding_window == 0,
           "[config] spec_to_config_json: GptOssForCausalLM has no q/k norms, post-branch norms, NoPE layers, "
           "multipliers or Gemma features");
  RT_CHECK(s.rope.scaling == RopeScaling::none || s.rope.scaling == RopeScaling::yarn,
           "[config] spec_to_config_json: GptOssForCausalLM takes default or yarn RoPE");
  RT_CHECK(s.moe.expert_intermediate == s.intermediate,
           "[config] spec_to_config_json: gpt-oss's experts are intermediate_size wide");
  s.validate("spec_to_config_json");
  const RopeConfig& r = s.rope;
  ojson o;
  detail::config_write_dims(o, s, "GptOssForCausalLM", "gpt_oss");
  o["attention_bias"] = s.qkv_bias;
  // 4.x reads rope_theta + rope_scaling, 5.x rope_parameters (a non-null rope_scaling says the same)
  o["rope_theta"] = r.theta;
  ojson rp;
  if (r.scaling == RopeScaling::yarn) {
    rp["rope_type"] = "yarn";
    rp["factor"] = r.factor;
    rp["beta_fast"] = r.beta_fast;
    rp["beta_slow"] = r.beta_slow;
    rp["truncate"] = r.truncate;
    rp["original_max_position_embeddings"] = r.original_max_positions;
    rp["attention_factor"] = r.attention_factor;
    o["rope_scaling"] = rp;
  } else {
    rp["rope_type"] = "default";
    o["rope_scaling"] = nullptr;
  }
  rp["rope_theta"] = r.theta;
  o["rope_parameters"] = rp;
  // the window of the sliding layers; layer_types says which they are (null: none)
  o["sliding_window"] = s.local_window > 0 ? ojson(s.local_window) : ojson(nullptr);
  std::vector<std::string> types;
  for (int64_t i = 0; i < s.n_layers; ++i)
    types.push_back(s.layer_window(i) > 0 ? "sliding_attention" : "full_attention");
  o["layer_types"] = types;
  o["num_local_experts"] = s.moe.n_experts;
  o["num_experts_per_tok"] = s.moe.top_k;
  o["experts_per_token"] = s.moe.top_k;  // the hub configs carry both names
  o["swiglu_limit"] = s.moe.glu_limit;
  o["swiglu_alpha"] = s.moe.glu_alpha;
  o["router_aux_loss_coef"] = s.moe.router_aux_loss_coef;
  o["output_router_logits"] = false;
  o["attention_dropout"] = 0.0;
  detail::config_write_ids_and_dtype(o, s);
  o["use_cache"] = true;
  return o.dump(2) + "\n";
}

}  // namespace rt
