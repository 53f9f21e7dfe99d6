// ModelSpec: everything about a decoder-only transformer that ramtrain needs,
// read from a HF config.json (transformers 4.x and 5.x dialects) or taken from
// a built-in preset. Family differences are fields here, never subclasses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rt {

enum class Family { llama, mistral, qwen2, qwen3 };
enum class RopeScaling { none, llama3 };

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::none;
  // llama3 scaling parameters (used when scaling == llama3)
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct ModelSpec {
  Family family = Family::llama;
  std::string architecture = "LlamaForCausalLM";  // as written in config.json
  int64_t hidden = 0;                             // d_model
  int64_t intermediate = 0;                       // MLP width
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // GQA: n_heads % n_kv_heads == 0
  int64_t head_dim = 0;    // may differ from hidden / n_heads (Qwen3)
  int64_t vocab = 0;
  double rms_eps = 1e-6;
  RopeConfig rope;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k before RoPE
  int64_t max_positions = 2048;
  int64_t bos_id = -1;            // -1: none
  std::vector<int64_t> eos_ids;   // may be several (Llama-3 instruct)
  std::string dtype = "float32";  // torch_dtype / dtype of the checkpoint, informational

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t params_per_layer() const;
  int64_t params_embedding() const;  // vocab * hidden
  int64_t params_lm_head() const;    // 0 when tied
  int64_t params_total() const;      // everything, tied counted once
  // Throws rt::Error listing what is inconsistent (heads not dividing, zero dims, ...).
  void validate(const std::string& source) const;
};

const char* family_name(Family f);

// Parses config.json text. `source` names the file in error messages.
// Refuses unknown architectures and unsupported settings (active sliding
// window, yarn/dynamic/linear RoPE, ...) with a message listing what is supported.
ModelSpec spec_from_config_text(const std::string& json_text, const std::string& source);
// Reads DIR/config.json (or the file itself if a file path is given).
ModelSpec spec_from_config_file(const std::string& path);
// Writes a config.json that transformers 4.x and 5.x both load.
std::string spec_to_config_json(const ModelSpec& spec);

// Built-in presets with the shapes of well-known models (random init only):
// "tiny-byte" (the default demo model), "llama-3.1-8b", "mistral-7b",
// "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-8b".
ModelSpec spec_preset(const std::string& name);  // throws rt::Error listing the names
std::vector<std::string> preset_names();

}  // namespace rt
