// The explicit table of HF tensor names and shapes per model family.
// The order of entries is the canonical order: global tensors first
// (embedding), then each layer's tensors in a fixed order, then the final
// norm and the LM head. HostState lays out its per-layer arenas in this order.
// An MoE layer lists its router, then expert 0's gate, up and down, expert
// 1's, ...: each expert's weights are contiguous in the layer's arena.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace rt {

enum class WeightKind {
  embed,       // model.embed_tokens.weight            [vocab, hidden]
  attn_norm,   // model.layers.{i}.input_layernorm.weight          [hidden] (OLMo2: post_attention_layernorm)
  q_proj,      // model.layers.{i}.self_attn.q_proj.weight         [q_dim, hidden]
  q_bias,      // model.layers.{i}.self_attn.q_proj.bias           [q_dim]   (qkv_bias)
  k_proj,      // model.layers.{i}.self_attn.k_proj.weight         [kv_dim, hidden]
  k_bias,      // model.layers.{i}.self_attn.k_proj.bias           [kv_dim]  (qkv_bias)
  v_proj,      // model.layers.{i}.self_attn.v_proj.weight         [kv_dim, hidden]
  v_bias,      // model.layers.{i}.self_attn.v_proj.bias           [kv_dim]  (qkv_bias)
  q_norm,      // model.layers.{i}.self_attn.q_norm.weight         [head_dim] (qk_norm)
  k_norm,      // model.layers.{i}.self_attn.k_norm.weight         [head_dim] (qk_norm)
  o_proj,      // model.layers.{i}.self_attn.o_proj.weight         [hidden, q_dim]
  mlp_norm,    // model.layers.{i}.post_attention_layernorm.weight [hidden] (OLMo2: post_feedforward_layernorm)
  gate_proj,   // model.layers.{i}.mlp.gate_proj.weight            [intermediate, hidden]
  up_proj,     // model.layers.{i}.mlp.up_proj.weight              [intermediate, hidden]
  down_proj,   // model.layers.{i}.mlp.down_proj.weight            [hidden, intermediate]
  // MoE layers (ModelSpec::is_moe) instead of gate/up/down_proj; E = experts,
  // Fe = expert width; names per family (Mixtral: block_sparse_moe., w1/w3/w2):
  router,       // model.layers.{i}.mlp.gate.weight                      [E, hidden]
  expert_gate,  // model.layers.{i}.mlp.experts.{e}.gate_proj.weight     [Fe, hidden]
  expert_up,    // model.layers.{i}.mlp.experts.{e}.up_proj.weight       [Fe, hidden]
  expert_down,  // model.layers.{i}.mlp.experts.{e}.down_proj.weight     [hidden, Fe]
  // Qwen2-MoE's shared expert: gate_proj/up_proj/down_proj named
  // mlp.shared_expert.{gate,up,down}_proj.weight ([Fs, hidden], [hidden, Fs]), and
  shared_expert_gate,  // model.layers.{i}.mlp.shared_expert_gate.weight  [1, hidden]
  // Gemma 2/3's sandwich norms (ModelSpec::sandwich_norms; attn_norm is then
  // input_layernorm, mlp_norm pre_feedforward_layernorm):
  attn_post_norm,  // model.layers.{i}.post_attention_layernorm.weight   [hidden]
  mlp_post_norm,   // model.layers.{i}.post_feedforward_layernorm.weight [hidden]
  // gpt-oss (ModelSpec::o_bias, attn_sinks, MoeConfig::router_bias, expert_bias):
  o_bias,            // model.layers.{i}.self_attn.o_proj.bias   [hidden]
  sinks,             // model.layers.{i}.self_attn.sinks         [heads]
  router_bias,       // model.layers.{i}.mlp.router.bias         [E] (the router: mlp.router.weight)
  expert_gate_bias,  // model.layers.{i}.mlp.experts.{e}.gate_proj.bias  [Fe]
  expert_up_bias,    // model.layers.{i}.mlp.experts.{e}.up_proj.bias    [Fe]
  expert_down_bias,  // model.layers.{i}.mlp.experts.{e}.down_proj.bias  [hidden]
  final_norm,  // model.norm.weight                                [hidden]
  lm_head,     // lm_head.weight                                   [vocab, hidden] (absent when tied)
};

struct WeightEntry {
  std::string name;  // HF tensor name
  WeightKind kind;
  int64_t layer;  // -1 for embed, final_norm, lm_head
  std::vector<int64_t> shape;
  bool is_norm_or_bias;  // default: no weight decay
  int64_t expert = -1;   // expert index of expert_gate/up/down, else -1
  int64_t numel() const;
};

// Every tensor the family expects, in canonical order.
std::vector<WeightEntry> weight_map(const ModelSpec& spec);
// The entries of one decoder layer (layer >= 0), in canonical order.
std::vector<WeightEntry> layer_weight_map(const ModelSpec& spec, int64_t layer);
const char* weight_kind_name(WeightKind k);

// Compares the expected map with what a checkpoint holds (name -> shape).
// Returns an empty string when they agree, otherwise a report that lists every
// missing tensor, every unexpected one and every shape mismatch by name.
struct FoundTensor {
  std::string name;
  std::vector<int64_t> shape;
};
std::string weight_map_check(const ModelSpec& spec, const std::vector<FoundTensor>& found);

// Tensors a HF checkpoint stores fused (Phi3: self_attn.qkv_proj.weight holds
// the q, k and v rows, mlp.gate_up_proj.weight the gate and up rows): each
// names the weight-map entries whose rows it concatenates, in row order
// (consecutive in canonical order). Empty for the other families.
// gpt-oss stores each layer's experts in four tensors (the weight-map names
// mlp.experts.{e}.{gate,up,down}_proj.{weight,bias} are ramtrain's own):
//   mlp.experts.gate_up_proj      [E, hidden, 2 Fe]  [e, c, 2f] = gate_e[f, c], [e, c, 2f+1] = up_e[f, c]
//   mlp.experts.gate_up_proj_bias [E, 2 Fe]          [e, 2f] = gate_bias_e[f], [e, 2f+1] = up_bias_e[f]
//   mlp.experts.down_proj         [E, Fe, hidden]    [e, f, c] = down_e[c, f]
//   mlp.experts.down_proj_bias    [E, hidden]        the down biases' rows
// A group of `interleave` consecutive parts (same shape [R, K], or [R]) is
// stored element-interleaved, each part transposed to [K, R] first when
// `transpose`: part w's element (r, k) of group g lies at
//   base(g) + (transpose ? k R + r : r K + k) * interleave + w,
// base(g) the elements of the groups before. interleave 1, no transpose:
// plain row concatenation (Phi3).
struct FusedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> parts;
  int64_t interleave = 1;
  bool transpose = false;
  bool plain() const { return interleave == 1 && !transpose; }
};
std::vector<FusedTensor> fused_tensors(const ModelSpec& spec);
// Where element i of part k (shape part_shape) lies in the fused tensor f.
// part_base: the elements of f's parts before part k's group.
int64_t fused_index(const FusedTensor& f, size_t k, const std::vector<int64_t>& part_shape, int64_t part_base,
                    int64_t i);
// Copies part k out of the whole fused tensor (load) or into it (export);
// part_shapes: every part's shape, in f.parts order.
void fused_gather(const FusedTensor& f, const std::vector<std::vector<int64_t>>& part_shapes, size_t k,
                  const float* fused, float* part);
void fused_scatter(const FusedTensor& f, const std::vector<std::vector<int64_t>>& part_shapes, size_t k,
                   const float* part, float* fused);
// gpt-oss's hub checkpoints store gate_up_proj and down_proj in MXFP4:
// NAME_blocks [E, R, K/32, 16] uint8, two e2m1 codes a byte (the low nibble
// the even element: 0 0.5 1 1.5 2 3 4 6, bit 3 the sign), and NAME_scales
// [E, R, K/32] uint8, one e8m0 scale 2^(s - 127) per 32 consecutive
// elements of a row; they hold W [E, R, K] whose transpose [E, K, R] is NAME.
// The shape of NAME for blocks and scales of these shapes; empty when they do not fit together.
std::vector<int64_t> mxfp4_fused_shape(const std::vector<int64_t>& blocks, const std::vector<int64_t>& scales);
// out [E, K, R] (fp32, exact: every code times its power of two).
void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t E, int64_t R, int64_t K, float* out);

// weight_map in the checkpoint's layout: each fused group's entries replaced
// by one entry (the fused name and shape, the first part's kind) in its place.
// weight_map_check compares a checkpoint against this.
std::vector<WeightEntry> hf_weight_map(const ModelSpec& spec);

}  // namespace rt
