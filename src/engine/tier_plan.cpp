#include "engine/tier_plan.h"

#include <algorithm>

#include "core/error.h"

namespace rt {

RunTierPlan plan_run_tier(const ModelSpec& spec, MasterStorage master, int shadows, MomentStorage moments,
                          UpdateRule rule, const std::vector<uint64_t>& grad_bytes, uint64_t budget, double ssd_gbs,
                          bool device_resident) {
  std::vector<TierUnitBytes> units = tier_unit_bytes_planned(spec, master, shadows, false, moments, rule);
  RT_CHECK(grad_bytes.size() == units.size(), "[plan] internal: ", grad_bytes.size(), " gradient sizes for ",
           units.size(), " units");
  for (size_t u = 0; u < units.size(); ++u) {
    if (master == MasterStorage::fp32) {  // the fp32 master (4 B of the resident) is the optimizer's only
      const uint64_t fp32 = 4 * (units[u].resident / (4 + 2 * static_cast<uint64_t>(shadows)));  // n (4 + 2 shadows)
      units[u].resident -= fp32;
      units[u].paged += direct_round(fp32);
      units[u].weights = units[u].resident;  // the engine's bf16 shadows (n uint16 each)
      units[u].weights_paged = static_cast<uint64_t>(shadows) * direct_round(fp32 / 2);
    }
    units[u].resident += grad_bytes[u];
  }
  RunTierPlan r;
  // the optimizer state first; when RAM cannot hold the shadows and gradients beside three units in flight,
  // the weights page too (tier_place, as the engine places them)
  r.place = tier_place(units, budget, true);
  r.weights_paged = r.place.weights_paged;
  r.fits = r.place.fits;
  r.weights_file = r.place.weight_file_bytes;
  r.state_file = r.place.file_bytes - r.weights_file;
  // device-resident weights (the engine's: every layer in its own slot) cross PCIe once a step, after their
  // update; read once and written once like the state. Read ahead of the forward and backward (a card too
  // small to hold them: planned, not built), three times.
  const uint64_t weight_reads = device_resident ? 1 : 3;
  r.device_resident = device_resident;
  r.read_bytes = r.state_file + weight_reads * r.weights_file;
  r.write_bytes = r.state_file + r.weights_file;
  r.ssd_s = ssd_gbs > 0 ? static_cast<double>(r.read_bytes + r.write_bytes) / (ssd_gbs * 1e9) : 0;
  return r;
}

double step_forward_s(const StepPrediction& sp) {
  return sp.hardware_flops_per_token > 0 ? sp.compute_s * sp.model_flops_per_token / 3 / sp.hardware_flops_per_token
                                         : sp.compute_s / 3;
}

double tier_step_s(const RunTierPlan& t, const StepPrediction& sp, bool fold) {
  if (t.ssd_s <= 0) return sp.step_s;
  // weights paged and read ahead of the forward and the backward too (planned, not built): I/O all step long
  if (t.weights_paged && !t.device_resident) return std::max(sp.step_s, t.ssd_s);
  if (!fold) return sp.step_s + std::max(0.0, t.ssd_s - sp.optimizer_s);
  return std::max(sp.step_s, step_forward_s(sp) + t.ssd_s);
}

}  // namespace rt
