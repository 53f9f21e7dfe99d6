// ModelSpec: everything about a decoder-only transformer that ramtrain needs,
// read from a HF config.json (transformers 4.x and 5.x dialects) or taken from
// a built-in preset. Family differences are fields here, never subclasses.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rt {

enum class Family { llama, mistral, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral, olmoe, olmo2, granite, smollm3,
                    gemma, gemma2, gemma3, phi3, gpt_oss };
// linear (Gemma 3's global layers): inv_freq / factor; longrope: Phi3's LongRoPE;
// yarn: YaRN (gpt-oss), transformers' _compute_yarn_parameters.
enum class RopeScaling { none, llama3, linear, longrope, yarn };
// The gated MLP's activation: silu (SwiGLU) or the tanh approximation of gelu (Gemma's GeGLU).
enum class MlpAct { silu, gelu_tanh };

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::none;
  // llama3 scaling parameters (used when scaling == llama3)
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  // Phi3 (spec_phi.cpp): RoPE rotates the first int(head_dim *
  // partial_rotary_factor) dims of each head (rotary_dim), the rest pass through.
  double partial_rotary_factor = 1.0;
  // LongRoPE (longrope; "su"/"yarn" in Phi3 configs): inv_freq[i] is divided by
  // short_factor[i], or by long_factor[i] when a call's largest position + 1
  // exceeds original_max_positions (as transformers decides per forward);
  // cos and sin are multiplied by attention_factor (1 elsewhere).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  // YaRN (yarn; factor, original_max_positions and attention_factor above):
  // inv_freq blends theta^(-2i/R) / factor (interpolation) and theta^(-2i/R)
  // (extrapolation) with a linear ramp between the correction dims of
  // beta_fast and beta_slow rotations (floored/ceiled when truncate); cos and
  // sin are multiplied by attention_factor (0.1 ln(factor) + 1 unless given).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

// Mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE): every decoder layer's
// MLP is a router (a bias-free linear, hidden -> n_experts) and n_experts
// SwiGLU experts of width expert_intermediate; each token goes to the top_k
// experts by softmax probability (softmax over all experts, then top-k, as
// all three families do), weighted by those probabilities, renormalised to
// sum 1 when norm_topk_prob (Mixtral always). n_experts == 0: a dense model.
// Qwen2-MoE adds a shared expert (a SwiGLU MLP of width shared_intermediate
// every token uses) scaled by sigmoid(hn . w_shared_expert_gate).
struct MoeConfig {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t expert_intermediate = 0;  // moe_intermediate_size (Qwen3-MoE), intermediate_size (Mixtral, OLMoE)
  bool norm_topk_prob = false;
  int64_t shared_intermediate = 0;  // shared_expert_intermediate_size (Qwen2-MoE); 0: no shared expert
  // The load-balancing loss (HF load_balancing_loss_func over every MoE
  // layer's router) joins the training loss with this coefficient only when
  // output_router_logits is true, as in transformers.
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;
  bool aux_loss_on() const { return n_experts > 0 && output_router_logits && router_aux_loss_coef != 0.0; }
  // gpt-oss (model/spec_gptoss.cpp): the router has a bias [E]; the routing
  // weights are the softmax over the top_k selected logits (topk_softmax;
  // the others: softmax over all E, then top-k); each expert's gate, up and
  // down projections have biases (expert_bias); the activation is the clamped
  // SwiGLU (glu_limit > 0): g' = min(g, L), u' = clamp(u, -L, L),
  // a = (u' + 1) g' sigmoid(glu_alpha g').
  bool router_bias = false;
  bool topk_softmax = false;
  bool expert_bias = false;
  double glu_limit = 0.0;
  double glu_alpha = 1.0;
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
  // OLMoE (with qk_norm): the q/k RMSNorm spans the whole projection (weights
  // [q_dim] and [kv_dim]) instead of each head.
  bool qk_norm_whole = false;
  // OLMo2: no RMSNorm before attention or the MLP; each branch's output is
  // normed (post_attention_layernorm, post_feedforward_layernorm) before its
  // residual add. Dense models only.
  bool post_norms = false;
  // Granite: the embedding's output is multiplied by embedding_multiplier,
  // each branch's output by residual_multiplier before its residual add, the
  // logits divided by logits_scaling; attention_scale > 0 (Granite's
  // attention_multiplier) replaces 1/sqrt(head_dim) as the softmax scale.
  // Dense models only; 1, 1, 1 and 0 elsewhere.
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double logits_scaling = 1.0;
  double attention_scale = 0.0;
  // SmolLM3: rope_layers[i] == 0: layer i has no RoPE (NoPE); 1: RoPE.
  // Empty: every layer rotates.
  std::vector<uint8_t> rope_layers;
  MoeConfig moe;  // n_experts 0: dense MLP
  int64_t max_positions = 2048;
  // Mistral/Mixtral's sliding_window when below max_positions (0: none). Runs
  // take sequences of at most this many tokens, where windowed attention is
  // exactly full causal attention (longer ones would need the window).
  int64_t sliding_window = 0;
  // Gemma (model/spec_gemma.cpp): every RMSNorm scales by (norm_offset + w)
  // (1: HF stores w around 0); the MLP's activation; Gemma 2/3's sandwich
  // norms (input_layernorm, then post_attention_layernorm on the attention
  // branch's output, pre_feedforward_layernorm before the MLP and
  // post_feedforward_layernorm on its output); tanh soft-capping of the
  // attention logits (c tanh(s / c)) and of the final logits (0: none);
  // sliding-window layers (local_layers[i] == 1: layer i attends to the
  // local_window most recent keys, itself included; empty: none) and the RoPE
  // those layers use when rope_local_on (Gemma 3's rope_local_base_freq).
  double norm_offset = 0.0;
  MlpAct mlp_act = MlpAct::silu;
  bool sandwich_norms = false;
  double attn_softcap = 0.0;
  double final_softcap = 0.0;
  int64_t local_window = 0;
  std::vector<uint8_t> local_layers;
  bool rope_local_on = false;
  RopeConfig rope_local;
  // gpt-oss: a learned logit per query head ([H] per layer, self_attn.sinks)
  // joins each attention row's softmax denominator (it weighs no value), and
  // o_proj has a bias (o_bias; the q/k/v biases are qkv_bias). Its sliding
  // layers use local_layers and local_window above.
  bool attn_sinks = false;
  bool o_bias = false;
  // The factor RoPE's cos and sin are multiplied by: LongRoPE's and YaRN's attention_factor, else 1.
  double rope_cos_scale() const {
    return rope.scaling == RopeScaling::longrope || rope.scaling == RopeScaling::yarn ? rope.attention_factor : 1.0;
  }
  // The attention window of layer `layer`: local_window for a local layer, else 0 (none).
  int64_t layer_window(int64_t layer) const;
  // The keys per query of causal attention over T tokens, averaged over the
  // layers and doubled (T for full causal layers, the FLOP counts' unit):
  // a sliding layer of window W < T sees (W (W + 1) / 2 + (T - W) W) / T on
  // average, so with windows attention costs less than 2 H D T per token.
  // Sinks add one logit per row and query head: not counted.
  double attention_span(int64_t T) const;
  // Whether layer `layer` rotates with rope_local instead of rope.
  bool layer_rope_local(int64_t layer) const { return rope_local_on && layer_window(layer) > 0; }
  bool is_gemma() const { return family == Family::gemma || family == Family::gemma2 || family == Family::gemma3; }
  int64_t bos_id = -1;            // -1: none
  std::vector<int64_t> eos_ids;   // may be several (Llama-3 instruct)
  std::optional<int64_t> pad_id;  // config.json's pad_token_id, kept for export (ramtrain does not pad)
  std::string dtype = "float32";  // torch_dtype / dtype of the checkpoint, informational

  // The longest sequence a run may take: max_positions, or the sliding window.
  int64_t max_sequence() const { return sliding_window > 0 && sliding_window < max_positions ? sliding_window : max_positions; }
  // What sets max_sequence(), for messages: "max_position_embeddings (N)" or
  // "sliding_window (W; longer sequences need windowed attention, ...)".
  std::string max_sequence_why() const;
  int64_t q_dim() const { return n_heads * head_dim; }
  // Dims of each head RoPE rotates: int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const;
  // Whether layer `layer` applies RoPE (SmolLM3's NoPE layers do not).
  bool layer_uses_rope(int64_t layer) const;
  // The attention's softmax scale: attention_scale, or 1/sqrt(head_dim).
  double attention_softmax_scale() const;
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  bool is_moe() const { return moe.n_experts > 0; }
  int64_t params_per_layer() const;
  // Parameters of one layer a token uses (MoE: the router and top_k experts;
  // dense: params_per_layer()).
  int64_t active_params_per_layer() const;
  // One routed expert's parameters (gate, up, down and gpt-oss's biases); 0 for a dense model.
  int64_t params_expert() const;
  int64_t params_active() const;     // embedding + active layers + final norm + head
  int64_t params_embedding() const;  // vocab * hidden
  int64_t params_lm_head() const;    // 0 when tied
  int64_t params_total() const;      // everything, tied counted once
  // Throws rt::Error listing what is inconsistent (heads not dividing, zero dims, ...).
  void validate(const std::string& source) const;
};

const char* family_name(Family f);
const char* family_architecture(Family f);  // "LlamaForCausalLM", ...

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
// "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-8b",
// "qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b", "olmo-2-1b", "olmo-2-7b", "granite-3.3-2b",
// "granite-3.3-8b", "smollm3-3b", "gemma-2-2b", "gemma-2-9b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b",
// "phi-3-mini", "phi-3.5-mini", "phi-4", "phi-4-mini", "gpt-oss-20b", "gpt-oss-120b".
ModelSpec spec_preset(const std::string& name);  // throws rt::Error listing the names
std::vector<std::string> preset_names();

}  // namespace rt
