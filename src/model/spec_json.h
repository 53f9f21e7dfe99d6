// Internal to model/spec*.cpp: reading config.json fields with the checks
// every family's parser shares, the end of a parse, and the fields every
// family's config.json writer puts alike.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/spec.h"

namespace rt::detail {

// The field is there and not null.
bool has(const nlohmann::json& j, const char* key);
// "[config] SOURCE: field "KEY" must be WANT, found V".
[[noreturn]] void wrong(const std::string& source, const char* key, const char* want, const nlohmann::json& v);
// A field's value, dflt when absent or null; a value of another type is wrong().
double get_double(const nlohmann::json& j, const std::string& source, const char* key, double dflt);
int64_t get_int(const nlohmann::json& j, const std::string& source, const char* key, int64_t dflt);  // 2.0 reads as 2
bool get_bool(const nlohmann::json& j, const std::string& source, const char* key, bool dflt);
std::string get_string(const nlohmann::json& j, const std::string& source, const char* key, const std::string& dflt);
// layer_types (transformers' per-layer attention kinds): 1 for "sliding_attention", 0 for "full_attention", one per
// layer (a wrong count joins unsupported); nullopt when the config has none.
std::optional<std::vector<uint8_t>> layer_types_read(const nlohmann::json& j, const std::string& source,
                                                     int64_t n_layers, std::vector<std::string>* unsupported);
// The end of a parse: one rt::Error listing every unsupported setting, else
// ModelSpec::validate; returns s.
ModelSpec spec_finish(const std::string& source, ModelSpec s, const std::vector<std::string>& unsupported);

// A written config.json's architecture and dimensions: architectures, model_type, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
// max_position_embeddings, rms_norm_eps, hidden_act (silu), tie_word_embeddings, in that order.
void config_write_dims(nlohmann::ordered_json& o, const ModelSpec& s, const std::string& architecture,
                       const std::string& model_type);
// A written config.json's special token ids (null rather than absent: some
// config classes default to an id, SmolLM3 128004, OLMo2 1), dtype and
// initializer_range, as every family's writer puts them.
void config_write_ids_and_dtype(nlohmann::ordered_json& o, const ModelSpec& s);

}  // namespace rt::detail
