// The state tier in a run's plan (`ramtrain plan --state-dir/--max-host-memory
// --ssd-gbs`; state/state_tier.h is the engine's side): what of the host state
// lives in RAM and what on the SSD, the SSD traffic of a step, and whether
// the SSD binds the step. The optimizer state pages first (tier_place, the
// engine's own placement); when RAM cannot hold even the bf16 weights and the
// gradients beside three units in flight, the weights page too. Weights on
// the SSD held on the device (device_resident: every layer in its own slot,
// the engine's way) are read and written once a step, with the state, and
// cross PCIe once, after their update; on a card too small for them they
// would be read ahead of the forward, the backward and the update (3 reads;
// planned only: the engine refuses it); optimizer state is read and written once.
// The I/O runs while the update does (tier_step_s).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/step_model.h"
#include "state/state_tier.h"

namespace rt {

struct RunTierPlan {
  TierPlan place;                            // per unit: paged or kept; RAM and file bytes
  bool weights_paged = false;                // the bf16 weights have a home on the SSD too
  bool device_resident = false;              // ... and the device holds every layer (1 read a step, not 3)
  uint64_t state_file = 0;                   // the file's optimizer-state bytes
  uint64_t weights_file = 0;                 // the file's weight bytes (weights_paged)
  uint64_t read_bytes = 0, write_bytes = 0;  // SSD traffic per step
  double ssd_s = 0;                          // traffic / ssd_gbs
  bool fits = true;                          // the budget holds the minimum (with weights paged if need be)
};

// For the CUDA engine's host state: `shadows` pinned bf16 shadows (the fp32
// storage's engine-owned ones or a shadow master's), the optimizer state of
// `moments` and `rule` (an fp32 master, read only by the optimizer, pages
// with it), grad_bytes[u] of host gradients per unit (resident). budget: the
// RAM the state may take. device_resident: the plan holds every layer on the
// device (--resident), the only way the CUDA engine pages the weights.
// The step with the tier's traffic (t.ssd_s). The SSD reads a unit's state
// ahead of its update and writes it behind, so it works only while the
// update runs. fold: the update runs in the backward, a unit as its
// gradient lands; the forward (its share of the compute: model FLOPs / 3 of
// the hardware FLOPs) has none, so the step is max(step, forward + SSD).
// Weights paged but not held on the device (planned only) are read ahead of
// the forward and the backward too: max(step, SSD).
// Else the update is a pass after the backward (sp.optimizer_s), the SSD
// under it: step + max(0, SSD - that pass). Measured: fold, Qwen2.5-14B,
// 24 GiB, H100 (bench/RESULTS.md); the other case is modelled only.
double tier_step_s(const RunTierPlan& t, const StepPrediction& sp, bool fold);
double step_forward_s(const StepPrediction& sp);  // the forward's share of sp.compute_s

RunTierPlan plan_run_tier(const ModelSpec& spec, MasterStorage master, int shadows, MomentStorage moments,
                          UpdateRule rule, const std::vector<uint64_t>& grad_bytes, uint64_t budget, double ssd_gbs,
                          bool device_resident = false);

}  // namespace rt
