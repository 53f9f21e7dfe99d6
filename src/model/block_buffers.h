// The decoder block's buffers and views (model/block.h runs the block over
// them): the layer's weights and gradients bound as views (BlockWeightsT,
// BlockGrads), the MoE routing bookkeeping a layer hands on
// (MoeLayerRouting), the batch shape (BlockDims), the activations the
// backward reads (BlockActs; AttnActs for a selectively kept attention half;
// LayerActs, the kept ones per layer) and the backward's temporaries
// (BlockScratch), each allocated through the ops so that one definition serves
// every backend.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/moe_bias.h"
#include "model/spec.h"

namespace rt {

template <class W>
struct BlockWeightsT {
  const W* attn_norm;  // [C]
  const W* q_proj;     // [H*D, C]
  const W* q_bias;     // [H*D] or null
  const W* k_proj;     // [G*D, C]
  const W* k_bias;     // [G*D] or null
  const W* v_proj;     // [G*D, C]
  const W* v_bias;     // [G*D] or null
  const W* q_norm;     // [D] or null
  const W* k_norm;     // [D] or null
  const W* o_proj;     // [C, H*D]
  const W* mlp_norm;   // [C]
  const W* gate_proj;  // [F, C]
  const W* up_proj;    // [F, C]
  const W* down_proj;  // [C, F]
  // MoE layers (gate/up/down_proj null, or Qwen2-MoE's shared expert [Fs, C]
  // and [C, Fs]): router [E, C]; expert e's gate and up [Fe, C], down
  // [C, Fe]; each vector holds E pointers; the shared expert's gate [1, C].
  const W* router = nullptr;
  const W* shared_expert_gate = nullptr;
  std::vector<const W*> expert_gate{}, expert_up{}, expert_down{};
  int64_t layer = -1;  // the decoder layer these are (SmolLM3: whether it applies RoPE)
  // Gemma 2/3's sandwich norms on the branch outputs ([C] each), else null.
  const W* attn_post_norm = nullptr;
  const W* mlp_post_norm = nullptr;
  // gpt-oss: o_proj's bias [C], the attention sinks [H], the router's bias
  // [E] and each expert's gate, up [Fe] and down [C] biases (E pointers each), else null/empty.
  const W* o_bias = nullptr;
  const W* sinks = nullptr;
  const W* router_bias = nullptr;
  std::vector<const W*> expert_gate_bias{}, expert_up_bias{}, expert_down_bias{};
};

// Weight gradients of one block, fp32, same shapes (nullable entries as above).
struct BlockGrads {
  float *attn_norm, *q_proj, *q_bias, *k_proj, *k_bias, *v_proj, *v_bias, *q_norm, *k_norm, *o_proj, *mlp_norm,
      *gate_proj, *up_proj, *down_proj;
  float* router = nullptr;
  std::vector<float*> expert_gate{}, expert_up{}, expert_down{};
  float* shared_expert_gate = nullptr;
  float* attn_post_norm = nullptr;
  float* mlp_post_norm = nullptr;
  float* o_bias = nullptr;
  float* sinks = nullptr;
  float* router_bias = nullptr;
  std::vector<float*> expert_gate_bias{}, expert_up_bias{}, expert_down_bias{};
};

// Weight views as gradient sinks: the same pointers, writable (the gradient
// arenas share the weights' layout).
inline BlockGrads block_grads_from(const BlockWeightsT<float>& v) {
  auto m = [](const float* p) { return const_cast<float*>(p); };
  auto mv = [&](const std::vector<const float*>& ps) {
    std::vector<float*> r;
    for (const float* p : ps) r.push_back(m(p));
    return r;
  };
  return BlockGrads{m(v.attn_norm),
                    m(v.q_proj),
                    m(v.q_bias),
                    m(v.k_proj),
                    m(v.k_bias),
                    m(v.v_proj),
                    m(v.v_bias),
                    m(v.q_norm),
                    m(v.k_norm),
                    m(v.o_proj),
                    m(v.mlp_norm),
                    m(v.gate_proj),
                    m(v.up_proj),
                    m(v.down_proj),
                    m(v.router),
                    mv(v.expert_gate),
                    mv(v.expert_up),
                    mv(v.expert_down),
                    m(v.shared_expert_gate),
                    m(v.attn_post_norm),
                    m(v.mlp_post_norm),
                    m(v.o_bias),
                    m(v.sinks),
                    m(v.router_bias),
                    mv(v.expert_gate_bias),
                    mv(v.expert_up_bias),
                    mv(v.expert_down_bias)};
}

// One MoE layer's share of a micro-batch's routing bookkeeping (the runner's
// MoeAux owns the arrays, model/moe_aux.h; the CUDA engine's DeviceMoeAux,
// engine/cuda/moe_routing.h, in device memory). Every pointer may be null.
struct MoeLayerRouting {
  int64_t* tokens_per_expert = nullptr;  // [E] forward: += tokens routed to each expert
  double* prob_sum = nullptr;            // [E] forward: += router probability summed over tokens
  const float* dprob = nullptr;          // [E] backward: d loss / d p[n, e], the same for every token n
};

// gpt-oss's router and expert biases of a layer (all null elsewhere).
template <class W>
MoeBiasesT<W> moe_biases(const BlockWeightsT<W>& w) {
  return MoeBiasesT<W>{w.router_bias, ptrs_or_null(w.expert_gate_bias), ptrs_or_null(w.expert_up_bias),
                       ptrs_or_null(w.expert_down_bias)};
}

// Backends that implement the MoE MLP (moe_forward / moe_backward) say so.
template <class Ops>
concept OpsWithMoe = Ops::supports_moe;

// Shapes of one batch through a block.
struct BlockDims {
  int64_t B, T;                  // N = B*T rows
  int64_t mlp_chunk_tokens = 0;  // MLP token chunk (rows); 0: the whole batch at once
  int64_t N() const { return B * T; }
  // Rows of the MLP's per-chunk tensors (g, u, a and their gradients).
  int64_t mlp_rows() const { return mlp_chunk_tokens > 0 ? std::min(mlp_chunk_tokens, N()) : N(); }
  // True when the MLP runs in more than one chunk (then the backward recomputes gate/up/SwiGLU).
  bool mlp_chunked() const { return mlp_rows() < N(); }
};

inline void check_block_dims(const BlockDims& dm) {
  RT_CHECK(dm.B > 0 && dm.T > 0, "[model] a block needs a batch of at least one token, got ", dm.B, " x ", dm.T);
  RT_CHECK(dm.mlp_chunk_tokens >= 0, "[model] the MLP token chunk must be >= 0 (0: off), got ", dm.mlp_chunk_tokens);
}
// Buffers sized for `sized` serve a call with `dm` only when the shapes agree.
inline void check_block_buffers(const char* what, const BlockDims& sized, const BlockDims& dm) {
  RT_CHECK(sized.B == dm.B && sized.T == dm.T && sized.mlp_rows() == dm.mlp_rows(), "[model] ", what,
           " were sized for ", sized.B, " x ", sized.T, " tokens in MLP chunks of ", sized.mlp_rows(),
           " rows, but the block runs ", dm.B, " x ", dm.T, " in chunks of ", dm.mlp_rows());
}

// Everything the backward needs from the forward of one block. The engines
// keep one for the recompute of any layer, and one per layer whose
// activations stay from its forward to its backward (no recompute there).
template <class Ops>
struct BlockActs {
  using A = typename Ops::act_t;
  template <class T>
  using Buf = typename Ops::template Buffer<T>;
  Buf<A> xn, q_raw, k_raw, q, k, v, att, h, hn, g, u, a, shared_out, mlp_out, attn_out;  // activations
  // statistics (moe_probs: [N, E] router softmax; shared_logit: [N] the shared expert's gate logit;
  // rstd_pa, rstd_pm: Gemma's post-attention and post-MLP norms)
  Buf<float> rstd1, rstd_q, rstd_k, lse, rstd2, moe_probs, shared_logit, rstd_pa, rstd_pm;
  BlockDims dims;  // what the buffers are sized for

  // Calls act(member, n) for every activation buffer and stat(member, n) for
  // every fp32 statistic, with its element count: the one list the
  // constructor allocates from and bytes() sums.
  template <class Act, class Stat>
  static void each_buffer(const ModelSpec& s, const BlockDims& dm, Act&& act, Stat&& stat) {
    const int64_t N = dm.N(), C = s.hidden, QD = s.q_dim(), KD = s.kv_dim();
    // MoE: the ops keep each expert's rows themselves; g, u, a serve the shared expert (if any)
    const int64_t F = s.is_moe() ? s.moe.shared_intermediate : s.intermediate;
    const bool shared = s.is_moe() && s.moe.shared_intermediate > 0;
    act(&BlockActs::xn, N * C);
    act(&BlockActs::q_raw, s.qk_norm ? N * QD : 1);
    act(&BlockActs::k_raw, s.qk_norm ? N * KD : 1);
    act(&BlockActs::q, N * QD);
    act(&BlockActs::k, N * KD);
    act(&BlockActs::v, N * KD);
    act(&BlockActs::att, N * QD);
    act(&BlockActs::h, N * C);
    act(&BlockActs::hn, N * C);
    const int64_t R = s.is_moe() ? N : dm.mlp_rows();  // the shared expert runs unchunked
    act(&BlockActs::g, std::max<int64_t>(R * F, 1));   // one MLP chunk
    act(&BlockActs::u, std::max<int64_t>(R * F, 1));
    act(&BlockActs::a, std::max<int64_t>(R * F, 1));
    act(&BlockActs::shared_out, shared ? N * C : 1);
    // OLMo2, Gemma 2/3: the MLP's output before its norm; Gemma 2/3: the attention branch's
    act(&BlockActs::mlp_out, s.post_norms || s.sandwich_norms ? N * C : 1);
    act(&BlockActs::attn_out, s.sandwich_norms ? N * C : 1);
    stat(&BlockActs::rstd1, N);
    stat(&BlockActs::rstd_q, s.qk_norm ? N * s.n_heads : 1);
    stat(&BlockActs::rstd_k, s.qk_norm ? N * s.n_kv_heads : 1);
    stat(&BlockActs::lse, N * s.n_heads);
    stat(&BlockActs::rstd2, N);
    stat(&BlockActs::moe_probs, s.is_moe() ? N * s.moe.n_experts : 1);
    stat(&BlockActs::shared_logit, shared ? N : 1);
    stat(&BlockActs::rstd_pa, s.sandwich_norms ? N : 1);
    stat(&BlockActs::rstd_pm, s.sandwich_norms ? N : 1);
  }
  // Bytes of one BlockActs (what keeping one more layer's activations costs).
  static uint64_t bytes(const ModelSpec& s, const BlockDims& dm) {
    uint64_t b = 0;
    each_buffer(
        s, dm, [&](auto, int64_t n) { b += static_cast<uint64_t>(n) * sizeof(A); },
        [&](auto, int64_t n) { b += static_cast<uint64_t>(n) * sizeof(float); });
    return b;
  }

  BlockActs(Ops& ops, const ModelSpec& s, const BlockDims& dm) : dims(dm) {
    check_block_dims(dm);
    each_buffer(
        s, dm, [&](auto m, int64_t n) { this->*m = ops.template alloc<A>(n); },
        [&](auto m, int64_t n) { this->*m = ops.template alloc<float>(n); });
  }
};

// Selective recompute: the attention half of one block's activations, kept
// from its forward to its backward while the rest is recomputed. It holds
// what is dear to recompute and cheap to store: the q/k/v projections (after
// the q/k norms and RoPE, and before the norms when there are q/k norms), the
// attention output and its log-sum-exp, and h = x + att Wo^T. The backward
// then recomputes only the two RMSNorms (xn from x, hn from h) and the MLP's
// gate/up/SwiGLU (block_recompute_mlp_half), skipping the q/k/v and o
// projections and the attention forward: per token and layer it stores
// 2 (QD + 2 KD + QD + C) bytes (bf16) to save 2 C (QD + 2 KD) + 2 QD C
// FLOPs of GEMMs plus the attention forward (2 QD T causal).
// The buffers move by swapping with the shared BlockActs (no copies): the
// forward of such a layer runs in the shared set and swaps its attention
// buffers into the store; the backward swaps them back. Every value is the
// one the forward computed, and the recomputed ones come from the same ops
// on the same inputs, so the gradients are bit-identical to a full
// recompute (tests/model/selective_recompute_test.cpp).
template <class Ops>
struct AttnActs {
  using A = typename Ops::act_t;
  template <class T>
  using Buf = typename Ops::template Buffer<T>;
  // The BlockActs members this store holds.
  static constexpr Buf<A> BlockActs<Ops>::* kActs[] = {&BlockActs<Ops>::q_raw, &BlockActs<Ops>::k_raw,
                                                      &BlockActs<Ops>::q,     &BlockActs<Ops>::k,
                                                      &BlockActs<Ops>::v,     &BlockActs<Ops>::att,
                                                      &BlockActs<Ops>::h,     &BlockActs<Ops>::xn,
                                                      &BlockActs<Ops>::attn_out};
  static constexpr Buf<float> BlockActs<Ops>::* kStats[] = {&BlockActs<Ops>::rstd_q, &BlockActs<Ops>::rstd_k,
                                                           &BlockActs<Ops>::lse, &BlockActs<Ops>::rstd1,
                                                           &BlockActs<Ops>::rstd_pa};
  // xn and rstd1 (the next to last of each list) belong to the half only with
  // post-norms (OLMo2: xn is the attention branch output, rstd1 its norm's
  // statistics); otherwise the recompute makes them from x, a cheap norm.
  // attn_out and rstd_pa (the last) only with Gemma's sandwich norms (the
  // attention branch output before its norm, and that norm's statistics).
  static bool held(size_t i, size_t n, bool post_norms, bool sandwich) {
    return i + 2 < n || (i + 2 == n && post_norms) || (i + 1 == n && sandwich);
  }
  static bool held(size_t i, size_t n, const ModelSpec& s) { return held(i, n, s.post_norms, s.sandwich_norms); }
  using ActMember = Buf<A> BlockActs<Ops>::*;
  using StatMember = Buf<float> BlockActs<Ops>::*;
  // Index of m in kActs (kStats) when the half of a block of s holds it, or -1.
  template <class M>
  static int act_index(M m, const ModelSpec& s) {
    if constexpr (std::is_same_v<M, ActMember>)
      for (size_t i = 0; i < std::size(kActs); ++i)
        if (kActs[i] == m && held(i, std::size(kActs), s)) return static_cast<int>(i);
    return -1;
  }
  template <class M>
  static int stat_index(M m, const ModelSpec& s) {
    if constexpr (std::is_same_v<M, StatMember>)
      for (size_t i = 0; i < std::size(kStats); ++i)
        if (kStats[i] == m && held(i, std::size(kStats), s)) return static_cast<int>(i);
    return -1;
  }
  // Bytes of one store (what keeping one more layer's attention half costs).
  static uint64_t bytes(const ModelSpec& s, const BlockDims& dm) {
    uint64_t b = 0;
    BlockActs<Ops>::each_buffer(
        s, dm, [&](auto m, int64_t n) { b += act_index(m, s) >= 0 ? static_cast<uint64_t>(n) * sizeof(A) : 0; },
        [&](auto m, int64_t n) { b += stat_index(m, s) >= 0 ? static_cast<uint64_t>(n) * sizeof(float) : 0; });
    return b;
  }
  AttnActs(Ops& ops, const ModelSpec& s, const BlockDims& dm)
      : dims(dm), post_norms(s.post_norms), sandwich(s.sandwich_norms) {
    BlockActs<Ops>::each_buffer(
        s, dm,
        [&](auto m, int64_t n) {
          if (const int i = act_index(m, s); i >= 0) acts[i] = ops.template alloc<A>(n);
        },
        [&](auto m, int64_t n) {
          if (const int i = stat_index(m, s); i >= 0) stats[i] = ops.template alloc<float>(n);
        });
  }
  // Exchanges the attention half with t's (same shapes: both sized for dims).
  void swap_with(BlockActs<Ops>& t) {
    check_block_buffers("the kept attention activations", dims, t.dims);
    const size_t na = std::size(kActs), ns = std::size(kStats);
    for (size_t i = 0; i < na; ++i)
      if (held(i, na, post_norms, sandwich)) std::swap(acts[i], t.*kActs[i]);
    for (size_t i = 0; i < ns; ++i)
      if (held(i, ns, post_norms, sandwich)) std::swap(stats[i], t.*kStats[i]);
  }
  Buf<A> acts[std::size(kActs)];
  Buf<float> stats[std::size(kStats)];
  BlockDims dims;
  bool post_norms = false;
  bool sandwich = false;
};

// The activations of a whole-model pass: one shared BlockActs for every layer
// that is recomputed in the backward, one of its own for each of the last
// `keep` layers, whose forward activations stay for their backward, and
// `sets` AttnActs for each of the `keep_attn` layers before those, whose
// backward recomputes only the cheap half (selective recompute). sets > 1:
// the layer-major schedule, one attention half per micro-batch of a kept
// layer (it keeps no whole layers: keep 0).
template <class Ops>
class LayerActs {
 public:
  LayerActs(Ops& ops, const ModelSpec& s, const BlockDims& dm, int64_t keep, int64_t keep_attn = 0, int64_t sets = 1)
      : n_layers_(s.n_layers), sets_(sets), shared_(ops, s, dm) {
    RT_CHECK(keep >= 0, "[model] the number of layers whose activations are kept must be >= 0, got ", keep);
    RT_CHECK(keep_attn >= 0, "[model] the number of layers whose attention activations are kept must be >= 0, got ",
             keep_attn);
    RT_CHECK(sets >= 1 && (sets == 1 || keep == 0), "[model] internal: ", sets,
             " activation sets per layer keep attention halves only, not ", keep, " whole layers");
    for (int64_t i = 0; i < std::min(keep, n_layers_); ++i)
      kept_.push_back(std::make_unique<BlockActs<Ops>>(ops, s, dm));
    for (int64_t i = 0; i < std::min(keep_attn, n_layers_ - kept_count()) * sets; ++i)
      attn_.push_back(std::make_unique<AttnActs<Ops>>(ops, s, dm));
  }
  int64_t kept_count() const { return static_cast<int64_t>(kept_.size()); }
  int64_t attn_kept_count() const { return static_cast<int64_t>(attn_.size()) / sets_; }
  bool kept(int64_t layer) const { return layer >= n_layers_ - kept_count(); }
  // True when layer keeps its attention half (and is not fully kept).
  bool attn_kept(int64_t layer) const {
    return !kept(layer) && layer >= n_layers_ - kept_count() - attn_kept_count();
  }
  BlockActs<Ops>& shared() { return shared_; }
  // Where layer's training forward leaves its activations (and its backward finds them).
  BlockActs<Ops>& of(int64_t layer) {
    return kept(layer) ? *kept_[static_cast<size_t>(layer - (n_layers_ - kept_count()))] : shared_;
  }
  // The attention half of layer's micro-batch `set` (0 unless sets > 1).
  AttnActs<Ops>& attn_of(int64_t layer, int64_t set = 0) {
    RT_CHECK(attn_kept(layer) && set >= 0 && set < sets_, "[model] internal: layer ", layer, " set ", set,
             " keeps no attention activations");
    const int64_t j = layer - (n_layers_ - kept_count() - attn_kept_count());
    return *attn_[static_cast<size_t>(j * sets_ + set)];
  }
  // After layer's training forward in shared(): a layer that keeps its
  // attention half (of micro-batch `set`) moves it into its store (a swap).
  void keep_attention_half(int64_t layer, int64_t set = 0) {
    if (attn_kept(layer)) attn_of(layer, set).swap_with(shared_);
  }

 private:
  int64_t n_layers_, sets_;
  BlockActs<Ops> shared_;
  std::vector<std::unique_ptr<BlockActs<Ops>>> kept_;
  std::vector<std::unique_ptr<AttnActs<Ops>>> attn_;
};

// Scratch of one block's backward (one per engine, shared by every layer).
template <class Ops>
struct BlockScratch {
  using A = typename Ops::act_t;
  template <class T>
  using Buf = typename Ops::template Buffer<T>;
  Buf<A> d_a, d_g, d_u, d_hn, d_tmp, d_h, d_att, d_q, d_k, d_v, d_xn, d_tmp_q, d_tmp_k;
  BlockDims dims;  // what the buffers are sized for

  // Calls buf(member, n) for every buffer with its element count: the one
  // list the constructor allocates from and bytes() sums.
  template <class Buf_>
  static void each_buffer(const ModelSpec& s, const BlockDims& dm, Buf_&& buf) {
    const int64_t N = dm.N(), C = s.hidden, QD = s.q_dim(), KD = s.kv_dim();
    const int64_t F = s.is_moe() ? s.moe.shared_intermediate : s.intermediate;  // MoE: the shared expert's
    const int64_t R = s.is_moe() ? N : dm.mlp_rows();                           // the shared expert runs unchunked
    buf(&BlockScratch::d_a, std::max<int64_t>(R * F, 1));                       // one MLP chunk
    buf(&BlockScratch::d_g, std::max<int64_t>(R * F, 1));
    buf(&BlockScratch::d_u, std::max<int64_t>(R * F, 1));
    buf(&BlockScratch::d_hn, N * C);
    buf(&BlockScratch::d_tmp, N * C);
    buf(&BlockScratch::d_h, N * C);
    buf(&BlockScratch::d_att, N * QD);
    buf(&BlockScratch::d_q, N * QD);
    buf(&BlockScratch::d_k, N * KD);
    buf(&BlockScratch::d_v, N * KD);
    buf(&BlockScratch::d_xn, N * C);
    buf(&BlockScratch::d_tmp_q, s.qk_norm ? N * QD : 1);
    buf(&BlockScratch::d_tmp_k, s.qk_norm ? N * KD : 1);
  }
  static uint64_t bytes(const ModelSpec& s, const BlockDims& dm) {
    uint64_t b = 0;
    each_buffer(s, dm, [&](auto, int64_t n) { b += static_cast<uint64_t>(n) * sizeof(A); });
    return b;
  }

  BlockScratch(Ops& ops, const ModelSpec& s, const BlockDims& dm) : dims(dm) {
    check_block_dims(dm);
    each_buffer(s, dm, [&](auto m, int64_t n) { this->*m = ops.template alloc<A>(n); });
  }
};

}  // namespace rt
