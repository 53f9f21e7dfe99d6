// The CPU backend: fp32 forward/backward through ModelRunner<CpuOps> into
// HostState's gradient arenas, then clipping and AdamW over each unit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "engine/backend.h"
#include "state/host_state.h"

namespace rt {

namespace {

std::vector<int32_t> positions(const Batch& b) {
  std::vector<int32_t> pos(static_cast<size_t>(b.B * b.T));
  batch_positions(b, pos.data());
  return pos;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(HostState& s, bool delayed, int64_t keep) : state_(s), ops_(s.spec()), delayed_(delayed), keep_(keep) {
    RT_CHECK(keep >= -1, "[train] --keep-activations must be auto or a layer count >= 0, got ", keep);
    state_.set_master_storage(MasterStorage::fp32);  // the forward reads the fp32 master (a no-op unless split)
    state_.ensure_grads();
  }
  std::string describe() const override {
    return delayed_ ? "cpu (fp32 reference, delayed update)" : "cpu (fp32 reference)";
  }

  ModelRunner<CpuOps>& runner(int64_t B, int64_t T) {
    auto& r = runners_[{B, T}];
    if (!r) {
      const ModelSpec& sp = state_.spec();
      const uint64_t per_layer = BlockActs<CpuOps>::bytes(sp, BlockDims{B, T});
      int64_t keep = keep_;
      if (keep < 0) keep = static_cast<int64_t>(host_memory_available() / 4 / std::max<uint64_t>(per_layer, 1));
      keep = std::min(keep, sp.n_layers);
      r = std::make_unique<ModelRunner<CpuOps>>(ops_, sp, B, T, 256, keep);
      if (!logged_keep_) {
        std::printf("cpu backend: activations of %lld of %lld layers kept from forward to backward (%.1f MiB; the "
                    "others are recomputed; --keep-activations)\n",
                    (long long)keep, (long long)sp.n_layers, keep * per_layer / double(1 << 20));
        logged_keep_ = true;
      }
    }
    return *r;
  }

  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override {
    state_.zero_grads();
    ModelWeightsT<float> w = state_.weights();
    ModelGrads g = state_.grads();
    double sum = 0;
    for (const Batch& b : batches) {
      std::vector<int32_t> pos = positions(b);
      int64_t nv = 0;
      sum += runner(b.B, b.T).forward_backward(w, &g, BatchView{b.B, b.T, b.inputs.data(), b.targets.data(), pos.data()},
                                               1.0f / static_cast<float>(n_valid_total), &nv);
    }
    return sum;
  }

  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override {
    StepStats st;
    state_.zero_grads();
    ModelWeightsT<float> w = state_.weights();
    ModelGrads g = state_.grads();
    const float grad_scale = 1.0f / static_cast<float>(n_valid_total);
    for (const Batch& b : batches) {
      std::vector<int32_t> pos = positions(b);
      int64_t nv = 0;
      st.loss_sum += runner(b.B, b.T).forward_backward(
          w, &g, BatchView{b.B, b.T, b.inputs.data(), b.targets.data(), pos.data()}, grad_scale, &nv);
      st.n_valid += nv;
    }
    if (o.inject_nan) st.loss_sum = NAN;
    double sq = 0;
    for (auto& u : state_.units()) sq += sum_squares(u.grad.p, u.numel);
    st.grad_norm = std::sqrt(sq);
      const bool ok = std::isfinite(st.loss_sum) && std::isfinite(st.grad_norm);
    const float coef = ok ? clip_coefficient(st.grad_norm, o.clip) : 0.0f;
    st.applied = ok;
    if (!delayed_) {
      if (ok)
        for (auto& u : state_.units()) update_unit(u, u.grad.p, o, coef, nullptr);
      return st;
    }
    // Delayed: the previous step's update goes in now (after this step's
    // gradients were computed on the weights before it); this step's waits.
    apply_pending();
    auto& units = state_.units();
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
    return runner(b.B, b.T).forward_backward(state_.weights(), nullptr,
                                             BatchView{b.B, b.T, b.inputs.data(), b.targets.data(), pos.data()}, 1.0f,
                                             n_valid);
  }

 private:
  void apply_pending() {
    if (!pending_.has) return;
    auto& units = state_.units();
    if (pending_.apply)
      for (size_t k = 0; k < units.size(); ++k) update_unit(units[k], pending_.grads[k].data(), pending_.o, pending_.coef, nullptr);
    pending_.has = false;
  }

  HostState& state_;
  CpuOps ops_;
  bool delayed_;
  int64_t keep_;  // --keep-activations (-1: auto)
  bool logged_keep_ = false;
  struct {
    bool has = false, apply = false;
    OptimStep o;
    float coef = 0;
    std::vector<std::vector<float>> grads;  // per unit, laid out like its arena
  } pending_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ModelRunner<CpuOps>>> runners_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(HostState& state, bool delayed_update, int64_t keep_activations) {
  return std::make_unique<CpuBackend>(state, delayed_update, keep_activations);
}

}  // namespace rt
