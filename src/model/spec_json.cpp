#include "model/spec_json.h"

#include <cmath>

#include "core/error.h"

namespace rt::detail {

using json = nlohmann::json;

bool has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

void wrong(const std::string& source, const char* key, const char* want, const json& v) {
  fail("[config] ", source, ": field \"", key, "\" must be ", want, ", found ", v.dump());
}

double get_double(const json& j, const std::string& source, const char* key, double dflt) {
  if (!has(j, key)) return dflt;
  if (!j.at(key).is_number()) wrong(source, key, "a number", j.at(key));
  return j.at(key).get<double>();
}

int64_t get_int(const json& j, const std::string& source, const char* key, int64_t dflt) {
  if (!has(j, key)) return dflt;
  const json& v = j.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15)
    return static_cast<int64_t>(v.get<double>());
  wrong(source, key, "an integer", v);
}

bool get_bool(const json& j, const std::string& source, const char* key, bool dflt) {
  if (!has(j, key)) return dflt;
  if (!j.at(key).is_boolean()) wrong(source, key, "true or false", j.at(key));
  return j.at(key).get<bool>();
}

std::string get_string(const json& j, const std::string& source, const char* key, const std::string& dflt) {
  if (!has(j, key)) return dflt;
  if (!j.at(key).is_string()) wrong(source, key, "a string", j.at(key));
  return j.at(key).get<std::string>();
}

std::optional<std::vector<uint8_t>> layer_types_read(const json& j, const std::string& source, int64_t n_layers,
                                                     std::vector<std::string>* unsupported) {
  if (!has(j, "layer_types")) return std::nullopt;
  const json& lt = j.at("layer_types");
  if (!lt.is_array()) wrong(source, "layer_types", "a list of strings", lt);
  std::vector<uint8_t> local;
  for (const auto& t : lt) {
    const std::string v = t.is_string() ? t.get<std::string>() : "";
    if (v == "sliding_attention")
      local.push_back(1);
    else if (v == "full_attention")
      local.push_back(0);
    else
      wrong(source, "layer_types", "a list of \"sliding_attention\" or \"full_attention\"", lt);
  }
  if (static_cast<int64_t>(local.size()) != n_layers)
    unsupported->push_back(cat("layer_types has ", local.size(), " entries for ", n_layers, " layers"));
  return local;
}

ModelSpec spec_finish(const std::string& source, ModelSpec s, const std::vector<std::string>& unsupported) {
  if (!unsupported.empty()) {
    std::string msg = cat("[config] ", source, ": ", s.architecture, " with unsupported settings:");
    for (const auto& u : unsupported) msg += "\n  - " + u;
    throw Error(msg);
  }
  s.validate(source);
  return s;
}

void config_write_dims(nlohmann::ordered_json& o, const ModelSpec& s, const std::string& architecture,
                       const std::string& model_type) {
  o["architectures"] = nlohmann::ordered_json::array({architecture});
  o["model_type"] = model_type;
  o["hidden_size"] = s.hidden;
  o["intermediate_size"] = s.intermediate;
  o["num_hidden_layers"] = s.n_layers;
  o["num_attention_heads"] = s.n_heads;
  o["num_key_value_heads"] = s.n_kv_heads;
  o["head_dim"] = s.head_dim;
  o["vocab_size"] = s.vocab;
  o["max_position_embeddings"] = s.max_positions;
  o["rms_norm_eps"] = s.rms_eps;
  o["hidden_act"] = "silu";
  o["tie_word_embeddings"] = s.tie_embeddings;
}

void config_write_ids_and_dtype(nlohmann::ordered_json& o, const ModelSpec& s) {
  using ojson = nlohmann::ordered_json;
  o["bos_token_id"] = s.bos_id >= 0 ? ojson(s.bos_id) : ojson(nullptr);
  o["pad_token_id"] = s.pad_id ? ojson(*s.pad_id) : ojson(nullptr);
  if (s.eos_ids.empty())
    o["eos_token_id"] = nullptr;
  else if (s.eos_ids.size() == 1)
    o["eos_token_id"] = s.eos_ids[0];
  else
    o["eos_token_id"] = s.eos_ids;
  o["torch_dtype"] = s.dtype;
  o["dtype"] = s.dtype;
  o["initializer_range"] = 0.02;
}

}  // namespace rt::detail
