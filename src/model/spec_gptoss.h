// GptOssForCausalLM's config.json (gpt-oss-20b, gpt-oss-120b), the part
// spec.cpp hands over: YaRN RoPE, the alternating sliding-window layers,
// attention sinks and biases, the experts (router bias, softmax over the
// top-k logits, expert biases, clamped SwiGLU); the writer of a config.json
// transformers 4.x and 5.x both load; the checks of ModelSpec::validate.
// Internal to src/model.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"

namespace rt {

// Finishes a gpt-oss spec whose common fields (dimensions, ids, activation)
// spec_parse has read. Throws one rt::Error listing `unsupported` plus what it finds.
ModelSpec spec_gptoss_finish(const nlohmann::json& j, const std::string& source, ModelSpec s,
                             std::vector<std::string> unsupported);
// config.json for a gpt-oss spec.
std::string spec_gptoss_config_json(const ModelSpec& s);
// YaRN's and gpt-oss's consistency (sinks, biases and the clamped SwiGLU
// belong to gpt-oss alone), appended to `problems`.
void gptoss_validate(const ModelSpec& s, std::vector<std::string>* problems);

}  // namespace rt
