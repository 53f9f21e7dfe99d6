// The optimizer step over HostState units: AdamW (optim/adamw.h) applied to a
// unit's arena [master | m | v] tensor by tensor, with each tensor's weight
// decay. Both backends update through these, so their weights agree bit for bit.
#pragma once
#include <cstdint>

#include "optim/adamw.h"
#include "optim/muon.h"
#include "state/host_state.h"

namespace rt {

struct OptimStep {
  double lr = 0;
  int64_t t = 0;  // 1-based count of applied updates, for bias correction
  AdamWHyper hyper;
  double weight_decay = 0;
  bool decay_norms_and_biases = false;
  double clip = 1.0;        // <= 0: off
  bool inject_nan = false;  // test hook: treat this step's loss as NaN (so it is skipped)
  // quantized moments (optim/adamw_lean.h): how m, v are rounded back to their codes
  QuantRounding moment_rounding = QuantRounding::stochastic;
  uint64_t rounding_seed = 0;  // key of stochastic rounding (moments, bf16-sr master)
  MuonHyper muon;              // units with muon set (--optimizer muon | muon8bit | muon4bit, optim/muon_unit.h)
  // where Muon's NS5 runs (optim/muon.h); nullptr: on the CPU (the spec).
  // Set by the engine that owns it (the CUDA engine: its GPU one), not by the trainer.
  Orthogonalizer* orthogonalizer = nullptr;
};

// The weight decay of one tensor under o's policy.
inline double weight_decay_for(const WeightEntry& e, const OptimStep& o) {
  return (e.is_norm_or_bias && !o.decay_norms_and_biases) ? 0.0 : o.weight_decay;
}
// AdamW over one unit: grad[numel] laid out like the unit's arena; bf16_shadow
// (nullable) receives the updated weights as bf16 in the same layout.
// Split master storage (host_state.h): bf16_shadow must be one of the unit's
// shadows, the upper half of the updated master (adamw_update_split), and
// becomes the current one; shadow_prev (nullable: in place) the unit's other
// shadow, which holds the master before the update (delayed-update mode).
// Bit-identical to the fp32 storage: masters, moments and shadows.
// Quantized moments and bf16 masters go through optim/adamw_lean.h (same
// shadow rules; bf16_shadow nullptr on a shadow master: its current shadow,
// in place). Quantized moments need b, e at multiples of kQuantBlock (or e at
// the unit's end): the engine's chunks are 4096-element aligned.
void update_unit(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow,
                 const uint16_t* shadow_prev = nullptr);
// The same over the unit's elements [b, e) only: grad[e - b] holds their
// gradients (grad[0] is element b); bf16_shadow (nullable) is the whole unit's.
// Elementwise, so any split of a unit gives the same values as update_unit.
// Muon units (StateUnit::muon, optim/muon_unit.h) update whole matrices: only
// the whole unit [0, numel), in place, is accepted.
void update_unit_range(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* bf16_shadow, const uint16_t* shadow_prev = nullptr);

}  // namespace rt
