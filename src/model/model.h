// Whole-model forward and backward over the layer templates (model/block.h).
// The schedule is the one the streaming engine uses: the forward keeps each
// block's input x_i (the checkpoint) and, for the last keep_layers layers,
// all of the block's activations; for the keep_attn layers before those, the
// attention half (AttnActs, model/block.h: selective recompute); the backward
// back-propagates through kept layers directly, recomputes only the MLP half
// of attention-kept ones, and every other block once from x_i first.
// Recompute and kept activations give bit-identical results (the same
// deterministic ops on the same inputs); keeping trades memory for FLOPs.
// The LM head and the cross-entropy run in token chunks so [N, V] logits
// never exist.
//
// Loss convention: the caller passes targets already shifted (targets[n] is
// the id that should follow position n, -100 to ignore) and grad_scale, the
// factor every gradient is multiplied by (1 / number of predicted tokens in
// the whole optimizer step for a mean loss). Weight grads accumulate (+=).
// MoE models: the load-balancing loss (model/moe_aux.h) is not in the
// returned sum; its gradient joins with weight router_aux_loss_coef x
// BatchView::aux_loss_scale when the config's output_router_logits is on, and
// its value and the per-expert token counts stay readable (moe_aux()).
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/block.h"
#include "model/moe_aux.h"
#include "model/spec.h"

namespace rt {

template <class W>
struct ModelWeightsT {
  const W* embed = nullptr;  // [V, C]
  std::vector<BlockWeightsT<W>> layers;
  const W* final_norm = nullptr;  // [C]
  const W* lm_head = nullptr;     // [V, C]; == embed when tied
};

struct ModelGrads {
  float* embed = nullptr;
  std::vector<BlockGrads> layers;
  float* final_norm = nullptr;
  float* lm_head = nullptr;  // == embed when tied
};

// One micro-batch: B sequences of T tokens. pos[n] is the RoPE position of
// row n (t within its sequence, or within its document when packing).
struct BatchView {
  int64_t B = 0, T = 0;
  const int32_t* ids = nullptr;      // [B*T], each in [0, V)
  const int32_t* targets = nullptr;  // [B*T], next ids or -100
  const int32_t* pos = nullptr;      // [B*T]
  // [B*T] packed documents: the position of each token's document start in
  // its sequence (attention stays inside a document), or nullptr: plain causal.
  const int32_t* doc_start = nullptr;
  // MoE: this micro-batch's share of the load-balancing loss (1: one
  // micro-batch per optimizer step; 1/K for K, as a mean over micro-batches).
  float aux_loss_scale = 1.0f;
};

template <class Ops>
class ModelRunner {
 public:
  using A = typename Ops::act_t;
  using W = typename Ops::weight_t;

  // mlp_chunk_tokens: BlockDims::mlp_chunk_tokens (0: the MLP over the whole batch at once).
  ModelRunner(Ops& ops, const ModelSpec& spec, int64_t B, int64_t T, int64_t ce_chunk_rows = 256,
              int64_t keep_layers = 0, int64_t mlp_chunk_tokens = 0, int64_t keep_attn = 0)
      : ops_(ops),
        s_(spec),
        dm_{B, T, mlp_chunk_tokens},
        ce_chunk_(ce_chunk_rows),
        acts_(ops, spec, dm_, keep_layers, keep_attn),
        scratch_(ops, spec, dm_),
        aux_(spec) {
    const int64_t N = dm_.N(), C = s_.hidden;
    ckpt_ = ops.template alloc<A>((s_.n_layers + 1) * N * C);
    hf_ = ops.template alloc<A>(N * C);
    rstd_f_ = ops.template alloc<float>(N);
    dx_ = ops.template alloc<A>(N * C);
    dhf_ = ops.template alloc<A>(N * C);
  }

  int64_t batch() const { return dm_.B; }
  int64_t seq_len() const { return dm_.T; }
  int64_t kept_layers() const { return acts_.kept_count(); }
  int64_t attn_kept_layers() const { return acts_.attn_kept_count(); }

  // Forward + backward of one micro-batch. Returns the SUM of token losses;
  // *n_valid gets the number of predicted tokens. With grads == nullptr only
  // the loss is computed.
  double forward_backward(const ModelWeightsT<W>& w, ModelGrads* grads, const BatchView& b, float grad_scale,
                          int64_t* n_valid) {
    RT_CHECK(b.B == dm_.B && b.T == dm_.T, "[model] batch shape ", b.B, "x", b.T, " does not match the runner's ",
             dm_.B, "x", dm_.T);
    const int64_t N = dm_.N(), C = s_.hidden, V = s_.vocab, L = s_.n_layers;
    A* x0 = ckpt_.data();
    ops_.embedding_forward(x0, b.ids, w.embed, N, C);
    const float em = static_cast<float>(s_.embedding_multiplier), ls = static_cast<float>(1.0 / s_.logits_scaling);
    if (em != 1.f) ops_.scale(x0, x0, em, N * C);  // Granite
    aux_.begin();
    for (int64_t i = 0; i < L; ++i) {
      const MoeLayerRouting routing = s_.is_moe() ? aux_.forward_routing(i) : MoeLayerRouting{};
      block_forward(ops_, s_, w.layers[i], dm_, x0 + i * N * C, x0 + (i + 1) * N * C, b.pos,
                    grads ? acts_.of(i) : acts_.shared(), b.doc_start, s_.is_moe() ? &routing : nullptr);
      if (grads) acts_.keep_attention_half(i);
    }
    if (s_.is_moe())
      aux_.finish(N, grads && s_.moe.aux_loss_on() ? s_.moe.router_aux_loss_coef * b.aux_loss_scale : 0.0);
    const A* xL = x0 + L * N * C;
    ops_.rms_norm_forward(hf_.data(), rstd_f_.data(), xL, w.final_norm, N, C, static_cast<float>(s_.rms_eps));
    // Granite: logits / logits_scaling = (hf / logits_scaling) W^T
    if (ls != 1.f) ops_.scale(hf_.data(), hf_.data(), ls, N * C);
    double loss = ops_.lm_head_cross_entropy(grads ? dhf_.data() : nullptr, grads ? grads->lm_head : nullptr,
                                             hf_.data(), w.lm_head, b.targets, N, C, V, grad_scale, ce_chunk_, n_valid,
                                             static_cast<float>(s_.final_softcap));
    if (!grads) return loss;
    if (ls != 1.f) ops_.scale(dhf_.data(), dhf_.data(), ls, N * C);
    ops_.rms_norm_backward(dx_.data(), grads->final_norm, dhf_.data(), xL, w.final_norm, rstd_f_.data(), N, C);
    const MoeLayerRouting back_routing = aux_.backward_routing();
    for (int64_t i = L - 1; i >= 0; --i) {
      const A* xi = x0 + i * N * C;
      block_recompute(ops_, s_, w.layers[i], dm_, xi, b.pos, acts_, i, b.doc_start);
      block_backward(ops_, s_, w.layers[i], dm_, xi, dx_.data(), dx_.data(), b.pos, acts_.of(i), scratch_,
                     grads->layers[i], b.doc_start, s_.is_moe() ? &back_routing : nullptr);
    }
    if (em != 1.f) ops_.scale(dx_.data(), dx_.data(), em, N * C);
    ops_.embedding_backward(grads->embed, dx_.data(), b.ids, N, C);
    return loss;
  }

  // MoE: the last forward_backward's load-balancing loss and per-layer
  // per-expert token counts (the stats hook); empty for dense models.
  const MoeAux& moe_aux() const { return aux_; }

  // Forward only: final normed hidden states hf[N, C] (for sampling; Granite:
  // divided by logits_scaling, so that hf W^T are the logits; Gemma 2: the
  // caller soft-caps those by spec.final_softcap).
  const A* forward_hidden(const ModelWeightsT<W>& w, const int32_t* ids, const int32_t* pos) {
    const int64_t N = dm_.N(), C = s_.hidden, L = s_.n_layers;
    A* x0 = ckpt_.data();
    ops_.embedding_forward(x0, ids, w.embed, N, C);
    if (s_.embedding_multiplier != 1.0) ops_.scale(x0, x0, static_cast<float>(s_.embedding_multiplier), N * C);
    for (int64_t i = 0; i < L; ++i)
      block_forward(ops_, s_, w.layers[i], dm_, x0 + i * N * C, x0 + (i + 1) * N * C, pos, acts_.shared());
    ops_.rms_norm_forward(hf_.data(), rstd_f_.data(), x0 + L * N * C, w.final_norm, N, C,
                          static_cast<float>(s_.rms_eps));
    if (s_.logits_scaling != 1.0)
      ops_.scale(hf_.data(), hf_.data(), static_cast<float>(1.0 / s_.logits_scaling), N * C);
    return hf_.data();
  }

 private:
  Ops& ops_;
  const ModelSpec& s_;
  BlockDims dm_;
  int64_t ce_chunk_;
  LayerActs<Ops> acts_;
  BlockScratch<Ops> scratch_;
  MoeAux aux_;
  typename Ops::template Buffer<A> ckpt_, hf_, dx_, dhf_;
  typename Ops::template Buffer<float> rstd_f_;
};

}  // namespace rt
