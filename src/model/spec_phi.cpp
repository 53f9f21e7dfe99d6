// Phi3ForCausalLM config parsing and writing (spec_phi.h), as transformers
// 5.x's Phi3Config reads a config (4.x reads the same files to the same
// model):
// - RoPE: a non-empty rope_scaling (4.x) wins over rope_parameters (5.x);
//   rope_theta and partial_rotary_factor come from the chosen object, else
//   the top level, else 10000 and 1.0. Types: default, longrope ("su" and
//   "yarn" are read as longrope, as Phi3Config does).
// - LongRoPE: original_max_position_embeddings is the top-level field (default
//   4096), which Phi3Config puts over the rope object's own; attention_factor,
//   when absent, is sqrt(1 + ln(factor) / ln(original)) with factor the
//   object's "factor", else max_position_embeddings / original (1 when
//   factor <= 1).
// - sliding_window (null by default): transformers masks keys more than
//   window - 1 positions back; a window below max_position_embeddings becomes
//   ModelSpec::sliding_window, so runs take at most that many tokens, where
//   the mask changes nothing (as for Mistral).
// - resid_pdrop, embd_pdrop and attention_dropout must be 0: ramtrain has no
//   dropout.
#include "model/spec_phi.h"


#include <cmath>

#include "core/error.h"
#include "model/spec_json.h"

namespace rt {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Typed access to one object's fields; `where` prefixes keys in messages.
struct PhiFields {
  const json& j;
  const std::string& source;
  std::string where;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  [[noreturn]] void wrong(const char* key, const char* want) const {
    fail("[config] ", source, ": field \"", where, key, "\" must be ", want, ", found ", shown(j.at(key)));
  }
  double num(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_number()) wrong(key, "a number");
    return j.at(key).get<double>();
  }
  int64_t integer(const char* key, int64_t dflt) const {
    if (!has(key)) return dflt;
    const json& v = j.at(key);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
        std::fabs(v.get<double>()) < 9.0e15)
      return static_cast<int64_t>(v.get<double>());
    wrong(key, "an integer");
  }
  std::string str(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_string()) wrong(key, "a string");
    return j.at(key).get<std::string>();
  }
  std::vector<double> numbers(const char* key) const {
    std::vector<double> out;
    if (!has(key)) return out;
    const json& v = j.at(key);
    if (!v.is_array()) wrong(key, "a list of numbers");
    for (const auto& e : v) {
      if (!e.is_number()) wrong(key, "a list of numbers");
      out.push_back(e.get<double>());
    }
    return out;
  }
};

// The LongRoPE attention factor transformers derives when the config gives none.
double longrope_derived_attention(const ModelSpec& s, double factor) {
  if (!(factor > 1.0)) return 1.0;
  return std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(s.rope.original_max_positions)));
}

}  // namespace

ModelSpec spec_phi3_finish(const json& j, const std::string& source, ModelSpec s,
                           std::vector<std::string> unsupported) {
  PhiFields top{j, source, ""};
  // Phi3Config's pad_token_id default (spec.cpp reads it only when given)
  if (!j.contains("pad_token_id")) s.pad_id = 32000;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"})
    if (top.num(key, 0.0) != 0.0)
      unsupported.push_back(cat(key, " ", top.num(key, 0.0), " (dropout) is not supported; supported: 0.0"));

  // ---- RoPE
  const json* obj = nullptr;
  std::string name;
  if (top.has("rope_scaling")) {
    if (!j.at("rope_scaling").is_object()) top.wrong("rope_scaling", "an object or null");
    if (!j.at("rope_scaling").empty()) obj = &j.at("rope_scaling"), name = "rope_scaling.";
  }
  if (!obj && top.has("rope_parameters")) {
    if (!j.at("rope_parameters").is_object()) top.wrong("rope_parameters", "an object or null");
    obj = &j.at("rope_parameters"), name = "rope_parameters.";
  }
  static const json kEmpty = json::object();
  PhiFields r{obj ? *obj : kEmpty, source, name};
  RopeConfig& rope = s.rope;
  rope.theta = r.num("rope_theta", top.num("rope_theta", 10000.0));
  rope.partial_rotary_factor = r.num("partial_rotary_factor", top.num("partial_rotary_factor", 1.0));
  rope.original_max_positions = top.integer("original_max_position_embeddings", 4096);
  std::string type = r.has("rope_type") ? r.str("rope_type", "default") : r.str("type", "default");
  if (type == "su" || type == "yarn") type = "longrope";
  if (type == "default") {
    rope.scaling = RopeScaling::none;
  } else if (type == "longrope") {
    rope.scaling = RopeScaling::longrope;
    rope.short_factor = r.numbers("short_factor");
    rope.long_factor = r.numbers("long_factor");
    for (const char* key : {"short_factor", "long_factor"})
      if (!r.has(key))
        unsupported.push_back(cat(name, key, " is missing: LongRoPE needs short_factor and long_factor (one number "
                                  "per rotated pair of head dims)"));
    const double factor = r.num("factor", static_cast<double>(s.max_positions) /
                                              static_cast<double>(std::max<int64_t>(rope.original_max_positions, 1)));
    rope.attention_factor = r.has("attention_factor") ? r.num("attention_factor", 1.0)
                                                      : longrope_derived_attention(s, factor);
  } else {
    unsupported.push_back(cat(name, "rope_type \"", type,
                              "\" is not supported for Phi3ForCausalLM; supported: default, longrope (su, yarn)"));
  }

  // ---- sliding window (see the file comment)
  if (top.has("sliding_window")) {
    const int64_t w = top.integer("sliding_window", 0);
    if (w <= 0)
      unsupported.push_back(cat("sliding_window ", w, " is not a window; give a positive size or null"));
    else if (w < s.max_positions)
      s.sliding_window = w;
  }

  return detail::spec_finish(source, std::move(s), unsupported);
}

void rope_validate(const ModelSpec& s, std::vector<std::string>* p) {
  const RopeConfig& r = s.rope;
  if (!(r.partial_rotary_factor > 0.0 && r.partial_rotary_factor <= 1.0)) {
    p->push_back(cat("partial_rotary_factor ", r.partial_rotary_factor, " must be in (0, 1]"));
    return;
  }
  const int64_t rd = s.rotary_dim();
  if (r.partial_rotary_factor != 1.0 && s.head_dim > 0 && (rd < 2 || rd % 2 != 0))  // 1.0: validate's head_dim check
    p->push_back(cat("partial_rotary_factor ", r.partial_rotary_factor, " rotates ", rd, " of head_dim ", s.head_dim,
                     " dims; RoPE needs an even number of at least 2"));
  if (r.partial_rotary_factor != 1.0 && s.family != Family::phi3)
    p->push_back(cat("partial_rotary_factor ", r.partial_rotary_factor, " is supported for Phi3ForCausalLM only"));
  if (r.scaling != RopeScaling::longrope) return;
  if (s.family != Family::phi3) p->push_back("LongRoPE is supported for Phi3ForCausalLM only");
  for (const auto& [key, v] : {std::pair<const char*, const std::vector<double>*>{"short_factor", &r.short_factor},
                               {"long_factor", &r.long_factor}}) {
    if (static_cast<int64_t>(v->size()) != rd / 2)
      p->push_back(cat("LongRoPE ", key, " has ", v->size(), " entries; it needs one per rotated pair: ", rd / 2,
                       " (head_dim ", s.head_dim, " x partial_rotary_factor ", r.partial_rotary_factor, " / 2)"));
    for (double x : *v)
      if (!(x > 0.0) || !std::isfinite(x)) {
        p->push_back(cat("LongRoPE ", key, " holds ", x, "; each factor must be positive and finite"));
        break;
      }
  }
  if (!(r.attention_factor > 0.0) || !std::isfinite(r.attention_factor))
    p->push_back(cat("LongRoPE attention_factor must be positive and finite, found ", r.attention_factor));
  if (r.original_max_positions <= 0)
    p->push_back(cat("original_max_position_embeddings must be positive, found ", r.original_max_positions));
}

std::string spec_phi3_config_json(const ModelSpec& s) {
  RT_CHECK(!s.qkv_bias && !s.qk_norm && !s.post_norms && !s.is_moe() && s.rope_layers.empty() &&
               s.embedding_multiplier == 1.0 && s.residual_multiplier == 1.0 && s.logits_scaling == 1.0 &&
               s.attention_scale == 0.0,
           "[config] spec_to_config_json: Phi3ForCausalLM has no q/k/v biases, q/k norms, post-branch norms, experts, "
           "layers without RoPE or multipliers");
  RT_CHECK(s.rope.scaling == RopeScaling::none || s.rope.scaling == RopeScaling::longrope,
           "[config] spec_to_config_json: Phi3ForCausalLM takes default or longrope RoPE, not llama3 or linear");
  RT_CHECK(s.norm_offset == 0.0 && s.mlp_act == MlpAct::silu && !s.sandwich_norms && s.attn_softcap == 0.0 &&
               s.final_softcap == 0.0 && s.local_layers.empty() && !s.rope_local_on,
           "[config] spec_to_config_json: Gemma's features cannot be expressed for Phi3ForCausalLM");
  s.validate("spec_to_config_json");
  const RopeConfig& r = s.rope;
  ojson o;
  o["architectures"] = ojson::array({"Phi3ForCausalLM"});
  o["model_type"] = "phi3";
  o["hidden_size"] = s.hidden;
  o["intermediate_size"] = s.intermediate;
  o["num_hidden_layers"] = s.n_layers;
  o["num_attention_heads"] = s.n_heads;
  o["num_key_value_heads"] = s.n_kv_heads;
  // Phi3Config has no head_dim; written only when it is not hidden / heads
  if (s.head_dim * s.n_heads != s.hidden) o["head_dim"] = s.head_dim;
  o["vocab_size"] = s.vocab;
  o["max_position_embeddings"] = s.max_positions;
  o["original_max_position_embeddings"] = r.original_max_positions;
  o["rms_norm_eps"] = s.rms_eps;
  o["hidden_act"] = "silu";
  o["tie_word_embeddings"] = s.tie_embeddings;
  o["rope_theta"] = r.theta;
  o["partial_rotary_factor"] = r.partial_rotary_factor;
  ojson rp;
  if (r.scaling == RopeScaling::longrope) {
    // 4.x's Phi3Config takes exactly {type, short_factor, long_factor}; an
    // attention_factor other than the derived one is 5.x only, and 4.x then
    // refuses the file rather than misread it.
    ojson rs;
    rs["type"] = "longrope";
    rs["short_factor"] = r.short_factor;
    rs["long_factor"] = r.long_factor;
    const double derived = longrope_derived_attention(
        s, static_cast<double>(s.max_positions) / static_cast<double>(r.original_max_positions));
    if (r.attention_factor != derived) rs["attention_factor"] = r.attention_factor;
    o["rope_scaling"] = rs;
    rp["rope_type"] = "longrope";
    rp["short_factor"] = r.short_factor;
    rp["long_factor"] = r.long_factor;
    rp["attention_factor"] = r.attention_factor;
    rp["original_max_position_embeddings"] = r.original_max_positions;
  } else {
    o["rope_scaling"] = nullptr;
    rp["rope_type"] = "default";
  }
  rp["rope_theta"] = r.theta;
  rp["partial_rotary_factor"] = r.partial_rotary_factor;
  o["rope_parameters"] = rp;
  o["sliding_window"] = s.sliding_window > 0 ? ojson(s.sliding_window) : ojson(nullptr);
  o["resid_pdrop"] = 0.0;
  o["embd_pdrop"] = 0.0;
  o["attention_dropout"] = 0.0;
  detail::config_write_ids_and_dtype(o, s);
  o["use_cache"] = true;
  return o.dump(2) + "\n";
}

}  // namespace rt
