#include "engine/tier_plan.h"

#include "core/error.h"

namespace rt {

RunTierPlan plan_run_tier(const ModelSpec& spec, MasterStorage master, int shadows, MomentStorage moments,
                          UpdateRule rule, const std::vector<uint64_t>& grad_bytes, uint64_t budget, double ssd_gbs) {
  std::vector<TierUnitBytes> units = tier_unit_bytes_planned(spec, master, shadows, false, moments, rule);
  RT_CHECK(grad_bytes.size() == units.size(), "[plan] internal: ", grad_bytes.size(), " gradient sizes for ",
           units.size(), " units");
  std::vector<uint64_t> weights(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (master == MasterStorage::fp32) {  // the fp32 master (4 B of the resident) is the optimizer's only
      const uint64_t fp32 = 4 * (units[u].resident / (4 + 2 * static_cast<uint64_t>(shadows)));  // n (4 + 2 shadows)
      units[u].resident -= fp32;
      units[u].paged += direct_round(fp32);
    }
    weights[u] = units[u].resident;  // the bf16 shadows
    units[u].resident += grad_bytes[u];
  }
  RunTierPlan r;
  r.place = tier_place(units, budget);
  if (!r.place.fits) {  // the weights page too: RAM keeps the gradients and the units in flight
    for (size_t u = 0; u < units.size(); ++u) {
      units[u].resident -= weights[u];
      units[u].paged += direct_round(weights[u]);
    }
    r.weights_paged = true;
    r.place = tier_place(units, budget);
  }
  r.fits = r.place.fits;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!r.place.paged[u]) continue;
    const uint64_t w = r.weights_paged ? direct_round(weights[u]) : 0;
    r.weights_file += w;
    r.state_file += units[u].paged - w;
  }
  r.read_bytes = r.state_file + 3 * r.weights_file;
  r.write_bytes = r.state_file + r.weights_file;
  r.ssd_s = ssd_gbs > 0 ? static_cast<double>(r.read_bytes + r.write_bytes) / (ssd_gbs * 1e9) : 0;
  return r;
}

}  // namespace rt
