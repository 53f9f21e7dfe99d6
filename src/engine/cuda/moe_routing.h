// The CUDA engine's MoE routing bookkeeping (model/moe_aux.h's MoeAux, whose
// finish() is the CPU spec), kept in device memory so that no MoE layer
// waits for the host:
//  - DeviceMoeAux: one micro-batch's tokens per expert and probability sums
//    per layer [L, E], which the layers' training forwards add to on the
//    device (cuda::moe_forward), and the load-balancing gradient factor
//    dprob [E] that finish() computes there (cuda::moe_aux_finish: MoeAux's
//    fp64 operations in MoeAux's order, so the same bits) for the backward.
//  - DeviceMoeStats: a step's tokens per expert and layer and its weighted
//    load-balancing loss, summed on the device over the micro-batches; stage()
//    queues their copy to pinned memory before the step's one wait for its
//    loss, and the host reads them after that wait.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/ops.h"
#include "model/block.h"
#include "model/spec.h"

namespace rt::cuda {

class DeviceMoeStats {
 public:
  DeviceMoeStats(DeviceAllocator& a, const ModelSpec& s)
      : n_(s.moe.n_experts * s.n_layers),
        tokens_(a, n_, "MoE step tokens per expert"),
        aux_(a, 1, "MoE step load-balancing loss"),
        host_(static_cast<size_t>(n_) * sizeof(int64_t) + sizeof(double), "MoE statistics staging") {}

  // A step starts: its sums back to zero (on the stream).
  void reset(cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(tokens_.data(), 0, tokens_.bytes(), stream));
    CUDA_CHECK(cudaMemsetAsync(aux_.data(), 0, aux_.bytes(), stream));
  }
  int64_t* tokens() { return tokens_.data(); }
  double* aux() { return aux_.data(); }
  // Queues the copy of the step's sums to the host; valid once the stream
  // reached it (the step's wait for its loss).
  void stage(cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(host_.as<int64_t>(), tokens_.data(), tokens_.bytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host_.as<uint8_t>() + tokens_.bytes(), aux_.data(), sizeof(double),
                               cudaMemcpyDeviceToHost, stream));
    staged_ = true;
  }
  // The last staged step's tokens per expert [L, E] (empty before any) and loss.
  std::vector<int64_t> host_tokens() const {
    if (!staged_) return {};
    const int64_t* t = host_.as<int64_t>();
    return std::vector<int64_t>(t, t + n_);
  }
  double host_aux() const {
    if (!staged_) return 0;
    return *reinterpret_cast<const double*>(host_.as<uint8_t>() + tokens_.bytes());
  }

 private:
  int64_t n_;
  DevBuf<int64_t> tokens_;  // [L, E]
  DevBuf<double> aux_;      // [1]
  PinnedBuf host_;          // tokens [L, E], then the loss
  bool staged_ = false;
};

class DeviceMoeAux {
 public:
  DeviceMoeAux(DeviceAllocator& a, const ModelSpec& s)
      : E_(s.moe.n_experts),
        L_(s.n_layers),
        tokens_(a, E_ * L_, "MoE tokens per expert"),
        prob_sum_(a, E_ * L_, "MoE router probability sums"),
        dprob_(a, E_, "MoE load-balancing gradient") {}

  // Starts a micro-batch: every count and sum back to zero (on the stream).
  void begin(cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(tokens_.data(), 0, tokens_.bytes(), stream));
    CUDA_CHECK(cudaMemsetAsync(prob_sum_.data(), 0, prob_sum_.bytes(), stream));
    weight_ = 0;
  }
  // What layer i's training forward adds to (device arrays).
  MoeLayerRouting forward_routing(int64_t i) {
    return MoeLayerRouting{tokens_.data() + i * E_, prob_sum_.data() + i * E_, nullptr};
  }
  // What layer i's backward reads: the load-balancing gradient, or nothing when its weight is 0.
  MoeLayerRouting backward_routing() const {
    return MoeLayerRouting{nullptr, nullptr, weight_ != 0 ? dprob_.data() : nullptr};
  }
  // After the forward of every layer over N tokens (queued on the stream):
  // dprob = weight * d aux / d p, and the step's statistics gathered into
  // stats (aux weighted by aux_scale, the micro-batch's share).
  void finish(int64_t N, double weight, float aux_scale, DeviceMoeStats& stats, cudaStream_t stream);

 private:
  int64_t E_, L_;
  DevBuf<int64_t> tokens_;   // [L, E]
  DevBuf<double> prob_sum_;  // [L, E]
  DevBuf<float> dprob_;      // [E]
  double weight_ = 0;
};

inline void DeviceMoeAux::finish(int64_t N, double weight, float aux_scale, DeviceMoeStats& stats,
                                 cudaStream_t stream) {
  weight_ = weight;
  moe_aux_finish(dprob_.data(), stats.tokens(), stats.aux(), tokens_.data(), prob_sum_.data(), L_, E_, N, weight,
                 aux_scale, stream);
}

}  // namespace rt::cuda
