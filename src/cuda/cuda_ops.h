// CudaOps: the CUDA backend bound to the layer templates (model/block.h).
// bf16 activations and weights, fp32 weight gradients and statistics; every
// call is queued on one compute stream. Mirrors CpuOps (cpu/cpu_ops.h),
// MatmulMode::fp8 / fp8_tensor included (bf16-output linears through cuda/fp8.h's
// Fp8Linear wherever fp8_linear_eligible holds; the fp32-output linear and
// the narrow widths stay bf16).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "core/fp8.h"
#include "cuda/device_memory.h"
#include "cuda/fp8.h"
#include "cuda/ops.h"
#include "model/moe_bias.h"

namespace rt::cuda {

class CudaOps {
 public:
  using act_t = bf16;
  using weight_t = bf16;
  static constexpr bool supports_moe = true;  // moe_forward / moe_backward (cuda/ops.h, cuda/moe.cu)
  template <class T>
  using Buffer = DevBuf<T>;

  CudaOps(DeviceAllocator& alloc, Blas& blas, cudaStream_t stream, const float* inv_freq, Scratch scratch)
      : alloc_(alloc), blas_(blas), s_(stream), inv_freq_(inv_freq), scratch_(scratch) {}

  template <class T>
  Buffer<T> alloc(int64_t n) {
    return Buffer<T>(alloc_, n, "block activations");
  }
  cudaStream_t stream() const { return s_; }
  Blas& blas() { return blas_; }
  Scratch scratch() const { return scratch_; }

  // Gemma's (1 + w) norms: every norm of the model scales by (offset + w) (ModelSpec::norm_offset).
  void set_norm_offset(float offset) { norm_offset_ = offset; }
  void rms_norm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int64_t C, float eps) {
    cuda::rms_norm_forward(out, rstd, x, w, N, C, eps, s_, norm_offset_, tap_key(out, N * C));
  }
  void rms_norm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                         int64_t N, int64_t C) {
    cuda::rms_norm_backward(dx, dw, dout, x, w, rstd, nullptr, N, C, scratch_, s_, norm_offset_);
  }
  // fp8 needs a Hopper GPU, fp8_tensor Ada or Hopper (cuda/fp8.h
  // fp8_supported; make_cuda_backend checks). Set before the first linear.
  void set_matmul(MatmulMode m) {
    RT_CHECK(!fp8_ || m == matmul_, "[cuda ops] internal: set_matmul after the FP8 linear was made");
    matmul_ = m;
  }
  MatmulMode matmul() const { return matmul_; }
  void linear_forward(bf16* out, const bf16* x, const bf16* w, const bf16* b, int64_t N, int64_t I, int64_t O) {
    if (fp8_for(N, I, O)) {
      fp8().forward(out, x, w, b, N, I, O, s_);
      return;
    }
    cuda::linear_forward(blas_, out, DType::bf16, x, w, b, N, I, O, s_);
  }
  // fp32 out (the shared expert's gate logit [N, 1]): any O, through MoeBlas.
  void linear_forward(float* out, const bf16* x, const bf16* w, const bf16* b, int64_t N, int64_t I, int64_t O) {
    RT_CHECK(!b, "[cuda ops] a linear layer with fp32 output takes no bias");
    moe_blas().matmul_nt(out, DType::f32, x, w, N, O, I, 0.f, s_);
  }
  // An input several projections read (q/k/v: xn; gate/up: hn): with
  // --matmul fp8 its FP8 codes are made once while the returned guard lives
  // (Fp8Linear::share_input; bit-identical). The caller must not write x
  // meanwhile. bf16: nothing.
  class SharedInput {
   public:
    explicit SharedInput(Fp8Linear* f) : f_(f) {}
    SharedInput(const SharedInput&) = delete;
    SharedInput& operator=(const SharedInput&) = delete;
    ~SharedInput() {
      if (f_) f_->end_share();
    }

   private:
    Fp8Linear* f_;
  };
  [[nodiscard]] SharedInput share_input(const bf16* x, int64_t N, int64_t I) {
    if (!matmul_is_fp8(matmul_)) return SharedInput(nullptr);
    fp8().share_input(x, N, I);
    return SharedInput(&fp8());
  }
  // --matmul fp8 --fp8-scaling tensor: x[n]'s amax made by the op that
  // writes x next (RMSNorm's and SwiGLU's forward, SwiGLU's backward), not by
  // a pass over x before its codes (Fp8Linear::tap_begin; bit-identical),
  // while the returned guard lives. The caller must not write x by any other
  // op meanwhile. bf16, block scales, RAMTRAIN_FP8_FUSED_AMAX=0: nothing.
  class AmaxTap {
   public:
    AmaxTap(Fp8Linear* f, int i) : f_(f), i_(i) {}
    AmaxTap(const AmaxTap&) = delete;
    AmaxTap& operator=(const AmaxTap&) = delete;
    ~AmaxTap() {
      if (f_) f_->tap_end(i_);
    }

   private:
    Fp8Linear* f_;
    int i_;
  };
  [[nodiscard]] AmaxTap amax_tap(const bf16* x, int64_t n) {
    if (matmul_ != MatmulMode::fp8_tensor || !fused_amax_) return AmaxTap(nullptr, -1);
    const int i = fp8().tap_begin(x, n, s_);
    return AmaxTap(i >= 0 ? &fp8() : nullptr, i);
  }
  // Off: every per-tensor amax by its own pass (the guards above do nothing);
  // for tests that compare the two, and RAMTRAIN_FP8_FUSED_AMAX=0.
  void set_fused_amax(bool on) { fused_amax_ = on; }
  // A layer's weights used by several micro-batches in a row (layer-major):
  // with --matmul fp8 their codes are made once while the guard lives
  // (Fp8Linear::share_weights; bit-identical). bf16: nothing.
  class SharedWeights {
   public:
    explicit SharedWeights(Fp8Linear* f) : f_(f) {}
    SharedWeights(const SharedWeights&) = delete;
    SharedWeights& operator=(const SharedWeights&) = delete;
    ~SharedWeights() {
      if (f_) f_->end_share_weights();
    }

   private:
    Fp8Linear* f_;
  };
  [[nodiscard]] SharedWeights share_weights() {
    if (!matmul_is_fp8(matmul_)) return SharedWeights(nullptr);
    fp8().share_weights();
    return SharedWeights(&fp8());
  }
  void linear_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x, const bf16* w, int64_t N,
                       int64_t I, int64_t O) {
    if (fp8_for(N, I, O)) {
      fp8().backward(dx, dw, db, dout, x, w, N, I, O, s_);
      return;
    }
    if (O % 8 == 0) {
      cuda::linear_backward(blas_, dx, dw, db, dout, x, w, N, I, O, s_);
      return;
    }
    // widths cuBLASLt's plans refuse (the shared expert's gate, O = 1): cuBLAS
    RT_CHECK(!db, "[cuda ops] linear_backward with O = ", O, " (not a multiple of 8) takes no bias");
    if (dx) moe_blas().matmul_nn(dx, DType::bf16, dout, w, N, I, O, 0.f, s_);
    moe_blas().matmul_tn(dw, DType::f32, dout, x, O, I, N, 1.f, s_);
  }
  // Gemma 3's local layers rotate with a second set of frequencies (set_local_rope, device fp32 [rotary_dim/2]).
  void set_local_rope(const float* inv_freq_local) { inv_freq_local_ = inv_freq_local; }
  // Phi3: the rotated dims (0: the whole head) and LongRoPE's cos/sin scale;
  // inv_freq holds rotary_dim / 2 frequencies.
  void set_rope(int64_t rotary_dim, float scale) {
    rotary_dim_ = rotary_dim;
    rope_scale_ = scale;
  }
  void rope_forward(bf16* x, const int32_t* pos, int64_t N, int64_t heads, int64_t D, bool local = false) {
    cuda::rope_forward(x, pos, freqs(local), N, heads, D, rotary_dim_ > 0 ? rotary_dim_ : D, rope_scale_, s_);
  }
  void rope_backward(bf16* dx, const int32_t* pos, int64_t N, int64_t heads, int64_t D, bool local = false) {
    cuda::rope_backward(dx, pos, freqs(local), N, heads, D, rotary_dim_ > 0 ? rotary_dim_ : D, rope_scale_, s_);
  }
  // Gemma's and gpt-oss's sliding windows (keys > t - window), gpt-oss's
  // sinks and Gemma 2's soft cap run the fused kernels;
  // under RAMTRAIN_ATTENTION=masked they run the simple fallback
  // (cuda/attention_masked.cu; cuda::attention_forward decides).
  void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                         int64_t H, int64_t G, int64_t D, const int32_t* doc_start = nullptr, int64_t window = 0,
                         float softcap = 0.f, const bf16* sinks = nullptr) {
    cuda::attention_forward(out, lse, q, k, v, B, T, H, G, D, s_, doc_start, window, sinks, softcap);
  }
  void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                          const bf16* out, const float* lse, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                          const int32_t* doc_start = nullptr, int64_t window = 0, float softcap = 0.f,
                          const bf16* sinks = nullptr, float* dsinks = nullptr) {
    cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, G, D, scratch_, s_, doc_start, window, sinks,
                             dsinks, softcap);
  }
  void swiglu_forward(bf16* out, const bf16* g, const bf16* u, int64_t n) {
    cuda::swiglu_forward(out, g, u, n, s_, tap_key(out, n));
  }
  void swiglu_backward(bf16* dg, bf16* du, const bf16* dout, const bf16* g, const bf16* u, int64_t n) {
    cuda::swiglu_backward(dg, du, dout, g, u, n, s_, tap_key(dg, n), tap_key(du, n));
  }
  void geglu_forward(bf16* out, const bf16* g, const bf16* u, int64_t n) { cuda::geglu_forward(out, g, u, n, s_); }
  void geglu_backward(bf16* dg, bf16* du, const bf16* dout, const bf16* g, const bf16* u, int64_t n) {
    cuda::geglu_backward(dg, du, dout, g, u, n, s_);
  }
  void add_inplace(bf16* y, const bf16* x, int64_t n) { cuda::add_inplace(y, x, n, s_); }
  void scale(bf16* y, const bf16* x, float alpha, int64_t n) { cuda::scale(y, x, alpha, n, s_); }
  // MoE (Moe: ModelSpec::MoeConfig, a template so this header needs no model/
  // include). The op scratch must hold moe_scratch_bytes; tokens_per_expert,
  // prob_sum and dprob are device memory (engine/cuda/moe_routing.h).
  template <class Moe>
  void moe_forward(bf16* out, float* probs, const bf16* x, const bf16* router, const bf16* const* gate,
                   const bf16* const* up, const bf16* const* down, int64_t N, int64_t C, const Moe& m,
                   int64_t* tokens_per_expert, double* prob_sum, const MoeBiasesT<bf16>& biases = {}) {
    cuda::moe_forward(moe_blas(), out, probs, x, router, gate, up, down, moe_dims(N, C, m), tokens_per_expert, prob_sum,
                      scratch_, s_, biases);
  }
  template <class Moe>
  void moe_backward(bf16* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                    const bf16* dout, const bf16* x, const float* probs, const bf16* router, const bf16* const* gate,
                    const bf16* const* up, const bf16* const* down, int64_t N, int64_t C, const Moe& m,
                    const float* dprob, const MoeBiasesT<bf16>& biases = {}, const MoeBiasGrads& bias_grads = {}) {
    cuda::moe_backward(moe_blas(), dx, drouter, dgate, dup, ddown, dout, x, probs, router, gate, up, down,
                       moe_dims(N, C, m), dprob, scratch_, s_, biases, bias_grads);
  }
  void moe_shared_gate_forward(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C) {
    cuda::moe_shared_gate_forward(y, o, z, N, C, s_);
  }
  void moe_shared_gate_backward(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z, int64_t N,
                                int64_t C) {
    cuda::moe_shared_gate_backward(d_o, dz, dy, o, z, N, C, s_);
  }
  void copy(bf16* dst, const bf16* src, int64_t n) {
    if (dst != src)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(bf16), cudaMemcpyDeviceToDevice, s_));
  }

 private:
  DeviceAllocator& alloc_;
  Blas& blas_;
  cudaStream_t s_;
  template <class Moe>
  static MoeDims moe_dims(int64_t N, int64_t C, const Moe& m) {
    return MoeDims{N,
                   C,
                   m.n_experts,
                   m.top_k,
                   m.expert_intermediate,
                   m.norm_topk_prob,
                   m.topk_softmax,
                   static_cast<float>(m.glu_limit),
                   static_cast<float>(m.glu_alpha)};
  }
  // Created on first use (dense models never make one).
  MoeBlas& moe_blas() {
    if (!moe_blas_) moe_blas_ = std::make_unique<MoeBlas>();
    return *moe_blas_;
  }

  const float* freqs(bool local) const {
    RT_CHECK(!local || inv_freq_local_, "[cuda ops] internal: a local RoPE layer without set_local_rope");
    return local ? inv_freq_local_ : inv_freq_;
  }
  const float* inv_freq_;
  const float* inv_freq_local_ = nullptr;
  float norm_offset_ = 0.f;
  int64_t rotary_dim_ = 0;
  float rope_scale_ = 1.f;
  Scratch scratch_;
  std::unique_ptr<MoeBlas> moe_blas_;
  MatmulMode matmul_ = MatmulMode::bf16;
  std::unique_ptr<Fp8Linear> fp8_;  // created on the first FP8 linear
  bool fp8_for(int64_t N, int64_t I, int64_t O) const { return matmul_is_fp8(matmul_) && fp8_linear_eligible(N, I, O); }
  Fp8Linear& fp8() {
    if (!fp8_) fp8_ = std::make_unique<Fp8Linear>(matmul_);
    return *fp8_;
  }
  // The amax key a producer writing out[n] fills (an open tap on it), else null.
  uint32_t* tap_key(const bf16* out, int64_t n) { return fp8_ ? fp8_->tap_key(out, n) : nullptr; }
  bool fused_amax_ = fp8_fused_amax_default();
};

// Sum of squares of n fp32 values into *out (device double), deterministic
// (fixed blocks, partials summed in order). scratch: sum_squares_scratch_bytes(n).
size_t sum_squares_scratch_bytes(int64_t n);
void sum_squares(double* out, const float* x, int64_t n, Scratch scratch, cudaStream_t stream);
// The sum of squares of x[0, n) in rt::sum_squares's exact order, the same
// double bit for bit (cuda/sum_squares_order.h): out[0] = the sum, out[1] =
// fp32(sqrt(sum) + eps) held as a double (Muon's norm); partial: scratch of
// sum_squares_ordered_doubles(n) - 2 doubles (one per block). All device
// memory, queued on stream.
void sum_squares_ordered(double* out, const float* x, int64_t n, double* partial, double eps, cudaStream_t stream);

}  // namespace rt::cuda
