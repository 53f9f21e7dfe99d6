// CPU reference of the mixture-of-experts MLP (Qwen3-MoE, Mixtral, OLMoE as
// transformers computes them), plain fp32, and the top-k routing they share.
//
// Letters: N = tokens, C = hidden, E = experts, K = experts per token (top-k),
// F = expert width. Weights use the HF layout [out, in]: router [E, C]; expert
// e's gate and up [F, C], down [C, F], passed as arrays of E pointers.
//
//   p[n]  = softmax(x[n] Wr^T)                       (fp32, over all E)
//   S[n]  = the K largest p[n, e] (ties: the lower e first)
//   w[n]  = p[n, S] (/ sum p[n, S] when norm_topk)
//   out[n] = sum over e in S[n], in increasing e, of w[n, e] * expert_e(x[n]),
//   expert_e(v) = (silu(v We_g^T) * v We_u^T) We_d^T
//
// gpt-oss (MoeVariant): the router has a bias, p holds the logits
// l = x Wr^T + br, S the K largest l, w = softmax(l_S); each expert has
// biases and the clamped SwiGLU (cpu/ops.h swiglu_clamped_forward):
//   expert_e(v) = act(v We_g^T + bg_e, v We_u^T + bu_e) We_d^T + bd_e.
//
// Contract as cpu/ops.h: forward writes '=', backward writes dx with '=' and
// accumulates weight gradients with '+='. The backward recomputes every
// expert's activations from x (nothing but p is kept from the forward).
#pragma once
#include <cstdint>
#include <vector>

#include "model/moe_bias.h"

namespace rt::cpu {

// The K experts of one row of probabilities p[E], largest first (ties: lower
// index first), and their weights (renormalised to sum 1 when norm_topk).
void moe_topk(const float* p, int64_t E, int64_t K, bool norm_topk, int32_t* idx, float* w);

// gpt-oss's layer (every field off: the Qwen/Mixtral/OLMoE layer above).
struct MoeVariant {
  bool topk_softmax = false;  // p holds the router logits; w = softmax over the K selected
  float glu_limit = 0.f;      // > 0: the clamped SwiGLU with glu_alpha
  float glu_alpha = 1.f;
  const float* router_bias = nullptr;       // [E]
  const float* const* gate_bias = nullptr;  // E pointers, [F] each
  const float* const* up_bias = nullptr;    // E pointers, [F] each
  const float* const* down_bias = nullptr;  // E pointers, [C] each
};
// The gradients of MoeVariant's biases: rt::MoeBiasGrads (model/moe_bias.h).
using rt::MoeBiasGrads;

// probs [N, E] (=) always; out [N, C] (=) unless null (null: the router only).
// tokens_per_expert [E] (+=, nullable): tokens whose top-K holds e.
// prob_sum [E] (+=, nullable): sum over n of p[n, e], in double.
void moe_forward(float* out, float* probs, const float* x, const float* router, const float* const* gate,
                 const float* const* up, const float* const* down, int64_t N, int64_t C, int64_t E, int64_t K,
                 int64_t F, bool norm_topk, int64_t* tokens_per_expert, double* prob_sum,
                 const MoeVariant& variant = {});

// dx [N, C] (=) from dout [N, C]; drouter [E, C], dgate/dup/ddown[e] (+=).
// probs: the forward's. dprob [E] (nullable): a gradient d loss / d p[n, e]
// added for every row n (the load-balancing loss, model/moe_aux.h).
void moe_backward(float* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                  const float* dout, const float* x, const float* probs, const float* router, const float* const* gate,
                  const float* const* up, const float* const* down, int64_t N, int64_t C, int64_t E, int64_t K,
                  int64_t F, bool norm_topk, const float* dprob, const MoeVariant& variant = {},
                  const MoeBiasGrads& bias_grads = {});

// Qwen2-MoE's gated shared expert: y[n, :] += sigmoid(z[n]) * o[n, :] over
// o [N, C], z [N]; backward: d_o (=) = sigmoid(z) dy, dz (=) = sigmoid'(z) <dy[n], o[n]>.
void moe_shared_gate_forward(float* y, const float* o, const float* z, int64_t N, int64_t C);
void moe_shared_gate_backward(float* d_o, float* dz, const float* dy, const float* o, const float* z, int64_t N,
                              int64_t C);

}  // namespace rt::cpu
