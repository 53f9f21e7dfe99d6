// Layer templates: the decoder block's forward and backward, written once
// against an ops interface and instantiated per backend (CpuOps, CudaOps). No
// state of their own, no autograd graph: weights are bound as views (pointers
// into whatever holds the layer right now), activations live in a BlockActs
// and backward temporaries in a BlockScratch, both sized from the BlockDims
// (model/block_memory.h gives their bytes to planners without allocating).
//
// MLP token chunks (BlockDims::mlp_chunk_tokens = R > 0): the MLP (gate/up ->
// SwiGLU -> down) runs over chunks of R token rows, so its N x F tensors exist
// for one chunk only; the backward recomputes each chunk's gate/up/SwiGLU from
// the stored normed input hn and accumulates the weight gradients chunk by
// chunk (a different fp32 summation order over tokens than R = 0). R = 0, or
// R >= N, is the whole batch at once with the same op calls as without
// chunking (bit-identical).
//
// Letters: N = tokens (B*T), C = hidden, H = query heads, G = KV heads,
// D = head_dim, F = intermediate. HF Llama/Mistral/Qwen2/Qwen3 decoder layer:
//   xn = rms(x)·w_attn_norm
//   q, k, v = xn Wq^T (+bq), xn Wk^T (+bk), xn Wv^T (+bv)
//   [Qwen3] q, k = rms_head(q)·w_q_norm, rms_head(k)·w_k_norm
//   q, k = rope(q), rope(k)
//   h = x + attn(q, k, v) Wo^T
//   hn = rms(h)·w_mlp_norm
//   y = h + (silu(hn Wg^T) * hn Wu^T) Wd^T
// [OLMoE] q, k = rms(q)·w_q_norm, rms(k)·w_k_norm over the whole projection.
// [Granite] x0 = embed * embedding_multiplier (model.h); each branch's output
// (attn(...) Wo^T, the MLP's) is multiplied by residual_multiplier r before
// its residual add; the softmax scale is attention_scale (q is multiplied by
// attention_scale * sqrt(D) after RoPE, the attention op scaling by
// 1/sqrt(D)); the logits are divided by logits_scaling (model.h).
// [SmolLM3] layers with spec.layer_uses_rope(w.layer) false skip RoPE.
// [Gemma] (model/spec_gemma.cpp) every norm is rms(x)·(1 + w) (the ops hold
// spec.norm_offset); the MLP is GeGLU (gelu_tanh(hn Wg^T) * hn Wu^T, spec.mlp_act);
// x0 = embed * sqrt(C) through embedding_multiplier; the softmax scale through
// attention_scale as Granite's; local layers (spec.layer_window(w.layer) > 0)
// attend to a sliding window and (Gemma 3) rotate with spec.rope_local;
// attention scores are soft-capped (spec.attn_softcap) inside the attention op.
// Gemma 2/3's sandwich norms (spec.sandwich_norms) norm each branch's output too:
//   h = x + rms(attn(q, k, v) Wo^T)·w_attn_post_norm     (attn_out: the branch output)
//   y = h + rms(mlp(rms(h)·w_mlp_norm))·w_mlp_post_norm  (mlp_out: the MLP's output)
// [OLMo2] (spec.post_norms; with OLMoE's whole-projection q/k norms) no norm
// before either branch; each branch's output is normed before its residual add:
//   q, k, v from x;  h = x + rms(attn(q, k, v) Wo^T)·w_attn_norm
//   y = h + rms((silu(h Wg^T) * h Wu^T) Wd^T)·w_mlp_norm
//   (xn then holds the attention branch's output before its norm, mlp_out the MLP's)
// MoE layers (spec.is_moe(): Qwen3-MoE, Mixtral, OLMoE; E experts, top k,
// expert width Fe) replace the MLP line:
//   p = softmax(hn Wr^T)                       [N, E] router probabilities
//   S = the k largest p per row; w = p_S (/ sum p_S when norm_topk_prob)
//   y = h + sum_{e in S} w_e (silu(hn We_g^T) * hn We_u^T) We_d^T
//   [Qwen2-MoE] y += sigmoid(hn w_sg^T) (silu(hn Wg^T) * hn Wu^T) Wd^T, the
//   shared expert in gate/up/down_proj (width Fs = shared_intermediate)
// through the ops' moe_forward/moe_backward (cpu/moe.h states the contract;
// a backend without them refuses MoE models). The load-balancing loss couples
// every MoE layer of a micro-batch (model/moe_aux.h): block_forward adds the
// layer's routing to a MoeAux, block_backward reads its gradient factor.
//
// Ops requirements (see CpuOps in cpu/cpu_ops.h for the reference):
//   using act_t (activation element), weight_t (weight element);
//   Buffer<T> alloc<T>(n) with .data(); the op methods used below with the
//   semantics of cpu/ops.h: forward writes '=', backward writes input grads
//   '=' and accumulates weight grads '+=' (weight grads are fp32 always).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/block_buffers.h"
#include "model/moe_bias.h"
#include "model/spec.h"

namespace rt {

// The MLP's gated activation: SwiGLU, or GeGLU (Gemma) through the ops'
// geglu_forward/backward (a backend without them refuses Gemma).
template <class Ops>
concept OpsWithGeglu = requires(Ops& o, typename Ops::act_t* p, const typename Ops::act_t* c) {
  o.geglu_forward(p, c, c, int64_t{1});
  o.geglu_backward(p, p, c, c, c, int64_t{1});
};
template <class Ops, class A>
void glu_forward(Ops& ops, const ModelSpec& s, A* out, const A* g, const A* u, int64_t n) {
  if (s.mlp_act == MlpAct::silu) return ops.swiglu_forward(out, g, u, n);
  if constexpr (OpsWithGeglu<Ops>)
    ops.geglu_forward(out, g, u, n);
  else
    fail("[model] ", s.architecture, "'s GeGLU MLP runs on the CPU backend only for now; use --device cpu");
}
template <class Ops, class A>
void glu_backward(Ops& ops, const ModelSpec& s, A* dg, A* du, const A* dout, const A* g, const A* u, int64_t n) {
  if (s.mlp_act == MlpAct::silu) return ops.swiglu_backward(dg, du, dout, g, u, n);
  if constexpr (OpsWithGeglu<Ops>)
    ops.geglu_backward(dg, du, dout, g, u, n);
  else
    fail("[model] ", s.architecture, "'s GeGLU MLP runs on the CPU backend only for now; use --device cpu");
}

// y[N,C] = block(x[N,C]); fills acts for the backward. pos[N]: RoPE positions.
// doc_start[N] (packed documents, or nullptr: plain causal): for each token,
// the position of its document's first token within its sequence, handed to
// the attention op (cpu/ops.h attention_forward states the contract); the
// backward must get the same array.
// moe (MoE layers, nullable): where the training forward adds the layer's
// routing counts for the load-balancing loss and the stats; a recompute
// passes nullptr so nothing is counted twice.
// y == nullptr: a recompute for block_backward only, which needs no output:
// the down projection is skipped, and with MLP chunks the whole MLP (the
// backward recomputes it chunk by chunk). Either way t holds exactly what
// block_backward reads, with the values of a full forward.
// The attention half of block_forward: xn, q, k, v, att, lse and h = x + att Wo^T
// (OLMo2's post-norms: xn holds the branch output att Wo^T, h = x + rms(xn)).
template <class Ops>
void block_forward_attention_half(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w,
                                  const BlockDims& dm, const typename Ops::act_t* x, const int32_t* pos,
                                  BlockActs<Ops>& t, const int32_t* doc_start) {
  const int64_t N = dm.N(), C = s.hidden, H = s.n_heads, G = s.n_kv_heads, D = s.head_dim;
  const int64_t QD = H * D, KD = G * D;
  const float eps = static_cast<float>(s.rms_eps);
  const bool post = s.post_norms;  // OLMo2: q/k/v read x itself
  const typename Ops::act_t* xn = post ? x : t.xn.data();
  {
    // FP8 per-tensor scaling: the norm makes xn's amax as it writes xn
    [[maybe_unused]] const auto tap = ops.amax_tap(post ? nullptr : t.xn.data(), N * C);
    if (!post) ops.rms_norm_forward(t.xn.data(), t.rstd1.data(), x, w.attn_norm, N, C, eps);
    [[maybe_unused]] const auto shared = ops.share_input(xn, N, C);  // q, k, v read xn (FP8: quantized once)
    if (s.qk_norm) {
      ops.linear_forward(t.q_raw.data(), xn, w.q_proj, w.q_bias, N, C, QD);
      ops.linear_forward(t.k_raw.data(), xn, w.k_proj, w.k_bias, N, C, KD);
      if (s.qk_norm_whole) {
        ops.rms_norm_forward(t.q.data(), t.rstd_q.data(), t.q_raw.data(), w.q_norm, N, QD, eps);
        ops.rms_norm_forward(t.k.data(), t.rstd_k.data(), t.k_raw.data(), w.k_norm, N, KD, eps);
      } else {
        ops.rms_norm_forward(t.q.data(), t.rstd_q.data(), t.q_raw.data(), w.q_norm, N * H, D, eps);
        ops.rms_norm_forward(t.k.data(), t.rstd_k.data(), t.k_raw.data(), w.k_norm, N * G, D, eps);
      }
    } else {
      ops.linear_forward(t.q.data(), xn, w.q_proj, w.q_bias, N, C, QD);
      ops.linear_forward(t.k.data(), xn, w.k_proj, w.k_bias, N, C, KD);
    }
    ops.linear_forward(t.v.data(), xn, w.v_proj, w.v_bias, N, C, KD);
  }
  const bool local_rope = s.layer_rope_local(w.layer);  // Gemma 3's local layers
  if (s.layer_uses_rope(w.layer)) {
    ops.rope_forward(t.q.data(), pos, N, H, D, local_rope);
    ops.rope_forward(t.k.data(), pos, N, G, D, local_rope);
  }
  // Granite: the softmax scale attention_scale, through q (the op scales by 1/sqrt(D))
  const float qscale =
      s.attention_scale > 0.0 ? static_cast<float>(s.attention_scale * std::sqrt(static_cast<double>(D))) : 1.f;
  if (qscale != 1.f) ops.scale(t.q.data(), t.q.data(), qscale, N * QD);
  const float r = static_cast<float>(s.residual_multiplier);  // Granite: branch outputs times r
  // gpt-oss: the sinks join each row's softmax (w.sinks null elsewhere)
  ops.attention_forward(t.att.data(), t.lse.data(), t.q.data(), t.k.data(), t.v.data(), dm.B, dm.T, H, G, D, doc_start,
                        s.layer_window(w.layer), static_cast<float>(s.attn_softcap), w.sinks);
  if (s.sandwich_norms) {  // Gemma 2/3: h = x + rms(att Wo^T)·w_attn_post_norm
    ops.linear_forward(t.attn_out.data(), t.att.data(), w.o_proj, w.o_bias, N, QD, C);
    ops.rms_norm_forward(t.h.data(), t.rstd_pa.data(), t.attn_out.data(), w.attn_post_norm, N, C, eps);
  } else if (post) {  // h = x + rms(att Wo^T)·w_attn_norm, the branch output kept in xn
    ops.linear_forward(t.xn.data(), t.att.data(), w.o_proj, w.o_bias, N, QD, C);
    ops.rms_norm_forward(t.h.data(), t.rstd1.data(), t.xn.data(), w.attn_norm, N, C, eps);
  } else {
    ops.linear_forward(t.h.data(), t.att.data(), w.o_proj, w.o_bias, N, QD, C);
    if (r != 1.f) ops.scale(t.h.data(), t.h.data(), r, N * C);
  }
  ops.add_inplace(t.h.data(), x, N * C);
}

// The MLP half of block_forward, from t.h: hn, the MLP (or the MoE layer) and,
// when y is not null, y = h + mlp(hn). y == nullptr: what the backward reads only.
template <class Ops>
void block_forward_mlp_half(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w,
                            const BlockDims& dm, typename Ops::act_t* y, BlockActs<Ops>& t,
                            const MoeLayerRouting* moe) {
  const int64_t N = dm.N(), C = s.hidden, F = s.intermediate;
  const float eps = static_cast<float>(s.rms_eps);
  const bool post = s.post_norms;
  const float r = static_cast<float>(s.residual_multiplier);  // Granite: branch outputs times r
  // FP8 per-tensor scaling: the norm makes hn's amax as it writes hn (nothing else here writes hn)
  [[maybe_unused]] const auto tap_hn = ops.amax_tap(post ? nullptr : t.hn.data(), N * C);
  if (!post) ops.rms_norm_forward(t.hn.data(), t.rstd2.data(), t.h.data(), w.mlp_norm, N, C, eps);
  if (s.is_moe()) {
    if constexpr (OpsWithMoe<Ops>) {
      // y == nullptr: the router only (the backward recomputes the experts)
      ops.moe_forward(y, t.moe_probs.data(), t.hn.data(), w.router, w.expert_gate.data(), w.expert_up.data(),
                      w.expert_down.data(), N, C, s.moe, moe ? moe->tokens_per_expert : nullptr,
                      moe ? moe->prob_sum : nullptr, moe_biases(w));
      if (y && s.moe.shared_intermediate > 0) {  // Qwen2-MoE: y += sigmoid(hn w_sg^T) * shared_expert(hn)
        const int64_t Fs = s.moe.shared_intermediate;
        ops.linear_forward(t.g.data(), t.hn.data(), w.gate_proj, nullptr, N, C, Fs);
        ops.linear_forward(t.u.data(), t.hn.data(), w.up_proj, nullptr, N, C, Fs);
        ops.swiglu_forward(t.a.data(), t.g.data(), t.u.data(), N * Fs);
        ops.linear_forward(t.shared_out.data(), t.a.data(), w.down_proj, nullptr, N, Fs, C);
        ops.linear_forward(t.shared_logit.data(), t.hn.data(), w.shared_expert_gate, nullptr, N, C, 1);
        ops.moe_shared_gate_forward(y, t.shared_out.data(), t.shared_logit.data(), N, C);
      }
      if (y) ops.add_inplace(y, t.h.data(), N * C);
      return;
    } else {
      fail("[model] ", s.architecture,
           " is a mixture-of-experts model, which only the CPU backend runs for now; use --device cpu");
    }
  }
  // OLMo2's and Gemma 2/3's recompute needs the MLP's output (its norm's input)
  const bool sandwich = s.sandwich_norms;
  if (!y && dm.mlp_chunked() && !post && !sandwich) return;
  // MLP over token chunks of R rows (R = N: one pass, the unchunked calls)
  const int64_t R = dm.mlp_rows();
  const auto* mlp_in = post ? t.h.data() : t.hn.data();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t n = std::min(R, N - r0);
    const auto* hn = mlp_in + r0 * C;
    {
      [[maybe_unused]] const auto shared = ops.share_input(hn, n, C);  // gate and up read hn (FP8: quantized once)
      ops.linear_forward(t.g.data(), hn, w.gate_proj, nullptr, n, C, F);
      ops.linear_forward(t.u.data(), hn, w.up_proj, nullptr, n, C, F);
    }
    [[maybe_unused]] const auto tap_a = ops.amax_tap(t.a.data(), n * F);  // FP8: a's amax from the GLU
    glu_forward(ops, s, t.a.data(), t.g.data(), t.u.data(), n * F);
    if (post || sandwich) {
      ops.linear_forward(t.mlp_out.data() + r0 * C, t.a.data(), w.down_proj, nullptr, n, F, C);
      continue;
    }
    if (!y) continue;
    ops.linear_forward(y + r0 * C, t.a.data(), w.down_proj, nullptr, n, F, C);
    if (r != 1.f) ops.scale(y + r0 * C, y + r0 * C, r, n * C);
    ops.add_inplace(y + r0 * C, t.h.data() + r0 * C, n * C);
  }
  if (sandwich && y) {  // y = h + rms(mlp_out)·w_mlp_post_norm (the backward recomputes rstd_pm)
    ops.rms_norm_forward(y, t.rstd_pm.data(), t.mlp_out.data(), w.mlp_post_norm, N, C, eps);
    ops.add_inplace(y, t.h.data(), N * C);
  }
  if (post) {  // y = h + rms(mlp_out)·w_mlp_norm; a recompute needs only the statistics (hn is free: scratch)
    ops.rms_norm_forward(y ? y : t.hn.data(), t.rstd2.data(), t.mlp_out.data(), w.mlp_norm, N, C, eps);
    if (y) ops.add_inplace(y, t.h.data(), N * C);
  }
}

template <class Ops>
void block_forward(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w, const BlockDims& dm,
                   const typename Ops::act_t* x, typename Ops::act_t* y, const int32_t* pos, BlockActs<Ops>& t,
                   const int32_t* doc_start = nullptr, const MoeLayerRouting* moe = nullptr) {
  check_block_buffers("the block activations", t.dims, dm);
  block_forward_attention_half(ops, s, w, dm, x, pos, t, doc_start);
  block_forward_mlp_half(ops, s, w, dm, y, t, moe);
}

// Selective recompute of a layer whose attention half was kept (AttnActs): t
// gets the kept values back and the rest of what block_backward reads is
// recomputed (xn from x, then the MLP half without output), bit for bit what
// block_forward(x, y == nullptr) leaves in t. Post-norm blocks (OLMo2) kept
// xn (the attention branch output) and its statistics with the half.
template <class Ops>
void block_recompute_mlp_half(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w,
                              const BlockDims& dm, const typename Ops::act_t* x, AttnActs<Ops>& kept,
                              BlockActs<Ops>& t) {
  check_block_buffers("the block activations", t.dims, dm);
  kept.swap_with(t);
  if (!s.post_norms)
    ops.rms_norm_forward(t.xn.data(), t.rstd1.data(), x, w.attn_norm, dm.N(), s.hidden, static_cast<float>(s.rms_eps));
  block_forward_mlp_half(ops, s, w, dm, nullptr, t, nullptr);
}

// Before layer's block_backward: what it reads from acts, as much as was
// kept. A fully kept layer has it all; one that kept its attention half (of
// micro-batch `set` under layer-major) gets it back and recomputes the MLP
// half; any other is recomputed whole (no block output) in acts.shared().
template <class Ops>
void block_recompute(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w, const BlockDims& dm,
                     const typename Ops::act_t* x, const int32_t* pos, LayerActs<Ops>& acts, int64_t layer,
                     const int32_t* doc_start = nullptr, int64_t set = 0) {
  if (acts.attn_kept(layer))
    block_recompute_mlp_half(ops, s, w, dm, x, acts.attn_of(layer, set), acts.shared());
  else if (!acts.kept(layer))
    block_forward(ops, s, w, dm, x, nullptr, pos, acts.shared(), doc_start);
}

// dx[N,C] (=) from dy[N,C]; weight grads accumulate (+=) into gr.
// x is the block input the forward saw; t must come from block_forward(x)
// (the training forward, or a recompute with y == nullptr) with the same dm;
// d is scratch. dx may alias dy.
template <class Ops>
void block_backward(Ops& ops, const ModelSpec& s, const BlockWeightsT<typename Ops::weight_t>& w, const BlockDims& dm,
                    const typename Ops::act_t* x, const typename Ops::act_t* dy, typename Ops::act_t* dx,
                    const int32_t* pos, BlockActs<Ops>& t, BlockScratch<Ops>& d, const BlockGrads& gr,
                    const int32_t* doc_start = nullptr, const MoeLayerRouting* moe = nullptr) {
  const int64_t N = dm.N(), C = s.hidden, H = s.n_heads, G = s.n_kv_heads, D = s.head_dim, F = s.intermediate;
  const int64_t QD = H * D, KD = G * D;
  check_block_buffers("the block activations", t.dims, dm);
  check_block_buffers("the block's backward scratch", d.dims, dm);
  // MLP: y = h + a Wd^T, over token chunks of R rows (R = N: one pass on the
  // forward's g, u, a; chunked: each chunk's g, u, a recomputed from hn first)
  const int64_t R = s.is_moe() ? N : dm.mlp_rows();
  // OLMo2 (post_norms): the MLP reads h and its output is normed first: the
  // gradient at the MLP's output goes into d_xn (free until the q/k/v
  // backward), the MLP's input gradient straight into d_h
  const bool post = s.post_norms;
  const auto* mlp_in = post ? t.h.data() : t.hn.data();
  const auto* d_mlp_out = dy;
  auto* d_mlp_in = post ? d.d_h.data() : d.d_hn.data();
  if (post) {
    ops.rms_norm_backward(d.d_xn.data(), gr.mlp_norm, dy, t.mlp_out.data(), w.mlp_norm, t.rstd2.data(), N, C);
    d_mlp_out = d.d_xn.data();
  }
  if (s.sandwich_norms) {  // Gemma 2/3: the post-MLP norm's statistics again (a recompute skips it), then its backward
    ops.rms_norm_forward(d.d_xn.data(), t.rstd_pm.data(), t.mlp_out.data(), w.mlp_post_norm, N, C,
                         static_cast<float>(s.rms_eps));
    ops.rms_norm_backward(d.d_xn.data(), gr.mlp_post_norm, dy, t.mlp_out.data(), w.mlp_post_norm, t.rstd_pm.data(), N,
                          C);
    d_mlp_out = d.d_xn.data();
  }
  const float r = static_cast<float>(s.residual_multiplier);  // Granite: y = h + r * mlp(...)
  if (r != 1.f && !s.is_moe()) {
    ops.scale(d.d_xn.data(), dy, r, N * C);
    d_mlp_out = d.d_xn.data();
  }
  if (s.is_moe()) {
    if constexpr (OpsWithMoe<Ops>) {
      ops.moe_backward(d.d_hn.data(), gr.router, gr.expert_gate.data(), gr.expert_up.data(), gr.expert_down.data(), dy,
                       t.hn.data(), t.moe_probs.data(), w.router, w.expert_gate.data(), w.expert_up.data(),
                       w.expert_down.data(), N, C, s.moe, moe ? moe->dprob : nullptr, moe_biases(w),
                       MoeBiasGrads{gr.router_bias, ptrs_or_null(gr.expert_gate_bias), ptrs_or_null(gr.expert_up_bias),
                                    ptrs_or_null(gr.expert_down_bias)});
      if (s.moe.shared_intermediate > 0) {  // Qwen2-MoE's shared expert, recomputed from hn
        const int64_t Fs = s.moe.shared_intermediate;
        const auto* hn = t.hn.data();
        ops.linear_forward(t.g.data(), hn, w.gate_proj, nullptr, N, C, Fs);
        ops.linear_forward(t.u.data(), hn, w.up_proj, nullptr, N, C, Fs);
        ops.swiglu_forward(t.a.data(), t.g.data(), t.u.data(), N * Fs);
        ops.linear_forward(t.shared_out.data(), t.a.data(), w.down_proj, nullptr, N, Fs, C);
        ops.linear_forward(t.shared_logit.data(), hn, w.shared_expert_gate, nullptr, N, C, 1);
        // d_tmp: d shared_out [N, C]; d_h (written later with '='): d logit [N]
        ops.moe_shared_gate_backward(d.d_tmp.data(), d.d_h.data(), dy, t.shared_out.data(), t.shared_logit.data(), N,
                                     C);
        ops.linear_backward(d.d_a.data(), gr.down_proj, nullptr, d.d_tmp.data(), t.a.data(), w.down_proj, N, Fs, C);
        ops.swiglu_backward(d.d_g.data(), d.d_u.data(), d.d_a.data(), t.g.data(), t.u.data(), N * Fs);
        ops.linear_backward(d.d_tmp.data(), gr.gate_proj, nullptr, d.d_g.data(), hn, w.gate_proj, N, C, Fs);
        ops.add_inplace(d.d_hn.data(), d.d_tmp.data(), N * C);
        ops.linear_backward(d.d_tmp.data(), gr.up_proj, nullptr, d.d_u.data(), hn, w.up_proj, N, C, Fs);
        ops.add_inplace(d.d_hn.data(), d.d_tmp.data(), N * C);
        ops.linear_backward(d.d_tmp.data(), gr.shared_expert_gate, nullptr, d.d_h.data(), hn, w.shared_expert_gate, N,
                            C, 1);
        ops.add_inplace(d.d_hn.data(), d.d_tmp.data(), N * C);
      }
    } else {
      fail("[model] ", s.architecture,
           " is a mixture-of-experts model, which only the CPU backend runs for now; use --device cpu");
    }
  }
  for (int64_t r0 = 0; r0 < N && !s.is_moe(); r0 += R) {
    const int64_t n = std::min(R, N - r0);
    const auto* hn = mlp_in + r0 * C;
    // gate and up read hn (FP8: quantized once, both ways)
    [[maybe_unused]] const auto shared = ops.share_input(hn, n, C);
    // FP8 per-tensor scaling: the amaxes of a (recomputed here) and of the gate's and up's
    // output gradients from the GLU kernels that write them
    [[maybe_unused]] const auto tap_a = ops.amax_tap(dm.mlp_chunked() ? t.a.data() : nullptr, n * F);
    if (dm.mlp_chunked()) {
      ops.linear_forward(t.g.data(), hn, w.gate_proj, nullptr, n, C, F);
      ops.linear_forward(t.u.data(), hn, w.up_proj, nullptr, n, C, F);
      glu_forward(ops, s, t.a.data(), t.g.data(), t.u.data(), n * F);
    }
    ops.linear_backward(d.d_a.data(), gr.down_proj, nullptr, d_mlp_out + r0 * C, t.a.data(), w.down_proj, n, F, C);
    [[maybe_unused]] const auto tap_dg = ops.amax_tap(d.d_g.data(), n * F);
    [[maybe_unused]] const auto tap_du = ops.amax_tap(d.d_u.data(), n * F);
    glu_backward(ops, s, d.d_g.data(), d.d_u.data(), d.d_a.data(), t.g.data(), t.u.data(), n * F);
    ops.linear_backward(d_mlp_in + r0 * C, gr.gate_proj, nullptr, d.d_g.data(), hn, w.gate_proj, n, C, F);
    ops.linear_backward(d.d_tmp.data() + r0 * C, gr.up_proj, nullptr, d.d_u.data(), hn, w.up_proj, n, C, F);
    ops.add_inplace(d_mlp_in + r0 * C, d.d_tmp.data() + r0 * C, n * C);
  }
  // dh = dy + rms_backward(d_hn) (OLMo2: dy + the MLP's input gradient, already in d_h)
  if (!post)
    ops.rms_norm_backward(d.d_h.data(), gr.mlp_norm, d.d_hn.data(), t.h.data(), w.mlp_norm, t.rstd2.data(), N, C);
  ops.add_inplace(d.d_h.data(), dy, N * C);
  // attention: h = x + att Wo^T (OLMo2: h = x + rms(att Wo^T)·w_attn_norm, the branch output in xn)
  const auto* d_ao = d.d_h.data();
  if (s.sandwich_norms) {  // Gemma 2/3: h = x + rms(attn_out)·w_attn_post_norm
    ops.rms_norm_backward(d.d_hn.data(), gr.attn_post_norm, d.d_h.data(), t.attn_out.data(), w.attn_post_norm,
                          t.rstd_pa.data(), N, C);
    d_ao = d.d_hn.data();
  } else if (post) {
    ops.rms_norm_backward(d.d_hn.data(), gr.attn_norm, d.d_h.data(), t.xn.data(), w.attn_norm, t.rstd1.data(), N, C);
    d_ao = d.d_hn.data();
  } else if (r != 1.f) {  // Granite: h = x + r * att Wo^T
    ops.scale(d.d_hn.data(), d.d_h.data(), r, N * C);
    d_ao = d.d_hn.data();
  }
  ops.linear_backward(d.d_att.data(), gr.o_proj, gr.o_bias, d_ao, t.att.data(), w.o_proj, N, QD, C);
  ops.attention_backward(d.d_q.data(), d.d_k.data(), d.d_v.data(), d.d_att.data(), t.q.data(), t.k.data(), t.v.data(),
                         t.att.data(), t.lse.data(), dm.B, dm.T, H, G, D, doc_start, s.layer_window(w.layer),
                         static_cast<float>(s.attn_softcap), w.sinks, gr.sinks);
  const float qscale =
      s.attention_scale > 0.0 ? static_cast<float>(s.attention_scale * std::sqrt(static_cast<double>(D))) : 1.f;
  if (qscale != 1.f) ops.scale(d.d_q.data(), d.d_q.data(), qscale, N * QD);
  if (s.layer_uses_rope(w.layer)) {
    ops.rope_backward(d.d_q.data(), pos, N, H, D, s.layer_rope_local(w.layer));
    ops.rope_backward(d.d_k.data(), pos, N, G, D, s.layer_rope_local(w.layer));
  }
  const auto* dq = d.d_q.data();
  const auto* dk = d.d_k.data();
  if (s.qk_norm) {
    // rows x width of the q/k norms: per head, or the whole projection (OLMoE)
    const int64_t qr = s.qk_norm_whole ? N : N * H, qw = s.qk_norm_whole ? QD : D;
    const int64_t kr = s.qk_norm_whole ? N : N * G, kw = s.qk_norm_whole ? KD : D;
    ops.rms_norm_backward(d.d_tmp_q.data(), gr.q_norm, d.d_q.data(), t.q_raw.data(), w.q_norm, t.rstd_q.data(), qr, qw);
    ops.rms_norm_backward(d.d_tmp_k.data(), gr.k_norm, d.d_k.data(), t.k_raw.data(), w.k_norm, t.rstd_k.data(), kr, kw);
    dq = d.d_tmp_q.data();
    dk = d.d_tmp_k.data();
  }
  const auto* xn = post ? x : t.xn.data();  // the q/k/v projections' input
  {
    [[maybe_unused]] const auto shared = ops.share_input(xn, N, C);  // q, k, v read xn (FP8: x^T quantized once)
    ops.linear_backward(d.d_xn.data(), gr.q_proj, gr.q_bias, dq, xn, w.q_proj, N, C, QD);
    ops.linear_backward(d.d_tmp.data(), gr.k_proj, gr.k_bias, dk, xn, w.k_proj, N, C, KD);
    ops.add_inplace(d.d_xn.data(), d.d_tmp.data(), N * C);
    ops.linear_backward(d.d_tmp.data(), gr.v_proj, gr.v_bias, d.d_v.data(), xn, w.v_proj, N, C, KD);
    ops.add_inplace(d.d_xn.data(), d.d_tmp.data(), N * C);
  }
  if (post) {  // dx = dh + d_xn
    ops.add_inplace(d.d_xn.data(), d.d_h.data(), N * C);
    ops.copy(dx, d.d_xn.data(), N * C);
    return;
  }
  // dx = dh + rms_backward(d_xn); write into d_tmp first since dx may alias dy
  ops.rms_norm_backward(d.d_tmp.data(), gr.attn_norm, d.d_xn.data(), x, w.attn_norm, t.rstd1.data(), N, C);
  ops.add_inplace(d.d_tmp.data(), d.d_h.data(), N * C);
  ops.copy(dx, d.d_tmp.data(), N * C);
}

}  // namespace rt
