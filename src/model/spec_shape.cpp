// What a ModelSpec implies, apart from reading and writing config.json
// (spec.cpp): parameter counts, per-layer attention windows and spans, the
// rotary width and softmax scale, and validate()'s consistency checks.
#include "model/spec.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/spec_gptoss.h"
#include "model/spec_phi.h"

namespace rt {

namespace {
// A layer's attention, norms and (Qwen2-MoE) shared expert: all but its MLP
// or its routed experts.
int64_t params_attn_norms(const ModelSpec& s) {
  int64_t attn = s.hidden * s.q_dim() + 2 * s.hidden * s.kv_dim() + s.q_dim() * s.hidden;
  if (s.qkv_bias) attn += s.q_dim() + 2 * s.kv_dim();
  if (s.o_bias) attn += s.hidden;
  if (s.attn_sinks) attn += s.n_heads;
  if (s.qk_norm) attn += s.qk_norm_whole ? s.q_dim() + s.kv_dim() : 2 * s.head_dim;
  const int64_t shared = s.moe.shared_intermediate > 0 ? 3 * s.hidden * s.moe.shared_intermediate + s.hidden : 0;
  return attn + (s.sandwich_norms ? 4 : 2) * s.hidden + shared;
}
}  // namespace

int64_t ModelSpec::layer_window(int64_t layer) const {
  if (local_layers.empty()) return 0;
  RT_CHECK(layer >= 0 && layer < static_cast<int64_t>(local_layers.size()), "[model] internal: layer ", layer,
           " has no attention type (the model has ", local_layers.size(), " layers)");
  return local_layers[static_cast<size_t>(layer)] ? local_window : 0;
}

double ModelSpec::attention_span(int64_t T) const {
  if (local_layers.empty() || n_layers <= 0 || T <= 0) return static_cast<double>(T);
  const double t = static_cast<double>(T);
  double sum = 0.0;
  for (int64_t i = 0; i < n_layers; ++i) {
    const int64_t w = layer_window(i);
    if (w <= 0 || w >= T) {
      sum += t;
      continue;
    }
    const double wd = static_cast<double>(w);
    sum += 2.0 * (wd * (wd + 1.0) / 2.0 + (t - wd) * wd) / t;
  }
  return sum / static_cast<double>(n_layers);
}

bool ModelSpec::layer_uses_rope(int64_t layer) const {
  if (rope_layers.empty()) return true;
  RT_CHECK(layer >= 0 && layer < static_cast<int64_t>(rope_layers.size()), "[model] internal: layer ", layer,
           " has no RoPE setting (the model has ", rope_layers.size(), " layers)");
  return rope_layers[static_cast<size_t>(layer)] != 0;
}

int64_t ModelSpec::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

double ModelSpec::attention_softmax_scale() const {
  return attention_scale > 0.0 ? attention_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

std::string ModelSpec::max_sequence_why() const {
  if (max_sequence() < max_positions)
    return cat("sliding_window (", sliding_window,
               "; longer sequences would need windowed attention, which ramtrain does not implement)");
  return cat("max_position_embeddings (", max_positions, ")");
}

namespace {
// The router's parameters per expert (gpt-oss: with its bias).
int64_t params_router_row(const ModelSpec& s) { return s.hidden + (s.moe.router_bias ? 1 : 0); }
}  // namespace

int64_t ModelSpec::params_expert() const {
  if (!is_moe()) return 0;
  const int64_t fe = moe.expert_intermediate;
  return 3 * hidden * fe + (moe.expert_bias ? 2 * fe + hidden : 0);
}

int64_t ModelSpec::params_per_layer() const {
  if (is_moe()) return params_attn_norms(*this) + moe.n_experts * (params_router_row(*this) + params_expert());
  return params_attn_norms(*this) + 3 * hidden * intermediate;
}

int64_t ModelSpec::active_params_per_layer() const {
  if (!is_moe()) return params_per_layer();
  return params_attn_norms(*this) + moe.n_experts * params_router_row(*this) + moe.top_k * params_expert();
}

int64_t ModelSpec::params_active() const {
  return params_embedding() + n_layers * active_params_per_layer() + hidden + params_lm_head();
}

int64_t ModelSpec::params_embedding() const { return vocab * hidden; }
int64_t ModelSpec::params_lm_head() const { return tie_embeddings ? 0 : vocab * hidden; }
int64_t ModelSpec::params_total() const {
  return params_embedding() + n_layers * params_per_layer() + hidden /* final norm */ + params_lm_head();
}

void ModelSpec::validate(const std::string& source) const {
  std::vector<std::string> p;
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) p.push_back(cat(name, " must be positive, found ", v));
  };
  positive("hidden_size", hidden);
  positive("intermediate_size", intermediate);
  positive("num_hidden_layers", n_layers);
  positive("num_attention_heads", n_heads);
  positive("num_key_value_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab);
  positive("max_position_embeddings", max_positions);
  if (n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads != 0)
    p.push_back(cat("num_attention_heads ", n_heads, " is not a multiple of num_key_value_heads ", n_kv_heads,
                    " (grouped-query attention needs whole groups)"));
  if (head_dim > 0 && head_dim % 2 != 0) p.push_back(cat("head_dim ", head_dim, " must be even (RoPE rotates pairs)"));
  if (!(rms_eps > 0.0) || !std::isfinite(rms_eps)) p.push_back(cat("rms_norm_eps must be positive, found ", rms_eps));
  if (!(rope.theta > 0.0) || !std::isfinite(rope.theta))
    p.push_back(cat("rope_theta must be positive, found ", rope.theta));
  if (rope.scaling == RopeScaling::llama3) {
    if (!(rope.factor > 0.0)) p.push_back(cat("llama3 rope factor must be positive, found ", rope.factor));
    if (!(rope.low_freq_factor > 0.0))
      p.push_back(cat("llama3 low_freq_factor must be positive, found ", rope.low_freq_factor));
    if (!(rope.high_freq_factor > rope.low_freq_factor))
      p.push_back(cat("llama3 high_freq_factor ", rope.high_freq_factor, " must exceed low_freq_factor ",
                      rope.low_freq_factor));
    if (rope.original_max_positions <= 0)
      p.push_back(cat("llama3 original_max_position_embeddings must be positive, found ", rope.original_max_positions));
  }
  rope_validate(*this, &p);  // partial rotary, LongRoPE (spec_phi.cpp)
  gptoss_validate(*this, &p);  // YaRN, sinks, biases, clamped SwiGLU (spec_gptoss.cpp)
  if (is_moe()) {
    if (moe.top_k < 1 || moe.top_k > moe.n_experts)
      p.push_back(cat("num_experts_per_tok ", moe.top_k, " must be in [1, num_experts = ", moe.n_experts, "]"));
    if (moe.expert_intermediate <= 0)
      p.push_back(cat("the expert width (moe_intermediate_size or intermediate_size) must be positive, found ",
                      moe.expert_intermediate));
    if (moe.shared_intermediate < 0)
      p.push_back(cat("shared_expert_intermediate_size must be >= 0, found ", moe.shared_intermediate));
    if (!(moe.router_aux_loss_coef >= 0.0) || !std::isfinite(moe.router_aux_loss_coef))
      p.push_back(cat("router_aux_loss_coef must be finite and >= 0, found ", moe.router_aux_loss_coef));
  }
  if (moe.n_experts < 0) p.push_back(cat("num_experts must be >= 0, found ", moe.n_experts));
  for (const auto& [name, v] : {std::pair<const char*, double>{"embedding_multiplier", embedding_multiplier},
                                {"residual_multiplier", residual_multiplier},
                                {"logits_scaling", logits_scaling}})
    if (!(v > 0.0) || !std::isfinite(v)) p.push_back(cat(name, " must be positive and finite, found ", v));
  if (!(attention_scale >= 0.0) || !std::isfinite(attention_scale))
    p.push_back(cat("attention_multiplier must be positive and finite, found ", attention_scale));
  if (is_moe() &&
      (embedding_multiplier != 1.0 || residual_multiplier != 1.0 || logits_scaling != 1.0 || attention_scale != 0.0))
    p.push_back("Granite's multipliers with mixture-of-experts layers are not supported");
  if (!rope_layers.empty() && static_cast<int64_t>(rope_layers.size()) != n_layers)
    p.push_back(cat("no_rope_layers has ", rope_layers.size(), " entries for ", n_layers,
                    " layers; give one 0 or 1 per layer"));
  for (uint8_t r : rope_layers)
    if (r > 1) p.push_back(cat("no_rope_layers holds ", int(r), "; each entry is 0 (no RoPE) or 1 (RoPE)"));
  if (!local_layers.empty() && static_cast<int64_t>(local_layers.size()) != n_layers)
    p.push_back(cat("layer_types has ", local_layers.size(), " entries for ", n_layers, " layers"));
  if (rope.scaling == RopeScaling::linear && !(rope.factor > 0.0))
    p.push_back(cat("linear rope factor must be positive, found ", rope.factor));
  if ((norm_offset != 0.0 || sandwich_norms || attn_softcap != 0.0 || final_softcap != 0.0 ||
       (!local_layers.empty() && family != Family::gpt_oss) || mlp_act != MlpAct::silu) &&
      (is_moe() || post_norms))
    p.push_back("Gemma's norms, soft-capping, windows and GeGLU are supported with dense pre-norm layers only");
  if (post_norms && is_moe())
    p.push_back("post-branch norms (OLMo2) with mixture-of-experts layers are not supported; use a dense MLP");
  // Sizes beyond any model (and beyond int64 products): the parameter count
  // in double, before params_total's integer maths could overflow.
  if (p.empty()) {
    const double h = static_cast<double>(hidden), q = static_cast<double>(n_heads) * static_cast<double>(head_dim),
                 kv = static_cast<double>(n_kv_heads) * static_cast<double>(head_dim);
    const double mlp = is_moe() ? static_cast<double>(moe.n_experts) * 3.0 * h * static_cast<double>(moe.expert_intermediate) +
                                      3.0 * h * static_cast<double>(std::max<int64_t>(moe.shared_intermediate, 0))
                                : 3.0 * h * static_cast<double>(intermediate);
    const double total = static_cast<double>(n_layers) * (h * (2.0 * q + 2.0 * kv) + mlp) + 2.0 * static_cast<double>(vocab) * h;
    if (!(total < 1e14))
      p.push_back(cat("the sizes give about ", total, " parameters (hidden_size ", hidden, ", intermediate_size ",
                      intermediate, ", num_hidden_layers ", n_layers, ", vocab_size ", vocab,
                      "): beyond any model; check these values"));
  }
  if (bos_id < -1 || (vocab > 0 && bos_id >= vocab))
    p.push_back(cat("bos_token_id ", bos_id, " is outside the vocabulary [0, ", vocab, ")"));
  for (int64_t e : eos_ids)
    if (e < 0 || (vocab > 0 && e >= vocab))
      p.push_back(cat("eos_token_id ", e, " is outside the vocabulary [0, ", vocab, ")"));
  if (p.empty()) return;
  std::string msg =
      cat("[config] ", source, ": inconsistent model shape (", p.size(), " problem", p.size() == 1 ? "" : "s", "):");
  for (const auto& e : p) msg += "\n  - " + e;
  throw Error(msg);
}

}  // namespace rt
