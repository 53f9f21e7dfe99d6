// The CPU backend: fp32 forward/backward through ModelRunner<CpuOps> into
// HostState's gradient arenas, then clipping and AdamW over each unit.
// Layer-major (backend.h): the same ops over K micro-batches in the CUDA
// engine's layer-major order (LayerMajorRunner below), the twin its
// bit-identity is checked against.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "engine/backend.h"
#include "engine/fold_clip.h"
#include "engine/update_order.h"
#include "model/block_memory.h"
#include "model/model.h"
#include "state/host_state.h"
#include "state/state_tier.h"

namespace rt {

namespace {

std::vector<int32_t> positions(const Batch& b) {
  std::vector<int32_t> pos(static_cast<size_t>(b.B * b.T));
  batch_positions(b, pos.data());
  return pos;
}

// Forward + backward of K micro-batches in layer-major order: embed all K;
// for each layer i, block i on every micro-batch (the K x (L+1) block inputs
// kept); the head per micro-batch; for each layer i from L-1 down, recompute
// block i and back-propagate micro-batch k = 0..K-1 with its own residual
// gradient dx^k; the embedding's backward per micro-batch. Every block is
// recomputed (no kept activations: they are per layer, not per micro-batch).
// The same ops, chunk sizes and per-element accumulation order as
// ModelRunner::forward_backward run K times (untied embeddings). MoE models:
// one MoeAux per micro-batch, finished once every layer's forward ran (the
// load-balancing gradient of micro-batch k needs k's routing through every
// layer, which layer-major has before any backward).
class LayerMajorRunner {
 public:
  // keep_attn: the last layers whose K micro-batches keep their attention
  // halves from the forward to the backward (the CUDA engine's layer-major
  // selective recompute; the others are recomputed whole).
  LayerMajorRunner(CpuOps& ops, const ModelSpec& s, int64_t B, int64_t T, int64_t K, int64_t ce_chunk_rows,
                   int64_t mlp_chunk_tokens, int64_t keep_attn)
      : ops_(ops),
        s_(s),
        dm_{B, T, mlp_chunk_tokens},
        K_(K),
        ce_chunk_(ce_chunk_rows),
        acts_(ops, s, dm_, 0, keep_attn, K),
        scratch_(ops, s, dm_),
        aux_(static_cast<size_t>(K), MoeAux(s)) {
    const int64_t N = dm_.N(), C = s_.hidden;
    ckpt_ = ops.alloc<float>(K * (s_.n_layers + 1) * N * C);
    dx_ = ops.alloc<float>(K * N * C);
    hf_ = ops.alloc<float>(N * C);
    dhf_ = ops.alloc<float>(N * C);
    rstd_f_ = ops.alloc<float>(N);
  }

  // b[k]: micro-batch k (each B x T). Returns the sum of token losses.
  double forward_backward(const ModelWeightsT<float>& w, ModelGrads& g, const BatchView* b, float grad_scale,
                          int64_t* n_valid) {
    const int64_t N = dm_.N(), C = s_.hidden, V = s_.vocab, L = s_.n_layers;
    auto x = [&](int64_t k, int64_t i) { return ckpt_.data() + (k * (L + 1) + i) * N * C; };
    auto dx = [&](int64_t k) { return dx_.data() + k * N * C; };
    // Granite's embedding multiplier and logits scaling, as ModelRunner
    const float em = static_cast<float>(s_.embedding_multiplier), ls = static_cast<float>(1.0 / s_.logits_scaling);
    for (int64_t k = 0; k < K_; ++k) {
      RT_CHECK(b[k].B == dm_.B && b[k].T == dm_.T, "[model] batch shape ", b[k].B, "x", b[k].T,
               " does not match the runner's ", dm_.B, "x", dm_.T);
      ops_.embedding_forward(x(k, 0), b[k].ids, w.embed, N, C);
      if (em != 1.f) ops_.scale(x(k, 0), x(k, 0), em, N * C);
    }
    const bool moe = s_.is_moe();
    for (MoeAux& a : aux_) a.begin();
    for (int64_t i = 0; i < L; ++i)
      for (int64_t k = 0; k < K_; ++k) {
        const MoeLayerRouting routing = moe ? aux_[k].forward_routing(i) : MoeLayerRouting{};
        block_forward(ops_, s_, w.layers[i], dm_, x(k, i), x(k, i + 1), b[k].pos, acts_.shared(), b[k].doc_start,
                      moe ? &routing : nullptr);
        acts_.keep_attention_half(i, k);
      }
    if (moe)
      for (int64_t k = 0; k < K_; ++k)
        aux_[k].finish(N, s_.moe.aux_loss_on() ? s_.moe.router_aux_loss_coef * b[k].aux_loss_scale : 0.0);
    double loss = 0;
    *n_valid = 0;
    for (int64_t k = 0; k < K_; ++k) {
      int64_t nv = 0;
      ops_.rms_norm_forward(hf_.data(), rstd_f_.data(), x(k, L), w.final_norm, N, C, static_cast<float>(s_.rms_eps));
      if (ls != 1.f) ops_.scale(hf_.data(), hf_.data(), ls, N * C);
      loss += ops_.lm_head_cross_entropy(dhf_.data(), g.lm_head, hf_.data(), w.lm_head, b[k].targets, N, C, V,
                                         grad_scale, ce_chunk_, &nv, static_cast<float>(s_.final_softcap));
      if (ls != 1.f) ops_.scale(dhf_.data(), dhf_.data(), ls, N * C);
      *n_valid += nv;
      ops_.rms_norm_backward(dx(k), g.final_norm, dhf_.data(), x(k, L), w.final_norm, rstd_f_.data(), N, C);
    }
    for (int64_t i = L - 1; i >= 0; --i)
      for (int64_t k = 0; k < K_; ++k) {
        block_recompute(ops_, s_, w.layers[i], dm_, x(k, i), b[k].pos, acts_, i, b[k].doc_start, k);
        const MoeLayerRouting back_routing = aux_[k].backward_routing();
        block_backward(ops_, s_, w.layers[i], dm_, x(k, i), dx(k), dx(k), b[k].pos, acts_.shared(), scratch_,
                       g.layers[i], b[k].doc_start, moe ? &back_routing : nullptr);
      }
    for (int64_t k = 0; k < K_; ++k) {
      if (em != 1.f) ops_.scale(dx(k), dx(k), em, N * C);
      ops_.embedding_backward(g.embed, dx(k), b[k].ids, N, C);
    }
    return loss;
  }

  // MoE: micro-batch k's routing of the last forward_backward (load-balancing loss, tokens per expert).
  const MoeAux& moe_aux(int64_t k) const { return aux_[static_cast<size_t>(k)]; }

 private:
  CpuOps& ops_;
  const ModelSpec& s_;
  BlockDims dm_;
  int64_t K_, ce_chunk_;
  LayerActs<CpuOps> acts_;
  BlockScratch<CpuOps> scratch_;
  std::vector<float> ckpt_, dx_, hf_, dhf_, rstd_f_;
  std::vector<MoeAux> aux_;  // one per micro-batch
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(HostState& s, bool delayed, int64_t keep, bool layer_major, int64_t mlp_chunk, bool fold,
             int64_t keep_attn, MatmulMode matmul)
      : state_(s),
        ops_(s.spec()),
        delayed_(delayed),
        keep_(keep),
        keep_attn_(keep_attn),
        layer_major_(layer_major),
        fold_(fold),
        mlp_chunk_(std::max<int64_t>(mlp_chunk, 0)) {
    RT_CHECK(keep >= -1, "[train] --keep-activations must be auto or a layer count >= 0, got ", keep);
    RT_CHECK(keep_attn >= -1, "[train] --keep-attention must be auto or a layer count >= 0, got ", keep_attn);
    ops_.set_matmul(matmul);
    RT_CHECK(mlp_chunk >= -1, "[train] --mlp-chunk-tokens must be auto, 0 (off) or a token count > 0, got ", mlp_chunk);
    // the forward reads the fp32 master: a split one (same values) is converted; a bf16 master (its own
    // arithmetic) stays, and the forward reads its decoded copy (HostState::weights)
    if (state_.master_storage() == MasterStorage::split) state_.set_master_storage(MasterStorage::fp32);
    state_.ensure_grads();
  }
  bool pages_state() const override { return true; }
  std::string weight_paging_refusal() const override { return ""; }  // compute_weights(): its own fp32 copy
  EngineStats stats() const override {
    EngineStats s;
    s.moe_tokens_per_expert = moe_tokens_;
    s.moe_aux_loss = moe_aux_;
    return s;
  }
  std::string describe() const override {
    const MasterStorage ms = state_.master_storage();
    return cat(
        "cpu (fp32 reference", ms != MasterStorage::fp32 ? cat(", ", master_storage_name(ms), " master") : "",
        state_.moment_storage() != MomentStorage::fp32 ? cat(", ", moment_storage_name(state_.moment_storage())) : "",
        delayed_ ? ", delayed update" : "", layer_major_ ? ", layer-major" : "",
        ops_.matmul() == MatmulMode::fp8          ? ", fp8 projections (twin)"
        : ops_.matmul() == MatmulMode::fp8_tensor ? ", fp8 projections, per-tensor scales (twin)"
                                                  : "",
        ")");
  }

  // Forward + backward of every micro-batch into the gradient arenas (zeroed
  // first); the loss sum, *n_valid tokens. Layer-major when asked and K > 1.
  double accumulate_grads(const std::vector<Batch>& batches, float grad_scale, int64_t* n_valid) {
    state_.zero_grads();
    ModelWeightsT<float> w = compute_weights();
    ModelGrads g = state_.grads();
    std::vector<std::vector<int32_t>> pos;
    std::vector<BatchView> views;
    for (const Batch& b : batches) {
      pos.push_back(positions(b));
      views.push_back(BatchView{b.B, b.T, b.inputs.data(), b.targets.data(), pos.back().data(), batch_doc_start(b)});
    }
    *n_valid = 0;
    for (BatchView& v : views)
      v.aux_loss_scale = 1.0f / static_cast<float>(views.size());  // MoE: mean over micro-batches
    const ModelSpec& sp = state_.spec();
    moe_tokens_.assign(sp.is_moe() ? static_cast<size_t>(sp.n_layers * sp.moe.n_experts) : 0, 0);
    moe_aux_ = 0;
    auto count_routing = [&](const MoeAux& a) {  // the stats hook: per-expert token counts of every layer
      if (!sp.is_moe()) return;
      for (int64_t l = 0; l < sp.n_layers; ++l)
        for (int64_t e = 0; e < sp.moe.n_experts; ++e)
          moe_tokens_[static_cast<size_t>(l * sp.moe.n_experts + e)] += a.tokens_per_expert(l)[e];
      moe_aux_ += a.aux_loss() / static_cast<double>(views.size());
    };
    if (layer_major_ && batches.size() > 1) {
      const int64_t K = static_cast<int64_t>(batches.size());
      auto& r = lm_runners_[{batches[0].B, batches[0].T, K}];
      if (!r)
        r = std::make_unique<LayerMajorRunner>(ops_, state_.spec(), batches[0].B, batches[0].T, K, 256, mlp_chunk_,
                                               std::max<int64_t>(keep_attn_, 0));  // auto: none (a twin)
      const double sum = r->forward_backward(w, g, views.data(), grad_scale, n_valid);
      for (int64_t k = 0; k < K; ++k) count_routing(r->moe_aux(k));
      return sum;
    }
    double sum = 0;
    for (const BatchView& v : views) {
      int64_t nv = 0;
      ModelRunner<CpuOps>& r = runner(v.B, v.T);
      sum += r.forward_backward(w, &g, v, grad_scale, &nv);
      *n_valid += nv;
      count_routing(r.moe_aux());
    }
    return sum;
  }

  ModelRunner<CpuOps>& runner(int64_t B, int64_t T) {
    auto& r = runners_[{B, T}];
    if (!r) {
      const ModelSpec& sp = state_.spec();
      const BlockDims dm{B, T, mlp_chunk_};
      const uint64_t per_layer = BlockActs<CpuOps>::bytes(sp, dm);
      // auto: what fits in a quarter of the host RAM available now, whole
      // layers first, then attention halves (the CPU keeps whole layers by
      // default: plenty of RAM, and it is the reference schedule)
      const uint64_t quarter = host_memory_available() / 4;
      int64_t keep = keep_;
      if (keep < 0) keep = static_cast<int64_t>(quarter / std::max<uint64_t>(per_layer, 1));
      keep = std::min(keep, sp.n_layers);
      const uint64_t left = quarter - std::min(quarter, static_cast<uint64_t>(keep) * per_layer);
      const KeptLayers k = plan_kept_layers(sp, dm, left, 4, 1, 0, keep_attn_);
      r = std::make_unique<ModelRunner<CpuOps>>(ops_, sp, B, T, 256, keep, mlp_chunk_,
                                                std::min(k.attention, sp.n_layers - keep));
      if (!logged_keep_) {
        std::printf(
            "cpu backend: activations of %lld of %lld layers kept from forward to backward (%.1f MiB), the attention "
            "half of %lld more (%.1f MiB); the others are recomputed (--keep-activations, --keep-attention)\n",
            (long long)keep, (long long)sp.n_layers, keep * per_layer / double(1 << 20),
            (long long)r->attn_kept_layers(),
            r->attn_kept_layers() * AttnActs<CpuOps>::bytes(sp, dm) / double(1 << 20));
        logged_keep_ = true;
      }
    }
    return *r;
  }

  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override {
    int64_t nv = 0;
    return accumulate_grads(batches, 1.0f / static_cast<float>(n_valid_total), &nv);
  }

  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override {
    StepStats st;
    st.loss_sum = accumulate_grads(batches, 1.0f / static_cast<float>(n_valid_total), &st.n_valid);
    if (o.inject_nan) st.loss_sum = NAN;
    auto& units = state_.units();
    std::vector<double> unit_sq(units.size());
    double sq = 0;
    for (size_t k = 0; k < units.size(); ++k) sq += unit_sq[k] = sum_squares(units[k].grad.p, units[k].numel);
    st.grad_norm = std::sqrt(sq);
    if (fold_) {  // the twin of --grads fold (engine/fold_clip.h)
      const bool apply = std::isfinite(st.loss_sum);
      FoldClip clip(o.clip);
      for_each_unit_state(state_, fold_order(state_.spec().n_layers), [&](size_t k) {
        const float c = clip.next(unit_sq[k]);
        if (apply && std::isfinite(unit_sq[k])) {
          update_unit(units[k], units[k].grad.p, o, c, nullptr);
          refresh_compute_copy(k);
        }
      });
      st.applied = apply && clip.all_finite();
      return st;
    }
    const bool ok = std::isfinite(st.loss_sum) && std::isfinite(st.grad_norm);
    const float coef = ok ? clip_coefficient(st.grad_norm, o.clip) : 0.0f;
    st.applied = ok;
    if (!delayed_) {
      if (ok)
        for_each_unit_state(state_, update_order(units.size(), false), [&](size_t k) {
          update_unit(units[k], units[k].grad.p, o, coef, nullptr);
          refresh_compute_copy(k);
        });
      return st;
    }
    // Delayed: the previous step's update goes in now (after this step's
    // gradients were computed on the weights before it); this step's waits.
    apply_pending();
    pending_.grads.resize(units.size());
    for (size_t k = 0; k < units.size(); ++k)
      pending_.grads[k].assign(units[k].grad.p, units[k].grad.p + units[k].numel);
    pending_.has = true;
    pending_.apply = ok;
    pending_.o = o;
    pending_.coef = coef;
    return st;
  }

  void sync() override { apply_pending(); }

  double loss_sum(const Batch& b, int64_t* n_valid) override {
    std::vector<int32_t> pos = positions(b);
    return runner(b.B, b.T).forward_backward(
        compute_weights(), nullptr,
        BatchView{b.B, b.T, b.inputs.data(), b.targets.data(), pos.data(), batch_doc_start(b)}, 1.0f, n_valid);
  }

 private:
  void apply_pending() {
    if (!pending_.has) return;
    auto& units = state_.units();
    if (pending_.apply)
      for_each_unit_state(state_, update_order(units.size(), false), [&](size_t k) {
        update_unit(units[k], pending_.grads[k].data(), pending_.o, pending_.coef, nullptr);
        refresh_compute_copy(k);
      });
    pending_.has = false;
  }

  // The weights the forward and backward read: the state's own (the fp32
  // master, or a bf16 master's decoded copy, HostState::weights), or, when
  // the state tier pages them (--state-dir), this backend's fp32 copy: the
  // twin of the CUDA engine's device-resident layers. It is made on first use
  // (each unit read in from the tier, clean) and refreshed from each unit
  // right after its update, while the unit is paged in (refresh_compute_copy),
  // so a step reads no weights from the tier. The same values as the state's
  // own (a copy of the fp32 master, or the bf16 master decoded the same way):
  // the run stays bit-identical to the all-in-RAM one.
  ModelWeightsT<float> compute_weights() {
    const StateTier* t = state_.tier();
    if (!t || !t->plan().weights_paged) {
      compute_.clear();
      return state_.weights();
    }
    if (compute_.empty()) {
      const auto& units = state_.units();
      compute_.resize(units.size());
      uint64_t bytes = 0;
      for (size_t k = 0; k < units.size(); ++k) {
        compute_[k] =
            HostBuffer(static_cast<size_t>(units[k].numel),
                       cat("the cpu backend's fp32 copy of ", units[k].name, " (--state-dir pages the weights)"));
        bytes += static_cast<uint64_t>(units[k].numel) * 4;
      }
      std::vector<size_t> all(units.size());
      for (size_t k = 0; k < all.size(); ++k) all[k] = k;
      state_.tier()->for_each(
          all, [&](size_t k) { refresh_compute_copy(k); }, false);
      std::printf(
          "cpu backend: the weights page (--state-dir): the forward and backward read an fp32 copy of every unit "
          "(%.1f MiB, outside --max-host-memory: the twin of the device-resident weights), refreshed from each unit "
          "after its update\n",
          bytes / double(1 << 20));
    }
    return state_.weights_in(compute_);
  }
  void refresh_compute_copy(size_t k) {
    if (compute_.empty()) return;
    const StateUnit& u = state_.units()[k];
    u.read_master(0, u.numel, compute_[k].p);
  }

  HostState& state_;
  CpuOps ops_;
  bool delayed_;
  int64_t keep_;       // --keep-activations (-1: auto)
  int64_t keep_attn_;  // --keep-attention (-1: auto)
  bool layer_major_;
  bool fold_;          // --grads fold's twin
  int64_t mlp_chunk_;  // MLP token chunk (0: unchunked; auto is unchunked: no device budget here)
  bool logged_keep_ = false;
  std::vector<int64_t> moe_tokens_;  // EngineStats::moe_tokens_per_expert of the last step
  double moe_aux_ = 0;
  struct {
    bool has = false, apply = false;
    OptimStep o;
    float coef = 0;
    std::vector<std::vector<float>> grads;  // per unit, laid out like its arena
  } pending_;
  std::vector<HostBuffer> compute_;  // compute_weights(): per unit, when the state tier pages the weights
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ModelRunner<CpuOps>>> runners_;
  std::map<std::array<int64_t, 3>, std::unique_ptr<LayerMajorRunner>> lm_runners_;  // (B, T, K)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(HostState& state, bool delayed_update, int64_t keep_activations,
                                          bool layer_major, int64_t mlp_chunk_tokens, bool fold,
                                          int64_t keep_attention, MatmulMode matmul) {
  RT_CHECK(!(fold && delayed_update), "[train] --grads fold and --delayed-update cannot be combined (fold updates "
           "each unit in the step that made its gradient)");
  return std::make_unique<CpuBackend>(state, delayed_update, keep_activations, layer_major, mlp_chunk_tokens, fold,
                                      keep_attention, matmul);
}

}  // namespace rt
