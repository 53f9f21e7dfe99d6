// CUDA backend ops: device pointers, work queued on a cudaStream_t, nothing
// synchronised unless a function says so. Mirrors src/cpu/ops.h (the
// specification: same letters, layouts and semantics) with these precisions:
// activations, weights and activation gradients are bf16; every sum is fp32;
// norm statistics (rstd), softmax, log-sum-exp, RoPE angles and cross-entropy
// are fp32; weight gradients (dw, dbias, dtable) are fp32.
//
// Letters: N = tokens (B*T rows), B = sequences, T = sequence length,
// C = hidden, H = query heads, G = KV heads (H % G == 0), D = head_dim,
// F = MLP width, V = vocab. q/k/v are [B, T, heads, D]; linear weights [out, in].
//
// Contract (as on the CPU): forward functions write outputs with '=';
// backward functions write input gradients with '=' and ACCUMULATE weight
// gradients with '+='. Every op here is deterministic (no floating-point
// atomics): the same inputs give bit-identical outputs run to run.
// Ops that need temporaries take a caller-owned Scratch of at least the bytes
// their *_scratch_bytes() function returns; it may be reused once the op's
// stream work has finished. All pointers must be 16-byte aligned and row
// widths (C, I, O, D) multiples of 8 (checked); V may be any
// size: the LM head runs on lm_head_rows(V) rows (lm_head_cross_entropy).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/lm_head_rows.h"
#include "cuda/moe_scratch.h"
#include "model/moe_bias.h"

struct cublasContext;  // cuBLAS's handle type (cublasHandle_t), for MoeBlas

namespace rt::cuda {

using bf16 = __nv_bfloat16;
enum class DType { bf16, f32 };

// Caller-owned device memory for an op's temporaries.
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// ---- GEMM: a cuBLASLt handle, its workspace and a per-shape plan cache ----
// Row-major like rt::cpu::matmul_*; bf16 operands, fp32 accumulation; out is
// bf16 or fp32 (DType). beta is 0 (out = ...) or 1 (out += ..., fp32 out only).
// A plan (matmul descriptor, layouts, heuristic algorithm) is built the first
// time a shape is seen and reused afterwards. Not thread-safe: one Blas per
// host thread. Move-only; the destructor never throws.
class Blas {
 public:
  explicit Blas(size_t workspace_bytes = size_t{32} << 20);
  ~Blas();
  Blas(Blas&&) noexcept;
  Blas& operator=(Blas&&) noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // out[M,N] = a[M,K] @ b[N,K]^T (+ bias[N], bias needs beta == 0 and bf16 out)
  void matmul_nt(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream, const bf16* bias = nullptr);
  // out[M,N] = a[M,K] @ b[K,N]
  void matmul_nn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream);
  // out[M,N] = a[K,M]^T @ b[K,N]
  void matmul_tn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream);
  size_t plans_cached() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- embedding ----
// out[N,C] = table[ids[n], :]; ids (device) in [0, V).
void embedding_forward(bf16* out, const int32_t* ids, const bf16* table, int64_t N, int64_t C, cudaStream_t stream);
// dtable[V,C] += scatter of dout[N,C] by ids. Deterministic without atomics:
// (id, n) pairs are radix-sorted (stable), then one block per distinct id sums
// its rows in token order and adds the sum to dtable once.
size_t embedding_backward_scratch_bytes(int64_t N, int64_t V);
void embedding_backward(float* dtable, const bf16* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        Scratch scratch, cudaStream_t stream);

// ---- RMSNorm over the last dim C: y = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps) ----
// Per-head q/k norm (Qwen3) is this with rows = N*heads and C = D.
// out [N,C], rstd [N] (fp32, saved for backward), x [N,C], w [C].
// w_offset: Gemma's (1 + w) norms scale by w_offset + w (fp32), as cpu::rms_norm_forward.
// amax_key (nullable, device): atomicMax'ed with the bits of max |out| (FP8
// per-tensor scaling's amax made by the producer: Fp8Linear::tap_key).
void rms_norm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int64_t C, float eps,
                      cudaStream_t stream, float w_offset = 0.f, uint32_t* amax_key = nullptr);
// Fused residual add: sum = bf16(x + r) (written), out = norm(sum). Pass sum as
// x to rms_norm_backward.
void rms_norm_residual_forward(bf16* out, bf16* sum, float* rstd, const bf16* x, const bf16* r, const bf16* w,
                               int64_t N, int64_t C, float eps, cudaStream_t stream, float w_offset = 0.f);
// dx [N,C] (=) = d norm / dx, plus dresidual[N,C] when non-null (the gradient
// arriving on the residual stream, so the fused residual backward is one pass);
// dw [C] (+=). dw is summed over fixed row splits, then the splits in order.
size_t rms_norm_backward_scratch_bytes(int64_t N, int64_t C);
void rms_norm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                       const bf16* dresidual, int64_t N, int64_t C, Scratch scratch, cudaStream_t stream,
                       float w_offset = 0.f);

// ---- linear: out[N,O] = x[N,I] @ w[O,I]^T + bias[O] (bias may be null; bias needs bf16 out) ----
void linear_forward(Blas& blas, void* out, DType out_type, const bf16* x, const bf16* w, const bf16* bias, int64_t N,
                    int64_t I, int64_t O, cudaStream_t stream);
// dx [N,I] (=, bf16, skipped when null), dw [O,I] (+=, fp32), dbias [O] (+=, fp32, when non-null).
void linear_backward(Blas& blas, bf16* dx, float* dw, float* dbias, const bf16* dout, const bf16* x, const bf16* w,
                     int64_t N, int64_t I, int64_t O, cudaStream_t stream);
// dbias [O] += sum over the N rows of dout [N, O] (fp32; deterministic: the
// same bits for the same inputs, independent of the stream's other work).
void bias_grad(float* dbias, const bf16* dout, int64_t N, int64_t O, cudaStream_t stream);

// ---- RoPE, HF rotate-half, in place on x [N, heads, D] ----
// pos [N] (device), inv_freq [D/2] (device, fp32, from rt::cpu::rope_inv_freq);
// angle = float(pos) * inv_freq in fp32, cos/sin in fp32 (full-precision sincosf).
void rope_forward(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  cudaStream_t stream);
// dx = R(-angle) dout, in place.
void rope_backward(bf16* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   cudaStream_t stream);
// Partial rotary (Phi3), as rt::cpu::rope_forward with rotary_dim: the first
// rotary_dim dims of each head rotate (inv_freq [rotary_dim/2]), the rest are
// left as they are; cos and sin are multiplied by scale (LongRoPE's attention
// factor, 1 elsewhere).
void rope_forward(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  int64_t rotary_dim, float scale, cudaStream_t stream);
void rope_backward(bf16* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   int64_t rotary_dim, float scale, cudaStream_t stream);

// ---- SwiGLU: out = silu(gate) * up over n values ----
// The amax keys (nullable, device) as rms_norm_forward's: of out, of dgate and of dup.
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream,
                    uint32_t* amax_key = nullptr);
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                     cudaStream_t stream, uint32_t* amax_dgate = nullptr, uint32_t* amax_dup = nullptr);

// ---- gpt-oss's clamped SwiGLU over n values (cpu/ops.h swiglu_clamped_forward) ----
void swiglu_clamped_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, float limit, float alpha,
                            cudaStream_t stream);
void swiglu_clamped_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                             float limit, float alpha, cudaStream_t stream);

// ---- GeGLU (Gemma): out = gelu_tanh(gate) * up over n values ----
void geglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream);
void geglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                    cudaStream_t stream);

// ---- elementwise ----
void add_inplace(bf16* y, const bf16* x, int64_t n, cudaStream_t stream);  // y = bf16(y + x)
// y = bf16(alpha * x) in fp32 (y may be x); its own backward.
void scale(bf16* y, const bf16* x, float alpha, int64_t n, cudaStream_t stream);

// ---- LM head + cross-entropy in token chunks; [N, V] logits never exist ----
// Per chunk of <= chunk_rows rows: fp32 logits = h_chunk @ w^T (cuBLASLt), one
// fused kernel per row (max, log-sum-exp, loss = lse - logit[target],
// dlogits = grad_scale * (softmax - onehot) in bf16), then dh_chunk =
// dlogits @ w (bf16, =) and dw += dlogits^T @ h_chunk (fp32). targets (device)
// == -100 (any negative value) is ignored. The loss SUM and the count of valid
// rows are ADDED to *totals (device memory; read it back when needed).
// dh and dw may each be null (forward only when both are).
// w and dw hold Vr = lm_head_rows(V) rows (cuda/lm_head_rows.h; Vr = V when V
// is a multiple of 8): w's rows V..Vr-1 must be finite (the engine keeps them
// zero); their logits are left out of the softmax and the loss, and dw's rows
// V..Vr-1 receive only zeros.
struct CrossEntropyTotals {
  double loss_sum;
  long long n_valid;
};
size_t lm_head_cross_entropy_scratch_bytes(int64_t chunk_rows, int64_t V);
void lm_head_cross_entropy(Blas& blas, bf16* dh, float* dw, CrossEntropyTotals* totals, const bf16* h, const bf16* w,
                           const int32_t* targets, int64_t N, int64_t C, int64_t V, float grad_scale,
                           int64_t chunk_rows, Scratch scratch, cudaStream_t stream, float softcap = 0.f);

// ---- causal self-attention with GQA, scale 1/sqrt(D), D in {64, 96, 128, 256} ----
// FlashAttention style: tiles in shared memory, bf16 products with fp32
// accumulators, online softmax in fp32; T x T is never stored. Two kernel
// sets compute the same function: mma_sync (FlashAttention-2 style, any GPU
// of sm_80 or newer) and wgmma (TMA + warpgroup MMA, FlashAttention-3 style,
// compute capability 9.0 only, head_dim 64 and 128: other head dims always
// run mma_sync). Each is deterministic; their results differ in the last bits
// (other summation orders).
// masked: calls with a sliding window shorter than T, sinks or a soft cap run
// the one-warp-per-row fallback (attention_masked_forward below), the others
// as automatic: the path those layers took before the fused kernels had them
// (comparisons, benchmarks).
enum class AttentionKernels { automatic, mma_sync, wgmma, masked };
// Process-wide choice (tests and benchmarks; the environment variable
// RAMTRAIN_ATTENTION=mma|wgmma|masked sets the default). automatic: wgmma on
// compute capability 9.0, mma_sync elsewhere. Asking for wgmma on another GPU
// makes the attention calls fail with a message.
void set_attention_kernels(AttentionKernels k);
// What the next attention call with head_dim D (and soft cap softcap) on the
// current device runs: never automatic; masked only for a capped call (the
// masked choice answers for the calls without window, sinks or cap).
AttentionKernels attention_kernels_in_use(int64_t D = 128, float softcap = 0.f);
const char* attention_kernels_name(AttentionKernels k);
// q [B,T,H,D], k/v [B,T,G,D] -> out [B,T,H,D] (bf16); lse [B,H,T] (fp32, natural log).
// doc_start (packed documents, optional; device memory) [B,T] int32: the
// position of the first token of t's document within its sequence, as for
// rt::cpu::attention_forward: query t sees keys doc_start[t]..t. Documents must
// be contiguous (doc_start[b,0] = 0; doc_start[b,t] is t or doc_start[b,t-1]);
// the kernels do not check it (the tile skipping relies on it). Pass the same
// array to the backward. Key tiles wholly outside a query tile's documents are
// skipped. nullptr: one document per sequence.
// window (Gemma's and gpt-oss's sliding-window layers; 0: none): query t sees
// keys t - window + 1..t too (with documents: the later of the two starts);
// key tiles outside the window are skipped. A window of at least T is none.
// sinks [H] (gpt-oss, bf16, nullable): a logit per query head in every row's
// softmax denominator, weighing no value (cpu/attention.cpp): lse includes it
// and out is scaled down by it. softcap (Gemma 2's attention-logit soft cap c;
// 0: none): scores s = q.k / sqrt(D) become c tanh(s / c) (cpu/attention.cpp;
// both kernel sets); lse is that of the capped scores. Pass
// the same window, sinks and softcap to the backward.
void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                       int64_t H, int64_t G, int64_t D, cudaStream_t stream, const int32_t* doc_start = nullptr,
                       int64_t window = 0, const bf16* sinks = nullptr, float softcap = 0.f);
// dq [B,T,H,D] (=), dk/dv [B,T,G,D] (=, summed over the H/G query heads of
// each group). Recomputes P from lse. Deterministic: one kernel owns a key
// tile and loops over every query head of its group and every query tile, so
// dK/dV are summed in registers in a fixed order; a second kernel owns a query
// tile and computes dQ over the key tiles (no atomics, at the price of
// recomputing Q K^T and dO V^T once more). dsinks [H] fp32 (+=, nullable;
// needs sinks): d loss / d sinks, one more fixed-order sum per head.
size_t attention_backward_scratch_bytes(int64_t B, int64_t T, int64_t H);
void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                        Scratch scratch, cudaStream_t stream, const int32_t* doc_start = nullptr, int64_t window = 0,
                        const bf16* sinks = nullptr, float* dsinks = nullptr, float softcap = 0.f);
// The same function (soft cap, sliding window: keys j > t - window, 0: none;
// sinks) as a simple one-warp-per-row fallback (cuda/attention_masked.cu):
// the tests' reference and what RAMTRAIN_ATTENTION=masked runs for windows,
// sinks and the soft cap; same layouts, lse and scratch
// (attention_backward_scratch_bytes) as the fused pair; D % 32 == 0, D <= 256.
// sinks [H] (gpt-oss, bf16, nullable): a logit per query head in every row's
// softmax denominator (cpu/ops.h); dsinks [H] fp32 (+=, nullable).
void attention_masked_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                              int64_t H, int64_t G, int64_t D, int64_t window, float softcap, cudaStream_t stream,
                              const int32_t* doc_start = nullptr, const bf16* sinks = nullptr);
void attention_masked_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                               const bf16* v, const bf16* out, const float* lse, int64_t B, int64_t T, int64_t H,
                               int64_t G, int64_t D, int64_t window, float softcap, Scratch scratch,
                               cudaStream_t stream, const int32_t* doc_start = nullptr, const bf16* sinks = nullptr,
                               float* dsinks = nullptr);

// ---- mixture-of-experts MLP (src/cpu/moe.h states the contract; letters
// there: E experts, K per token, F expert width) ----
// Router logits x Wr^T in fp32 (bf16 operands), softmax and top-k in fp32
// (ties: the lower expert), a counting sort of the N*K (token, slot) pairs by
// expert (stable: increasing token within an expert), each expert's gate/up
// (bf16), SwiGLU (bf16) and down (fp32) on its gathered rows, then per token
// the weighted sum over its experts in increasing expert index (fp32, one
// final bf16 rounding), as the CPU adds them.
// The per-expert GEMMs run through MoeBlas (cuBLAS, not cuBLASLt): their row
// counts change every step, and cuBLASLt's per-shape plans (Blas) would grow
// without bound; cuBLAS needs no plan and takes any size and alignment.
// The counts go to pinned host memory in every call that runs the experts
// (a kernel's stores to mapped memory and its event, queued right after the
// routing). The grouped
// mode's forward never waits for them (its batched GEMMs run every chunk
// that could exist, their pointers made on the device); its backward waits
// once, for the weight gradients' shapes, after queuing its other products.
// The looped mode waits before its first GEMM. Experts with no token get no
// weight-gradient GEMM, and their weight gradients stay untouched. The routing statistics and the
// load-balancing gradient stay on the device (no wait for them).
// Two ways to run the expert GEMMs (MoeGemm; RAMTRAIN_MOE_GEMM=grouped|looped|auto
// picks; auto by default):
//  - grouped: every expert's product of one kind in one cublasGemmBatchedEx
//    call (gate+up, down; backward: d_a, and the gate+up input gradients)
//    over kMoeChunk-row chunks: each expert's rows start at a multiple of
//    kMoeChunk (padded; cuda/moe_scratch.h), so every chunk is the same
//    shape. A few launches per layer instead of 3 per expert, and cuBLAS's
//    batched kernels (cublasGemmGroupedBatchedEx, tried first, ran an sm_80
//    kernel at ~313 TFLOP/s on the H100). The outputs are bf16, so each
//    expert's down output o is rounded to bf16 before the fp32 weighted sum
//    over a token's experts (as transformers computes it in bf16), and the
//    input gradients of gate and up are two bf16 rows summed in fp32 with the
//    token's other experts. The weight gradients (fp32, accumulated over the
//    expert's rows) stay one cublasGemmEx per expert and kind (cuBLAS 13.1
//    refuses fp32 outputs in grouped GEMMs; batched chunks would each need
//    their own output).
//  - looped: one cublasGemmEx per expert and product, o and the input
//    gradients in fp32 (the reference the grouped path is tested against).
// The backward recomputes g, u and a, not o: the routing weight's gradient
// <dout[n], o> is taken as <ga, a> with ga = dout[n] Wd (one unweighted
// product, bf16 in both modes; + <dout[n], bd> with a down bias), and
// d_a = w ga. The weight gradients run on MoeBlas's lanes (below).
// The two agree within bf16 rounding (tests/gpu/cuda_moe_test.cpp); each is
// deterministic. One MoeBlas serves one stream at a time (its
// pinned staging is reused call after call: the copies run in the stream's
// order, and a call that reads the counts waits for its own copy's event).
// auto (MoeGemm::by_size, the default) runs a call grouped when an expert's
// GEMM is small: its average rows (N K / E) times hidden times expert width at
// most kMoeGroupedMaxWork multiply-adds (4096 rows of OLMoE's 2048 x 1024,
// ~17 GFLOP; moe_small_experts in cuda/moe_scratch.h), else looped. Why
// the size of one GEMM: the loop launches each from the host, and a small
// one finishes on the GPU before the next is launched, while a big expert's
// 128-row chunks each read its weights again. Measured on an H100
// (2026-12-06, the batched chunks), the MoE layer alone at OLMoE's shape
// (moe_bench): at 8k tokens a call (1024 rows an expert) grouped 361 expert
// TFLOP/s against looped's 252, at 32k (4096 rows) 455 against 407. The
// choice depends only on the shapes, so a run is as deterministic as either
// mode.
enum class MoeGemm { grouped, looped, by_size };
class MoeBlas {
 public:
  MoeBlas();  // the GEMM mode from RAMTRAIN_MOE_GEMM (unset: auto, MoeGemm::by_size)
  ~MoeBlas();
  MoeBlas(MoeBlas&& o) noexcept;
  MoeBlas& operator=(MoeBlas&&) = delete;
  MoeBlas(const MoeBlas&) = delete;
  MoeBlas& operator=(const MoeBlas&) = delete;
  // As Blas's (row-major, bf16 operands, fp32 accumulation; beta 0 or 1 with
  // fp32 out), for any positive sizes and 2-byte aligned operands.
  void matmul_nt(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream);
  void matmul_nn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream);
  void matmul_tn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                 cudaStream_t stream);
  MoeGemm gemm_mode() const { return mode_; }
  // Whether a call (N tokens, K of E experts each, hidden C, expert width F) runs grouped.
  bool grouped_for(int64_t N, int64_t K, int64_t E, int64_t C, int64_t F) const {
    return E <= kMoeMaxGroupedExperts &&
           (mode_ == MoeGemm::grouped || (mode_ == MoeGemm::by_size && moe_small_experts(N, K, E, C, F)));
  }
  void set_gemm_mode(MoeGemm m) { mode_ = m; }
  // Grouped GEMM calls run so far (tests: the grouped mode did not fall back).
  int64_t grouped_calls() const { return grouped_calls_; }
  void count_grouped_call() { ++grouped_calls_; }
  // cuda/moe.cu's: the handle, pinned host staging of at least `bytes`
  // (grown on demand; contents kept only until the next growth; mapped: the
  // device writes its counts there with a kernel, host_staging_on_device,
  // not a copy that would queue behind the gradient landing's big copies on
  // the copy engine) and the event recorded behind that write.
  ::cublasContext* handle() const { return h_; }
  void* host_staging(size_t bytes);
  void* host_staging_on_device() const { return host_dev_; }
  cudaEvent_t counts_event() const { return ev_; }
  // Weight-gradient lanes (RAMTRAIN_MOE_WGRAD_LANES, 0..kMaxWgradLanes;
  // unset: kWgradLanes): streams of their own, each with its own cuBLAS
  // handle, on which moe_backward runs the experts' fp32 weight gradients
  // (expert e on lane e % lanes) beside each other and beside the call's
  // remaining work. An expert's weight GEMM fills a fraction of a big GPU
  // (OLMoE's 1024 x 2048 output is 64 tiles of 128 x 256 on 132 SMs). Each
  // gradient is the same cuBLAS call on a lane as on the call's stream, so
  // the bits are those of the call's stream; 0 runs them there. Created on
  // first use.
  static constexpr int kWgradLanes = 4, kMaxWgradLanes = 16;
  int wgrad_lanes() const { return lanes_; }
  void set_wgrad_lanes(int n);
  // lanes_fork: every lane waits for the work `stream` has queued so far;
  // lanes_join: `stream` waits for every lane's queued work.
  void lanes_fork(cudaStream_t stream);
  void lanes_join(cudaStream_t stream);
  cudaStream_t lane_stream(int lane) const;
  // matmul_tn on a lane's handle and stream.
  void lane_matmul_tn(int lane, void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N,
                      int64_t K, float beta);
  // Two matmul_tn of one shape sharing b (out0 = a0^T b, out1 = a1^T b, fp32
  // out, += when beta is 1) as one strided-batched cuBLAS call, on a lane
  // (lane >= 0) or on the call's handle and `stream` (lane -1): an expert's
  // gate and up weight gradients, twice the tiles of one launch (OLMoE 128k
  // tokens a step on the H100: 4.030 -> 4.007 s). Needs the pair on
  // (kWgradPair; RAMTRAIN_MOE_WGRAD_PAIR=0 or set_wgrad_pair(false) turns it
  // off), out1 > out0 and a1 > a0 (the strides are their differences); false
  // otherwise, and nothing is queued: the caller runs two matmul_tn.
  bool matmul_tn_pair(int lane, float* out0, float* out1, const bf16* a0, const bf16* a1, const bf16* b, int64_t M,
                      int64_t N, int64_t K, float beta, cudaStream_t stream);
  int64_t wgrad_pairs() const { return wgrad_pairs_; }  // matmul_tn_pair calls run so far (tests)
  static constexpr bool kWgradPair = true;
  bool wgrad_pair() const { return pair_; }
  void set_wgrad_pair(bool on) { pair_ = on; }
  // Whether moe_backward may take gate and up as one (the pair on, and each
  // expert's up weights and gradient right after its gate's: up[e] ==
  // gate[e] + FC, dup[e] == dgate[e] + FC, the engine's layout for HF names
  // in natural order): its d_g, d_u one [rows, 2F] array, one input-gradient
  // product of width 2F and one [2F, C] weight-gradient GEMM per expert.
  bool merged_gate_up(const bf16* const* gate, const bf16* const* up, float* const* dgate, float* const* dup, int64_t E,
                      int64_t FC) const {
    if (!pair_) return false;
    for (int64_t e = 0; e < E; ++e)
      if (up[e] != gate[e] + FC || dup[e] != dgate[e] + FC) return false;
    return true;
  }
  int64_t merged_calls() const { return merged_calls_; }  // moe_backward calls that took them as one (tests)
  void count_merged_call() { ++merged_calls_; }

 private:
  struct Lane {
    ::cublasContext* h = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };
  void make_lanes();
  ::cublasContext* h_ = nullptr;
  cudaEvent_t ev_ = nullptr;
  void* host_ = nullptr;
  void* host_dev_ = nullptr;  // host_'s device address (mapped)
  size_t host_bytes_ = 0;
  MoeGemm mode_ = MoeGemm::grouped;
  int64_t grouped_calls_ = 0;
  int64_t wgrad_pairs_ = 0;
  int64_t merged_calls_ = 0;
  int lanes_ = 0;
  bool pair_ = kWgradPair;
  std::vector<Lane> lane_;  // made: lane_.size() == lanes_ (or empty before first use)
  cudaEvent_t fork_ = nullptr;
};

// MoeDims and moe_scratch_bytes (the scratch of both calls): cuda/moe_scratch.h.
// probs [N, E] (fp32, =) always; out [N, C] (bf16, =) unless null (null: the
// router only, plus the routing when tokens_per_expert is given).
// gate/up/down: host arrays of E device pointers ([F, C], [F, C], [C, F]).
// tokens_per_expert [E] (device, +=, nullable), prob_sum [E] (device, +=,
// nullable; each expert's sum over tokens in double, a fixed tree).
// biases (gpt-oss, model/moe_bias.h): the router's [E] and each expert's
// gate, up [F] and down [C] (host arrays of E device pointers), or nulls.
void moe_forward(MoeBlas& blas, bf16* out, float* probs, const bf16* x, const bf16* router, const bf16* const* gate,
                 const bf16* const* up, const bf16* const* down, const MoeDims& d, int64_t* tokens_per_expert,
                 double* prob_sum, Scratch scratch, cudaStream_t stream, const MoeBiasesT<bf16>& biases = {});
// dx [N, C] (bf16, =); drouter [E, C] and dgate/dup/ddown[e] (fp32, +=; host
// arrays of E device pointers). probs: the forward's. dprob [E] (device,
// nullable): d loss / d p[n, e] added for every row (the load-balancing loss).
void moe_backward(MoeBlas& blas, bf16* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                  const bf16* dout, const bf16* x, const float* probs, const bf16* router, const bf16* const* gate,
                  const bf16* const* up, const bf16* const* down, const MoeDims& d, const float* dprob, Scratch scratch,
                  cudaStream_t stream, const MoeBiasesT<bf16>& biases = {}, const MoeBiasGrads& bias_grads = {});
// The load-balancing loss of one micro-batch on the device, from the
// tokens_per_expert and prob_sum [L, E] its L training forwards added to
// (device arrays): model/moe_aux.h's MoeAux::finish (the CPU spec), the same
// fp64 operations in the same order. dprob [E] (=) = weight * E * T_e / R^2,
// R = L * N; step_tokens [L, E] (+= tokens, nullable) and *step_aux
// (+= aux * aux_scale, nullable) gather a step's statistics, read back
// with its loss. One thread: E * L is small.
void moe_aux_finish(float* dprob, int64_t* step_tokens, double* step_aux, const int64_t* tokens, const double* prob_sum,
                    int64_t L, int64_t E, int64_t N, double weight, float aux_scale, cudaStream_t stream);
// Qwen2-MoE's gated shared expert: y[n, :] = bf16(y + sigmoid(z[n]) o[n, :]),
// o [N, C] bf16, z [N] fp32; backward: d_o (=) = sigmoid(z) dy,
// dz (=, bf16) = sigmoid'(z) <dy[n], o[n]>.
void moe_shared_gate_forward(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C, cudaStream_t stream);
void moe_shared_gate_backward(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z, int64_t N, int64_t C,
                              cudaStream_t stream);

}  // namespace rt::cuda
