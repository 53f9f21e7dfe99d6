// CPU reference ops, plain fp32: the specification every faster backend is
// tested against. One function per op and direction.
//
// Letters: N = tokens in the batch (B*T rows), B = sequences, T = sequence
// length, C = hidden, K/M generic GEMM dims, H = query heads, G = KV heads
// (H % G == 0), D = head_dim, F = MLP width, V = vocab.
// Layout: activations are row-major [N, ...]; q/k/v are [B, T, heads, D];
// linear weights use the HF layout [out, in].
//
// Contract: forward functions write their outputs with '='. Backward
// functions write input gradients with '=' and ACCUMULATE weight gradients
// (dw, dbias, dtable) with '+='. Parallel work is split in fixed blocks
// (core/thread_pool.h), so every result is bit-identical from run to run.
#pragma once
#include <cstdint>
#include <vector>

#include "model/spec.h"

namespace rt::cpu {

// out[M,N] = a[M,K] @ b[N,K]^T   (b stored row-major [N,K]); beta 0 or 1: out = beta*out + ...
void matmul_nt(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta = 0.f);
// out[M,N] = a[M,K] @ b[K,N]
void matmul_nn(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta = 0.f);
// out[M,N] = a[K,M]^T @ b[K,N]
void matmul_tn(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta = 0.f);

// ---- embedding ----
// out[N,C] = table[ids[n], :]. ids must be in [0, V) (checked by the caller's loader).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C);
// dtable[V,C] += scatter of dout[N,C] by ids. Each row's sum runs in token
// order, one row per thread at a time: the same bits for any thread count.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C);
// The same with dout in bf16 (raw bits), widened as read: bf16 -> fp32 is
// exact, so this equals the fp32 call on the widened dout bit for bit.
void embedding_backward(float* dtable, const uint16_t* dout_bf16, const int32_t* ids, int64_t N, int64_t C);

// ---- RMSNorm: y = (w_offset + w) * x / sqrt(mean(x^2) + eps), over the last dim C ----
// x, out [N,C]; w [C]; rstd [N] saved for backward. w_offset: 0, or 1 for
// Gemma's (1 + w) norms (ModelSpec::norm_offset).
void rms_norm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                      float w_offset = 0.f);
// dx [N,C] (=), dw [C] (+=).
void rms_norm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                       int64_t N, int64_t C, float w_offset = 0.f);

// ---- linear: out[N,O] = x[N,I] @ w[O,I]^T + bias[O] (bias may be null) ----
void linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I, int64_t O);
// dx [N,I] (=, skipped when dx is null), dw [O,I] (+=), dbias [O] (+=, when non-null).
void linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w, int64_t N,
                     int64_t I, int64_t O);

// ---- RoPE, HF rotate-half convention ----
// inv_freq[R/2] for R = int(D * partial_rotary_factor) rotated dims (D = head_dim):
// theta^(-2i/R), with llama3 or linear scaling applied when configured; LongRoPE
// divides it by short_factor[i], or long_factor[i] when long_factors is set.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t D, bool long_factors = false);
// In place on x [N, heads, D] with per-row positions pos[N]:
// x1 = x[..., :D/2], x2 = x[..., D/2:]; angle = pos * inv_freq (fp32);
// out = [x1*cos - x2*sin, x2*cos + x1*sin].
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D);
// In place: dx = R(-angle) dout (the transpose of the rotation).
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D);
// Partial rotary (Phi3): only the first R = rotary_dim dims of each head
// rotate, x1 = x[..., :R/2], x2 = x[..., R/2:R]; dims R..D pass through. cos
// and sin are multiplied by `scale` (LongRoPE's attention factor; 1 elsewhere),
// so the backward is dx = scale * R(-angle) dout on those dims.
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  int64_t rotary_dim, float scale);
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   int64_t rotary_dim, float scale);
// A spec's RoPE tables. LongRoPE has two, picked per call as transformers
// picks them per forward: the long one when the call's largest position + 1
// exceeds original_max_position_embeddings.
struct RopeTables {
  std::vector<float> inv_short;  // the only table without LongRoPE
  std::vector<float> inv_long;   // LongRoPE only
  std::vector<float> inv_local;  // rope_local_on only (Gemma 3's sliding layers)
  int64_t rotary_dim = 0;
  float scale = 1.f;
  int64_t long_above = 0;  // LongRoPE: original_max_position_embeddings
  explicit RopeTables(const ModelSpec& s);
  bool use_long(const int32_t* pos, int64_t N) const;
  // local: Gemma 3's sliding layers rotate with the spec's rope_local instead.
  const float* select(const int32_t* pos, int64_t N, bool local = false) const;
};

// ---- causal self-attention with GQA, fp32 softmax, scale 1/sqrt(D) ----
// q [B,T,H,D], k/v [B,T,G,D] -> out [B,T,H,D]; lse [B,H,T] (log-sum-exp per row) saved for backward.
// doc_start (packed documents, optional) [B,T]: position of the first token of
// t's document within its sequence; query t then sees keys doc_start[t]..t
// only. Documents are contiguous: doc_start[b,0] = 0 and doc_start[b,t] is
// either t (a document starts) or doc_start[b,t-1] (checked). nullptr: one
// document per sequence (plain causal).
// window > 0 (Gemma's sliding layers): query t sees only keys j > t - window
// as well (HF's sliding_window_overlay). softcap > 0 (Gemma 2): each scaled
// score s becomes softcap * tanh(s / softcap) before the softmax.
// sinks [H] (gpt-oss, nullable): a logit per query head that joins every
// row's softmax denominator without a value (lse includes it).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t G, int64_t D, const int32_t* doc_start = nullptr, int64_t window = 0,
                       float softcap = 0.f, const float* sinks = nullptr);
// dq [B,T,H,D] (=), dk/dv [B,T,G,D] (=; summed over the H/G query heads of each group),
// dsinks [H] (+=, nullable; needs sinks).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, int64_t B, int64_t T, int64_t H, int64_t G,
                        int64_t D, const int32_t* doc_start = nullptr, int64_t window = 0, float softcap = 0.f,
                        const float* sinks = nullptr, float* dsinks = nullptr);

// ---- SwiGLU: out = silu(gate) * up, elementwise over n values ----
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// dgate, dup (=).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// ---- gpt-oss's clamped SwiGLU, elementwise over n values ----
// g' = min(gate, limit), u' = clamp(up, -limit, limit),
// out = (u' + 1) * g' * sigmoid(alpha * g'). The clamps pass the gradient
// where they leave the value unchanged (torch.clamp: min <= x <= max).
void swiglu_clamped_forward(float* out, const float* gate, const float* up, int64_t n, float limit, float alpha);
// dgate, dup (=).
void swiglu_clamped_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                             float limit, float alpha);

// ---- GeGLU: out = gelu_tanh(gate) * up (Gemma), elementwise over n values ----
void geglu_forward(float* out, const float* gate, const float* up, int64_t n);
// dgate, dup (=).
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// ---- elementwise ----
void add_inplace(float* y, const float* x, int64_t n);  // y += x
// y = alpha * x (y may be x). Its own backward: dx = alpha * dy (Granite's
// multipliers, attention scale and logits scaling).
void scale(float* y, const float* x, float alpha, int64_t n);

// ---- LM head + cross-entropy, in token chunks so [N, V] logits never exist ----
// logits for a chunk: h[rows, C] @ w[V, C]^T. Loss per valid row: logsumexp - logit[target].
// targets[n] == -100 is ignored. Returns the SUM of losses over valid rows and
// sets *n_valid. When dh is non-null: dh[N,C] (=) = grad_scale * d(sum loss)/dh;
// when dw is non-null: dw[V,C] (+=) likewise. chunk_rows bounds the logits buffer.
// softcap > 0 (Gemma 2's final_logit_softcapping): the logits are
// softcap * tanh(logit / softcap).
double lm_head_cross_entropy(float* dh, float* dw, const float* h, const float* w, const int32_t* targets, int64_t N,
                             int64_t C, int64_t V, float grad_scale, int64_t chunk_rows, int64_t* n_valid,
                             float softcap = 0.f);

}  // namespace rt::cpu
