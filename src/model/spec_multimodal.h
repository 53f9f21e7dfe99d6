// Gemma3ForConditionalGeneration: the multimodal Gemma 3 checkpoints (4B, 12B,
// 27B). ramtrain trains their language model, a Gemma3ForCausalLM whose
// config.json is the nested text_config, and carries every other tensor (the
// SigLIP vision tower, the multi-modal projector) into exports untouched.
//
// Tensor names, by the transformers version that wrote them:
//   4.x and the hub checkpoints (google/gemma-3-4b-it): language_model.model.X,
//     language_model.lm_head.weight, vision_tower.*, multi_modal_projector.*;
//   5.x in memory (and older 5.x saves): model.language_model.X,
//     lm_head.weight, model.vision_tower.*, model.multi_modal_projector.*.
// (transformers 5.25's save_pretrained writes the 4.x names again.) The text
// model's own names are model.X and lm_head.weight (model/weight_map.h).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace rt {

inline constexpr const char* kGemma3Multimodal = "Gemma3ForConditionalGeneration";

// Whether a config.json object's architectures[0] is Gemma3ForConditionalGeneration
// (without architectures: whether its model_type is gemma3).
bool config_is_multimodal(const nlohmann::json& j);
// DIR/config.json (or the file itself) is a multimodal config; false when absent or unreadable.
bool config_file_is_multimodal(const std::string& path);

// The language model's config.json (architectures Gemma3ForCausalLM,
// model_type gemma3_text) from a multimodal one: text_config over the
// defaults Gemma3TextConfig applies to keys it leaves out (hub configs give
// only a few), with the top level's tie_word_embeddings (transformers ties
// by it; default true), token ids and dtype where it sets them. Throws when
// text_config is not an object.
nlohmann::json multimodal_text_config(const nlohmann::json& j, const std::string& source);

// How a multimodal checkpoint names the language model's tensors.
struct MultimodalNames {
  std::string body;  // replaces the text model's "model.": "language_model.model." or "model.language_model."
  std::string head;  // the untied LM head: "language_model.lm_head.weight" or "lm_head.weight"
  // The checkpoint's name of a text-model tensor (model.X, lm_head.weight).
  std::string to_checkpoint(const std::string& text_name) const;
  // The text model's name of a checkpoint tensor; nullopt: carried (not the language model's).
  std::optional<std::string> to_text(const std::string& name) const;
};
// The convention a checkpoint's tensor names follow; throws naming `source`
// when they hold neither language_model.model.* nor model.language_model.*.
MultimodalNames multimodal_names(const std::vector<std::string>& names, const std::string& source);

}  // namespace rt
