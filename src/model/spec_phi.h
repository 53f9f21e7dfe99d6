// Phi3ForCausalLM's config.json (Phi-3, Phi-3.5, Phi-4, Phi-4-mini), the part
// spec.cpp hands over: RoPE (partial rotary, LongRoPE), sliding window,
// dropouts; the writer of a config.json both transformers 4.x and 5.x load;
// the RoPE checks of ModelSpec::validate. Internal to src/model.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"

namespace rt {

// Finishes a Phi3 spec whose common fields (dimensions, ids, activation)
// spec_parse has read: RoPE in both dialects, sliding_window, dropouts.
// Throws one rt::Error listing `unsupported` plus what it finds.
ModelSpec spec_phi3_finish(const nlohmann::json& j, const std::string& source, ModelSpec s,
                           std::vector<std::string> unsupported);
// config.json for a Phi3 spec.
std::string spec_phi3_config_json(const ModelSpec& s);
// Partial rotary and LongRoPE consistency, appended to `problems`.
void rope_validate(const ModelSpec& s, std::vector<std::string>* problems);

}  // namespace rt
