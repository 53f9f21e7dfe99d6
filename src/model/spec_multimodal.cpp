#include "model/spec_multimodal.h"

#include "core/error.h"
#include "core/fs.h"

namespace rt {

using json = nlohmann::json;

bool config_is_multimodal(const json& j) {
  if (!j.is_object()) return false;
  const json* a = j.contains("architectures") ? &j.at("architectures") : nullptr;
  if (a && !a->is_null() && !(a->is_array() && a->empty()))
    return a->is_array() && a->at(0).is_string() && a->at(0).get<std::string>() == kGemma3Multimodal;
  // no architectures: Gemma3Config's model_type (a text model's is gemma3_text)
  return j.contains("model_type") && j.at("model_type") == "gemma3";
}

bool config_file_is_multimodal(const std::string& path) {
  const std::string file = is_directory(path) ? path_join(path, "config.json") : path;
  if (!file_exists(file)) return false;
  try {
    return config_is_multimodal(json::parse(read_text_file(file)));
  } catch (const std::exception&) {
    return false;  // an unreadable config.json is reported by whoever parses it
  }
}

json multimodal_text_config(const json& j, const std::string& source) {
  if (!j.contains("text_config") || !j.at("text_config").is_object())
    fail("[config] ", source, ": ", kGemma3Multimodal, " needs a \"text_config\" object (the language model's ",
         "settings), found ", j.contains("text_config") ? j.at("text_config").dump() : std::string("none"));
  // Gemma3TextConfig's defaults for the keys spec.cpp needs (transformers'
  // configuration_gemma3.py); the rest default in spec.cpp and spec_gemma.cpp
  // as for a gemma3_text config.json.
  json t = {{"vocab_size", 262208},      {"hidden_size", 2304},
            {"intermediate_size", 9216}, {"num_hidden_layers", 26},
            {"num_attention_heads", 8},  {"num_key_value_heads", 4},
            {"head_dim", 256},           {"max_position_embeddings", 131072},
            {"rms_norm_eps", 1e-6},      {"pad_token_id", 0},
            {"eos_token_id", 1},         {"bos_token_id", 2}};
  for (auto it = j.at("text_config").begin(); it != j.at("text_config").end(); ++it) t[it.key()] = it.value();
  t["architectures"] = json::array({"Gemma3ForCausalLM"});
  t["model_type"] = "gemma3_text";
  // transformers ties the LM head by the top level's tie_word_embeddings (Gemma3Config: true)
  t["tie_word_embeddings"] = j.contains("tie_word_embeddings") && j.at("tie_word_embeddings").is_boolean()
                                 ? j.at("tie_word_embeddings").get<bool>()
                                 : true;
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"})
    if (j.contains(k) && !j.at(k).is_null()) t[k] = j.at(k);
  return t;
}

std::string MultimodalNames::to_checkpoint(const std::string& text_name) const {
  if (text_name == "lm_head.weight") return head;
  RT_CHECK(text_name.rfind("model.", 0) == 0, "[load] internal: text tensor '", text_name, "' is not under model.");
  return body + text_name.substr(6);
}

std::optional<std::string> MultimodalNames::to_text(const std::string& name) const {
  if (name == head) return std::string("lm_head.weight");
  if (name.rfind(body, 0) == 0) return "model." + name.substr(body.size());
  return std::nullopt;
}

MultimodalNames multimodal_names(const std::vector<std::string>& names, const std::string& source) {
  bool v4 = false, v5 = false;
  for (const std::string& n : names) {
    v4 |= n.rfind("language_model.model.", 0) == 0;
    v5 |= n.rfind("model.language_model.", 0) == 0;
  }
  if (v4 && v5)
    fail("[load] ", source, ": the ", kGemma3Multimodal, " checkpoint names its language model both ",
         "language_model.model.* (transformers 4.x) and model.language_model.* (5.x); keep one convention");
  if (v4) return {"language_model.model.", "language_model.lm_head.weight"};
  if (v5) return {"model.language_model.", "lm_head.weight"};
  fail("[load] ", source, ": config.json says ", kGemma3Multimodal,
       " but no tensor is named language_model.model.* (transformers 4.x) or model.language_model.* (5.x); ",
       "is this the checkpoint config.json describes?");
}

}  // namespace rt
