// Internal to model/spec*.cpp: the Gemma families' config.json fields
// (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM), read and written
// apart from the common ones spec.cpp handles.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/spec.h"

namespace rt::detail {

// Reads a RoPE object (rope_scaling or rope_parameters.<type>) into rope (spec.cpp);
// yarn_ok: YaRN is read too (gpt-oss), else refused as for every other family.
void spec_rope_read(const nlohmann::json& obj, const std::string& name, const std::string& source, double top_theta,
                    RopeConfig* rope, std::vector<std::string>* unsupported, bool yarn_ok = false);
// s holds the common fields (dimensions, ids, rms_norm_eps, and for Gemma 1/2
// the RoPE); sets the Gemma features and adds what is not supported.
void gemma_parse(const nlohmann::json& j, const std::string& source, ModelSpec& s,
                 std::vector<std::string>* unsupported);
// A preset's Gemma features (spec_presets.cpp): s holds the common fields of
// a Gemma family; query_pre_attn_scalar (Gemma 2/3), the window and every
// how many layers one is global (Gemma 2: 2, Gemma 3: 6), the soft caps,
// Gemma 3's local RoPE base and linear scaling factor of the global RoPE (1: none).
ModelSpec gemma_preset(ModelSpec s, double query_pre_attn_scalar, int64_t window, int64_t global_every,
                       double attn_softcap, double final_softcap, double local_theta, double linear_factor);
// Adds the Gemma fields to a config.json object o that already holds the
// common ones (and replaces hidden_act, the RoPE and the window fields).
void gemma_config_write(const ModelSpec& s, nlohmann::ordered_json& o);

}  // namespace rt::detail
