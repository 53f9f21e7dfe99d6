// HostState's views for the templates: the whole model's weights (the fp32
// master in place, a shadow or paged master decoded unit by unit, or a
// caller's per-unit copy) and gradients, as ModelWeightsT / ModelGrads.
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "state/host_state.h"
#include "state/state_tier.h"

namespace rt {

namespace {

template <class P>
BlockWeightsT<float> block_view(const ModelSpec& s, int64_t i, P get) {
  auto name = [&](const char* suffix) { return cat("model.layers.", i, ".", suffix); };
  BlockWeightsT<float> w{};
  w.layer = i;
  // OLMo2 (post_norms) names each norm after the branch it follows (model/weight_map.h)
  w.attn_norm = get(name(s.post_norms ? "post_attention_layernorm.weight" : "input_layernorm.weight"));
  w.q_proj = get(name("self_attn.q_proj.weight"));
  w.k_proj = get(name("self_attn.k_proj.weight"));
  w.v_proj = get(name("self_attn.v_proj.weight"));
  if (s.qkv_bias) {
    w.q_bias = get(name("self_attn.q_proj.bias"));
    w.k_bias = get(name("self_attn.k_proj.bias"));
    w.v_bias = get(name("self_attn.v_proj.bias"));
  }
  if (s.qk_norm) {
    w.q_norm = get(name("self_attn.q_norm.weight"));
    w.k_norm = get(name("self_attn.k_norm.weight"));
  }
  w.o_proj = get(name("self_attn.o_proj.weight"));
  if (s.o_bias) w.o_bias = get(name("self_attn.o_proj.bias"));  // gpt-oss
  if (s.attn_sinks) w.sinks = get(name("self_attn.sinks"));
  if (s.sandwich_norms) {  // Gemma 2/3 (model/weight_map.h)
    w.attn_post_norm = get(name("post_attention_layernorm.weight"));
    w.mlp_norm = get(name("pre_feedforward_layernorm.weight"));
    w.mlp_post_norm = get(name("post_feedforward_layernorm.weight"));
  } else {
    w.mlp_norm = get(name(s.post_norms ? "post_feedforward_layernorm.weight" : "post_attention_layernorm.weight"));
  }
  if (s.is_moe()) {  // the names from the weight map (they differ per family)
    for (const WeightEntry& e : layer_weight_map(s, i)) {
      if (e.kind == WeightKind::router) w.router = get(e.name);
      if (e.kind == WeightKind::expert_gate) w.expert_gate.push_back(get(e.name));
      if (e.kind == WeightKind::expert_up) w.expert_up.push_back(get(e.name));
      if (e.kind == WeightKind::expert_down) w.expert_down.push_back(get(e.name));
      if (e.kind == WeightKind::gate_proj) w.gate_proj = get(e.name);  // Qwen2-MoE's shared expert
      if (e.kind == WeightKind::up_proj) w.up_proj = get(e.name);
      if (e.kind == WeightKind::down_proj) w.down_proj = get(e.name);
      if (e.kind == WeightKind::shared_expert_gate) w.shared_expert_gate = get(e.name);
      if (e.kind == WeightKind::router_bias) w.router_bias = get(e.name);  // gpt-oss
      if (e.kind == WeightKind::expert_gate_bias) w.expert_gate_bias.push_back(get(e.name));
      if (e.kind == WeightKind::expert_up_bias) w.expert_up_bias.push_back(get(e.name));
      if (e.kind == WeightKind::expert_down_bias) w.expert_down_bias.push_back(get(e.name));
    }
    return w;
  }
  w.gate_proj = get(name("mlp.gate_proj.weight"));
  w.up_proj = get(name("mlp.up_proj.weight"));
  w.down_proj = get(name("mlp.down_proj.weight"));
  return w;
}

}  // namespace

void HostState::decode_all() const {
  const bool weights_paged = tier_ && tier_->plan().weights_paged;
  if (master_storage() == MasterStorage::fp32 && !weights_paged) return;
  decoded_.resize(units_.size());
  auto decode = [&](size_t i) {
    const StateUnit& u = units_[i];
    if (decoded_[i].n != static_cast<size_t>(u.numel))
      decoded_[i] = HostBuffer(static_cast<size_t>(u.numel), cat("the decoded fp32 master of ", u.name));
    u.read_master(0, u.numel, decoded_[i].p);
  };
  std::vector<size_t> all(units_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (tier_ && (master_storage() == MasterStorage::split || weights_paged))  // paged: each read in, clean
    tier_->for_each(all, decode, false);
  else
    for (size_t i : all) decode(i);
}

ModelWeightsT<float> HostState::weights() const {
  decode_all();
  return weights_of([&](const std::string& n) -> const float* { return view(n); });
}

ModelWeightsT<float> HostState::weights_in(const std::vector<HostBuffer>& per_unit) const {
  RT_CHECK(per_unit.size() == units_.size(), "[host] internal: ", per_unit.size(), " weight buffers for ",
           units_.size(), " units");
  return weights_of([&](const std::string& n) -> const float* {
    const Loc& l = locate(n);
    RT_CHECK(per_unit[l.unit].n == static_cast<size_t>(units_[l.unit].numel), "[host] internal: unit ",
             units_[l.unit].name, "'s weight copy holds ", per_unit[l.unit].n, " floats, not ", units_[l.unit].numel);
    return per_unit[l.unit].p + l.offset;
  });
}

ModelWeightsT<float> HostState::weights_of(const std::function<const float*(const std::string&)>& get) const {
  ModelWeightsT<float> w;
  w.embed = get("model.embed_tokens.weight");
  for (int64_t i = 0; i < spec_.n_layers; ++i) w.layers.push_back(block_view(spec_, i, get));
  w.final_norm = get("model.norm.weight");
  w.lm_head = spec_.tie_embeddings ? w.embed : get("lm_head.weight");
  return w;
}

ModelGrads HostState::grads() const {
  ModelGrads g;
  auto get = [&](const std::string& n) -> const float* { return grad(n); };
  g.embed = grad("model.embed_tokens.weight");
  for (int64_t i = 0; i < spec_.n_layers; ++i) g.layers.push_back(block_grads_from(block_view(spec_, i, get)));
  g.final_norm = grad("model.norm.weight");
  g.lm_head = spec_.tie_embeddings ? g.embed : grad("lm_head.weight");
  return g;
}

}  // namespace rt
