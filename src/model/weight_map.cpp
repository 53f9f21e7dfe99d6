// The HF tensor-name table for the supported families, and the check of a
// checkpoint's tensors against it.
//
// Rules:
// - Names and shapes are stated here once, per family, in canonical order
//   (see weight_map.h); nothing is discovered by probing names.
// - weight_map_check reports every missing tensor, every unexpected one and
//   every shape mismatch (capped at kReportLines lines plus a count). It
//   tolerates what transformers itself drops on load: "*.rotary_emb.inv_freq"
//   buffers, and an lm_head.weight of the right shape when embeddings are tied.
#include "model/weight_map.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/error.h"

namespace rt {

namespace {

constexpr size_t kReportLines = 40;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

WeightEntry entry(std::string name, WeightKind kind, int64_t layer, std::vector<int64_t> shape) {
  bool nb = kind == WeightKind::attn_norm || kind == WeightKind::mlp_norm || kind == WeightKind::final_norm ||
            kind == WeightKind::attn_post_norm || kind == WeightKind::mlp_post_norm || kind == WeightKind::q_norm ||
            kind == WeightKind::k_norm || kind == WeightKind::q_bias || kind == WeightKind::k_bias ||
            kind == WeightKind::v_bias || kind == WeightKind::o_bias || kind == WeightKind::sinks ||
            kind == WeightKind::router_bias || kind == WeightKind::expert_gate_bias ||
            kind == WeightKind::expert_up_bias || kind == WeightKind::expert_down_bias;
  return WeightEntry{std::move(name), kind, layer, std::move(shape), nb, -1};
}

// Which config fields decide a tensor's shape, for the mismatch hint.
const char* shape_hint(WeightKind k) {
  switch (k) {
    case WeightKind::embed:
    case WeightKind::lm_head:
      return "vocab_size/hidden_size";
    case WeightKind::attn_norm:
    case WeightKind::mlp_norm:
    case WeightKind::attn_post_norm:
    case WeightKind::mlp_post_norm:
    case WeightKind::final_norm:
      return "hidden_size";
    case WeightKind::q_proj:
    case WeightKind::o_proj:
      return "num_attention_heads/head_dim/hidden_size";
    case WeightKind::q_bias:
      return "num_attention_heads/head_dim";
    case WeightKind::k_proj:
    case WeightKind::v_proj:
    case WeightKind::k_bias:
    case WeightKind::v_bias:
      return "num_key_value_heads/head_dim";
    case WeightKind::q_norm:
    case WeightKind::k_norm:
      return "head_dim";
    case WeightKind::gate_proj:
    case WeightKind::up_proj:
    case WeightKind::down_proj:
      return "intermediate_size/hidden_size";
    case WeightKind::router:
      return "num_experts/hidden_size";
    case WeightKind::expert_gate:
    case WeightKind::expert_up:
    case WeightKind::expert_down:
      return "moe_intermediate_size (Qwen3-MoE, Qwen2-MoE) or intermediate_size/hidden_size";
    case WeightKind::shared_expert_gate:
    case WeightKind::o_bias:
      return "hidden_size";
    case WeightKind::sinks:
      return "num_attention_heads";
    case WeightKind::router_bias:
    case WeightKind::expert_gate_bias:
    case WeightKind::expert_up_bias:
    case WeightKind::expert_down_bias:
      return "num_local_experts/intermediate_size/hidden_size";
  }
  return "config.json";
}

// Natural order: digit runs compare as numbers, so layers.2 < layers.10.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
      na.erase(0, std::min(na.find_first_not_of('0'), na.size()));
      nb.erase(0, std::min(nb.find_first_not_of('0'), nb.size()));
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int64_t WeightEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* weight_kind_name(WeightKind k) {
  switch (k) {
    case WeightKind::embed:
      return "embed";
    case WeightKind::attn_norm:
      return "attn_norm";
    case WeightKind::q_proj:
      return "q_proj";
    case WeightKind::q_bias:
      return "q_bias";
    case WeightKind::k_proj:
      return "k_proj";
    case WeightKind::k_bias:
      return "k_bias";
    case WeightKind::v_proj:
      return "v_proj";
    case WeightKind::v_bias:
      return "v_bias";
    case WeightKind::q_norm:
      return "q_norm";
    case WeightKind::k_norm:
      return "k_norm";
    case WeightKind::o_proj:
      return "o_proj";
    case WeightKind::mlp_norm:
      return "mlp_norm";
    case WeightKind::gate_proj:
      return "gate_proj";
    case WeightKind::up_proj:
      return "up_proj";
    case WeightKind::down_proj:
      return "down_proj";
    case WeightKind::router:
      return "router";
    case WeightKind::expert_gate:
      return "expert_gate";
    case WeightKind::expert_up:
      return "expert_up";
    case WeightKind::expert_down:
      return "expert_down";
    case WeightKind::shared_expert_gate:
      return "shared_expert_gate";
    case WeightKind::attn_post_norm:
      return "attn_post_norm";
    case WeightKind::mlp_post_norm:
      return "mlp_post_norm";
    case WeightKind::o_bias:
      return "o_bias";
    case WeightKind::sinks:
      return "sinks";
    case WeightKind::router_bias:
      return "router_bias";
    case WeightKind::expert_gate_bias:
      return "expert_gate_bias";
    case WeightKind::expert_up_bias:
      return "expert_up_bias";
    case WeightKind::expert_down_bias:
      return "expert_down_bias";
    case WeightKind::final_norm:
      return "final_norm";
    case WeightKind::lm_head:
      return "lm_head";
  }
  return "?";
}

std::vector<WeightEntry> layer_weight_map(const ModelSpec& s, int64_t layer) {
  RT_CHECK(layer >= 0 && layer < s.n_layers, "[weights] layer ", layer, " is out of range: the model has ", s.n_layers,
           " layers");
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const int64_t d = s.hidden, q = s.q_dim(), kv = s.kv_dim(), f = s.intermediate;
  std::vector<WeightEntry> m;
  // OLMo2 (post_norms): the attention branch's norm follows it, the MLP's is post_feedforward_layernorm
  m.push_back(entry(p + (s.post_norms ? "post_attention_layernorm.weight" : "input_layernorm.weight"),
                    WeightKind::attn_norm, layer, {d}));
  m.push_back(entry(p + "self_attn.q_proj.weight", WeightKind::q_proj, layer, {q, d}));
  if (s.qkv_bias) m.push_back(entry(p + "self_attn.q_proj.bias", WeightKind::q_bias, layer, {q}));
  m.push_back(entry(p + "self_attn.k_proj.weight", WeightKind::k_proj, layer, {kv, d}));
  if (s.qkv_bias) m.push_back(entry(p + "self_attn.k_proj.bias", WeightKind::k_bias, layer, {kv}));
  m.push_back(entry(p + "self_attn.v_proj.weight", WeightKind::v_proj, layer, {kv, d}));
  if (s.qkv_bias) m.push_back(entry(p + "self_attn.v_proj.bias", WeightKind::v_bias, layer, {kv}));
  if (s.qk_norm) {
    m.push_back(entry(p + "self_attn.q_norm.weight", WeightKind::q_norm, layer, {s.qk_norm_whole ? q : s.head_dim}));
    m.push_back(entry(p + "self_attn.k_norm.weight", WeightKind::k_norm, layer, {s.qk_norm_whole ? kv : s.head_dim}));
  }
  m.push_back(entry(p + "self_attn.o_proj.weight", WeightKind::o_proj, layer, {d, q}));
  if (s.o_bias) m.push_back(entry(p + "self_attn.o_proj.bias", WeightKind::o_bias, layer, {d}));
  if (s.attn_sinks) m.push_back(entry(p + "self_attn.sinks", WeightKind::sinks, layer, {s.n_heads}));
  if (s.sandwich_norms) {  // Gemma 2/3: post_attention_layernorm follows the attention branch
    m.push_back(entry(p + "post_attention_layernorm.weight", WeightKind::attn_post_norm, layer, {d}));
    m.push_back(entry(p + "pre_feedforward_layernorm.weight", WeightKind::mlp_norm, layer, {d}));
    m.push_back(entry(p + "post_feedforward_layernorm.weight", WeightKind::mlp_post_norm, layer, {d}));
  } else {
    m.push_back(entry(p + (s.post_norms ? "post_feedforward_layernorm.weight" : "post_attention_layernorm.weight"),
                      WeightKind::mlp_norm, layer, {d}));
  }
  if (s.is_moe() && s.family == Family::gpt_oss) {
    // gpt-oss: mlp.router.{weight,bias}; the experts' parts of the fused tensors (fused_tensors)
    const std::string mp = p + "mlp.";
    const int64_t fe = s.moe.expert_intermediate;
    m.push_back(entry(mp + "router.weight", WeightKind::router, layer, {s.moe.n_experts, d}));
    if (s.moe.router_bias) m.push_back(entry(mp + "router.bias", WeightKind::router_bias, layer, {s.moe.n_experts}));
    const bool b = s.moe.expert_bias;
    for (int64_t e = 0; e < s.moe.n_experts; ++e) {
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      const size_t first = m.size();
      m.push_back(entry(ep + "gate_proj.weight", WeightKind::expert_gate, layer, {fe, d}));
      if (b) m.push_back(entry(ep + "gate_proj.bias", WeightKind::expert_gate_bias, layer, {fe}));
      m.push_back(entry(ep + "up_proj.weight", WeightKind::expert_up, layer, {fe, d}));
      if (b) m.push_back(entry(ep + "up_proj.bias", WeightKind::expert_up_bias, layer, {fe}));
      m.push_back(entry(ep + "down_proj.weight", WeightKind::expert_down, layer, {d, fe}));
      if (b) m.push_back(entry(ep + "down_proj.bias", WeightKind::expert_down_bias, layer, {d}));
      for (size_t k = first; k < m.size(); ++k) m[k].expert = e;
    }
    return m;
  }
  if (s.is_moe()) {
    // Mixtral's hub names: block_sparse_moe.gate, experts.{e}.w1 (gate), w3 (up), w2 (down).
    const bool mixtral = s.family == Family::mixtral;
    const std::string mp = p + (mixtral ? "block_sparse_moe." : "mlp.");
    const int64_t fe = s.moe.expert_intermediate;
    m.push_back(entry(mp + "gate.weight", WeightKind::router, layer, {s.moe.n_experts, d}));
    for (int64_t e = 0; e < s.moe.n_experts; ++e) {
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      m.push_back(entry(ep + (mixtral ? "w1" : "gate_proj") + ".weight", WeightKind::expert_gate, layer, {fe, d}));
      m.push_back(entry(ep + (mixtral ? "w3" : "up_proj") + ".weight", WeightKind::expert_up, layer, {fe, d}));
      m.push_back(entry(ep + (mixtral ? "w2" : "down_proj") + ".weight", WeightKind::expert_down, layer, {d, fe}));
      for (size_t k = m.size() - 3; k < m.size(); ++k) m[k].expert = e;
    }
    if (s.moe.shared_intermediate > 0) {  // Qwen2-MoE
      const int64_t fs = s.moe.shared_intermediate;
      m.push_back(entry(mp + "shared_expert.gate_proj.weight", WeightKind::gate_proj, layer, {fs, d}));
      m.push_back(entry(mp + "shared_expert.up_proj.weight", WeightKind::up_proj, layer, {fs, d}));
      m.push_back(entry(mp + "shared_expert.down_proj.weight", WeightKind::down_proj, layer, {d, fs}));
      m.push_back(entry(mp + "shared_expert_gate.weight", WeightKind::shared_expert_gate, layer, {1, d}));
    }
    return m;
  }
  m.push_back(entry(p + "mlp.gate_proj.weight", WeightKind::gate_proj, layer, {f, d}));
  m.push_back(entry(p + "mlp.up_proj.weight", WeightKind::up_proj, layer, {f, d}));
  m.push_back(entry(p + "mlp.down_proj.weight", WeightKind::down_proj, layer, {d, f}));
  return m;
}

std::vector<WeightEntry> weight_map(const ModelSpec& s) {
  std::vector<WeightEntry> m;
  m.push_back(entry("model.embed_tokens.weight", WeightKind::embed, -1, {s.vocab, s.hidden}));
  for (int64_t i = 0; i < s.n_layers; ++i) {
    auto l = layer_weight_map(s, i);
    m.insert(m.end(), std::make_move_iterator(l.begin()), std::make_move_iterator(l.end()));
  }
  m.push_back(entry("model.norm.weight", WeightKind::final_norm, -1, {s.hidden}));
  if (!s.tie_embeddings) m.push_back(entry("lm_head.weight", WeightKind::lm_head, -1, {s.vocab, s.hidden}));
  return m;
}

std::string weight_map_check(const ModelSpec& spec, const std::vector<FoundTensor>& found) {
  // The layer count first, from the names alone: a config.json asking for
  // far more layers than the files hold is told at once (listing every
  // missing tensor of 10^7 layers would take minutes and gigabytes).
  int64_t layers = 0;
  for (const auto& t : found) {
    const size_t at = t.name.find("layers.");
    if (at == std::string::npos || (at > 0 && t.name[at - 1] != '.')) continue;
    int64_t idx = 0;
    size_t k = at + 7, digits = 0;
    while (k < t.name.size() && std::isdigit(static_cast<unsigned char>(t.name[k])) && digits < 12)
      idx = idx * 10 + (t.name[k++] - '0'), ++digits;
    if (digits > 0 && k < t.name.size() && t.name[k] == '.') layers = std::max(layers, idx + 1);
  }
  if ((spec.n_layers > layers + 64 && spec.n_layers > 1024) || layers > spec.n_layers + 64)
    return cat("config.json has num_hidden_layers ", spec.n_layers, ", the weights hold ",
               layers == 0 ? std::string("no layer tensors") : cat(layers, " (model.layers.0 .. ", layers - 1, ")"),
               ": fix num_hidden_layers or use the matching weights\n");
  std::vector<WeightEntry> expected = hf_weight_map(spec);  // fused tensors as the files hold them
  std::map<std::string, const FoundTensor*> by_name;
  std::vector<std::string> duplicated;
  for (const auto& t : found)
    if (!by_name.emplace(t.name, &t).second) duplicated.push_back(t.name);

  std::vector<std::string> missing, mismatched, unexpected;
  std::map<std::string, bool> is_expected;
  for (const auto& e : expected) {
    is_expected[e.name] = true;
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      missing.push_back(cat("missing: ", e.name, " ", shape_str(e.shape),
                            e.kind == WeightKind::lm_head
                                ? " (if the checkpoint ties embeddings, set tie_word_embeddings true in config.json)"
                                : ""));
    } else if (it->second->shape != e.shape) {
      mismatched.push_back(cat(e.name, ": expected ", shape_str(e.shape), ", found ", shape_str(it->second->shape),
                               " \u2014 check ", shape_hint(e.kind), " in config.json"));
    }
  }
  std::vector<const FoundTensor*> extra;
  for (const auto& [name, t] : by_name) {
    if (is_expected.count(name)) continue;
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;  // a buffer, not a weight
    if (name == "lm_head.weight" && spec.tie_embeddings) {
      std::vector<int64_t> want = {spec.vocab, spec.hidden};
      if (t->shape == want) continue;  // tied: transformers ignores the copy
      mismatched.push_back(cat("lm_head.weight: expected ", shape_str(want), " (tied to the embedding), found ",
                               shape_str(t->shape), " \u2014 check vocab_size/hidden_size in config.json"));
      continue;
    }
    extra.push_back(t);
  }
  std::sort(extra.begin(), extra.end(),
            [](const FoundTensor* a, const FoundTensor* b) { return natural_less(a->name, b->name); });
  for (const auto* t : extra) {
    std::string why;
    if (t->name == "lm_head.weight")
      why = " (config.json says tie_word_embeddings true)";
    else if (ends_with(t->name, ".bias"))
      why = cat(" (", family_name(spec.family), " has no such bias)");
    unexpected.push_back(cat("unexpected: ", t->name, " ", shape_str(t->shape), why));
  }
  std::sort(duplicated.begin(), duplicated.end(), natural_less);
  for (auto& d : duplicated) d = "duplicated: " + d;

  size_t total = missing.size() + unexpected.size() + mismatched.size() + duplicated.size();
  if (total == 0) return "";
  std::string r = cat(missing.size(), " missing, ", unexpected.size(), " unexpected, ", mismatched.size(),
                      " with the wrong shape", duplicated.empty() ? "" : cat(", ", duplicated.size(), " duplicated"),
                      " (expected ", expected.size(), " tensors for ", spec.architecture, " with ", spec.n_layers,
                      " layers", spec.tie_embeddings ? ", tied embeddings" : "", "):");
  size_t shown = 0;
  for (const auto* group : {&missing, &unexpected, &mismatched, &duplicated})
    for (const auto& line : *group)
      if (shown < kReportLines) {
        r += "\n  " + line;
        ++shown;
      }
  if (total > shown) r += cat("\n  ... and ", total - shown, " more");
  return r;
}

}  // namespace rt
