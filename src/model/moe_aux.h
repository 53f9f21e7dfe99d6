// MoeAux: the routing bookkeeping of one micro-batch through every MoE layer:
// the tokens each expert received per layer (the stats hook) and the
// load-balancing auxiliary loss, as transformers' load_balancing_loss_func
// computes it (Switch Transformer eqs. 4-6) when attention_mask is None:
//
//   over the R = L x N rows of every layer's router (L MoE layers, N tokens),
//   T_e = rows whose top-k holds expert e,  P_e = sum over rows of p[row, e],
//   aux = E * sum_e (T_e / R) * (P_e / R)
//
// T is a count (no gradient); d aux / d p[row, e] = E T_e / R^2, the same for
// every row of every layer, so the backward needs only E numbers (dprob),
// known once the whole forward ran. Every token of the batch counts,
// including those whose target is ignored (HF passes no attention mask for
// packed training batches). The loss joins training only when the config's
// output_router_logits is true (ModelSpec::MoeConfig::aux_loss_on), with the
// weight router_aux_loss_coef x the micro-batch's share (BatchView).
//
// Note: transformers 5.x releases before the fix of huggingface/transformers
// issue 45120 hand the routers' softmax output instead of their logits to
// load_balancing_loss_func, which applies softmax again. This follows the
// function's intended (4.x) input: the raw router logits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/block.h"
#include "model/spec.h"

namespace rt {

class MoeAux {
 public:
  explicit MoeAux(const ModelSpec& s)
      : E_(s.moe.n_experts),
        L_(s.is_moe() ? s.n_layers : 0),
        tokens_(static_cast<size_t>(E_ * L_)),
        prob_sum_(static_cast<size_t>(E_ * L_)),
        dprob_(static_cast<size_t>(E_)) {}

  // Starts a micro-batch: every count and sum back to zero.
  void begin() {
    std::fill(tokens_.begin(), tokens_.end(), 0);
    std::fill(prob_sum_.begin(), prob_sum_.end(), 0.0);
    std::fill(dprob_.begin(), dprob_.end(), 0.0f);
    aux_ = 0;
    weight_ = 0;
  }
  // What layer i's training forward adds to.
  MoeLayerRouting forward_routing(int64_t i) {
    return MoeLayerRouting{tokens_.data() + i * E_, prob_sum_.data() + i * E_, nullptr};
  }
  // What layer i's backward reads: the load-balancing gradient, or nothing when its weight is 0.
  MoeLayerRouting backward_routing() const {
    return MoeLayerRouting{nullptr, nullptr, weight_ ? dprob_.data() : nullptr};
  }

  // After the forward of every layer over N tokens: the aux loss, and dprob
  // = weight * d aux / d p. Returns aux (unweighted).
  double finish(int64_t N, double weight) {
    weight_ = weight;
    const double R = static_cast<double>(L_) * static_cast<double>(N);
    aux_ = 0;
    for (int64_t e = 0; e < E_; ++e) {
      double T = 0, P = 0;
      for (int64_t l = 0; l < L_; ++l) {
        T += static_cast<double>(tokens_[static_cast<size_t>(l * E_ + e)]);
        P += prob_sum_[static_cast<size_t>(l * E_ + e)];
      }
      aux_ += (T / R) * (P / R);
      dprob_[static_cast<size_t>(e)] = static_cast<float>(weight * static_cast<double>(E_) * T / (R * R));
    }
    aux_ *= static_cast<double>(E_);
    return aux_;
  }

  double aux_loss() const { return aux_; }  // of the last finish()
  int64_t experts() const { return E_; }
  // Tokens routed to each expert of layer i in the last training forward ([E]).
  const int64_t* tokens_per_expert(int64_t i) const { return tokens_.data() + i * E_; }

 private:
  int64_t E_, L_;
  std::vector<int64_t> tokens_;   // [L, E]
  std::vector<double> prob_sum_;  // [L, E]
  std::vector<float> dprob_;      // [E]
  double aux_ = 0, weight_ = 0;
};

}  // namespace rt
