// CpuOps: the CPU backend bound to the layer templates (model/block.h,
// model/model.h). fp32 activations and weights; every method forwards to
// the reference functions of cpu/ops.h. With MatmulMode::fp8 (or fp8_tensor) the linear
// layers (in block.h: the projections and the shared expert; the embedding,
// LM head and router have ops of their own) run the FP8 twin (cpu/fp8.h)
// wherever fp8_linear_eligible holds, as the CUDA backend does.
#pragma once
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "cpu/fp8.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "model/spec.h"

namespace rt {

class CpuOps {
 public:
  using act_t = float;
  using weight_t = float;
  template <class T>
  using Buffer = std::vector<T>;
  static constexpr bool supports_moe = true;  // moe_forward / moe_backward (cpu/moe.h)

  // Gemma: every norm scales by (norm_offset + w); local layers may rotate with rope_local.
  explicit CpuOps(const ModelSpec& s) : rope_(s), norm_offset_(static_cast<float>(s.norm_offset)) {}

  template <class T>
  Buffer<T> alloc(int64_t n) {
    return Buffer<T>(static_cast<size_t>(n));
  }

  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
    cpu::embedding_forward(out, ids, table, N, C);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
    cpu::embedding_backward(dtable, dout, ids, N, C);
  }
  void rms_norm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps) {
    cpu::rms_norm_forward(out, rstd, x, w, N, C, eps, norm_offset_);
  }
  void rms_norm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                         int64_t N, int64_t C) {
    cpu::rms_norm_backward(dx, dw, dout, x, w, rstd, N, C, norm_offset_);
  }
  void set_matmul(MatmulMode m) { matmul_ = m; }
  MatmulMode matmul() const { return matmul_; }
  void linear_forward(float* out, const float* x, const float* w, const float* b, int64_t N, int64_t I, int64_t O) {
    if (matmul_ == MatmulMode::fp8 && fp8_linear_eligible(N, I, O))
      cpu::fp8_linear_forward(out, x, w, b, N, I, O);
    else if (matmul_ == MatmulMode::fp8_tensor && fp8_linear_eligible(N, I, O))
      cpu::fp8_tensor_linear_forward(out, x, w, b, N, I, O);
    else
      cpu::linear_forward(out, x, w, b, N, I, O);
  }
  // CudaOps shares an input's FP8 codes among the projections that read it;
  // the twin quantizes per call (the same codes), so there is nothing to hold.
  struct SharedInput {};
  SharedInput share_input(const float*, int64_t, int64_t) { return {}; }
  // CudaOps takes a per-tensor amax from the op that writes the tensor; the
  // twin's quantizer finds the same amax in its own pass.
  struct AmaxTap {};
  AmaxTap amax_tap(const float*, int64_t) { return {}; }
  void linear_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w, int64_t N,
                       int64_t I, int64_t O) {
    if (matmul_ == MatmulMode::fp8 && fp8_linear_eligible(N, I, O))
      cpu::fp8_linear_backward(dx, dw, db, dout, x, w, N, I, O);
    else if (matmul_ == MatmulMode::fp8_tensor && fp8_linear_eligible(N, I, O))
      cpu::fp8_tensor_linear_backward(dx, dw, db, dout, x, w, N, I, O);
    else
      cpu::linear_backward(dx, dw, db, dout, x, w, N, I, O);
  }
  // Phi3: partial rotary and LongRoPE's two tables (cpu::RopeTables); local:
  // the spec's rope_local (Gemma 3's sliding layers) instead of its rope.
  void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t heads, int64_t D, bool local = false) {
    cpu::rope_forward(x, pos, rope_.select(pos, N, local), N, heads, D, rope_.rotary_dim, rope_.scale);
  }
  void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t heads, int64_t D, bool local = false) {
    cpu::rope_backward(dx, pos, rope_.select(pos, N, local), N, heads, D, rope_.rotary_dim, rope_.scale);
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                         int64_t H, int64_t G, int64_t D, const int32_t* doc_start = nullptr, int64_t window = 0,
                         float softcap = 0.f, const float* sinks = nullptr) {
    cpu::attention_forward(out, lse, q, k, v, B, T, H, G, D, doc_start, window, softcap, sinks);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                          int64_t G, int64_t D, const int32_t* doc_start = nullptr, int64_t window = 0,
                          float softcap = 0.f, const float* sinks = nullptr, float* dsinks = nullptr) {
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, G, D, doc_start, window, softcap, sinks,
                            dsinks);
  }
  void swiglu_forward(float* out, const float* g, const float* u, int64_t n) { cpu::swiglu_forward(out, g, u, n); }
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
    cpu::swiglu_backward(dg, du, dout, g, u, n);
  }
  void geglu_forward(float* out, const float* g, const float* u, int64_t n) { cpu::geglu_forward(out, g, u, n); }
  void geglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
    cpu::geglu_backward(dg, du, dout, g, u, n);
  }
  void add_inplace(float* y, const float* x, int64_t n) { cpu::add_inplace(y, x, n); }
  void scale(float* y, const float* x, float alpha, int64_t n) { cpu::scale(y, x, alpha, n); }
  void moe_forward(float* out, float* probs, const float* x, const float* router, const float* const* gate,
                   const float* const* up, const float* const* down, int64_t N, int64_t C, const MoeConfig& m,
                   int64_t* tokens_per_expert, double* prob_sum, const MoeBiasesT<float>& biases = {}) {
    cpu::moe_forward(out, probs, x, router, gate, up, down, N, C, m.n_experts, m.top_k, m.expert_intermediate,
                     m.norm_topk_prob, tokens_per_expert, prob_sum, variant(m, biases));
  }
  void moe_shared_gate_forward(float* y, const float* o, const float* z, int64_t N, int64_t C) {
    cpu::moe_shared_gate_forward(y, o, z, N, C);
  }
  void moe_shared_gate_backward(float* d_o, float* dz, const float* dy, const float* o, const float* z, int64_t N,
                                int64_t C) {
    cpu::moe_shared_gate_backward(d_o, dz, dy, o, z, N, C);
  }
  void moe_backward(float* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                    const float* dout, const float* x, const float* probs, const float* router,
                    const float* const* gate, const float* const* up, const float* const* down, int64_t N, int64_t C,
                    const MoeConfig& m, const float* dprob, const MoeBiasesT<float>& biases = {},
                    const MoeBiasGrads& bias_grads = {}) {
    cpu::moe_backward(dx, drouter, dgate, dup, ddown, dout, x, probs, router, gate, up, down, N, C, m.n_experts,
                      m.top_k, m.expert_intermediate, m.norm_topk_prob, dprob, variant(m, biases), bias_grads);
  }
  void copy(float* dst, const float* src, int64_t n) {
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  double lm_head_cross_entropy(float* dh, float* dw, const float* h, const float* w, const int32_t* targets, int64_t N,
                               int64_t C, int64_t V, float grad_scale, int64_t chunk_rows, int64_t* n_valid,
                               float softcap = 0.f) {
    return cpu::lm_head_cross_entropy(dh, dw, h, w, targets, N, C, V, grad_scale, chunk_rows, n_valid, softcap);
  }

 private:
  // gpt-oss's routing, activation and biases (cpu/moe.h)
  static cpu::MoeVariant variant(const MoeConfig& m, const MoeBiasesT<float>& b) {
    return cpu::MoeVariant{
        m.topk_softmax, static_cast<float>(m.glu_limit), static_cast<float>(m.glu_alpha), b.router, b.gate, b.up,
        b.down};
  }
  cpu::RopeTables rope_;
  float norm_offset_ = 0.f;
  MatmulMode matmul_ = MatmulMode::bf16;
};

}  // namespace rt
