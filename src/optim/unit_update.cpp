#include "optim/unit_update.h"

#include <algorithm>

#include "core/error.h"
#include "optim/adamw_lean.h"
#include "optim/muon_unit.h"

namespace rt {

void update_unit(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow,
                 const uint16_t* shadow_prev) {
  update_unit_range(u, 0, u.numel, grad, o, clip_coef, bf16_shadow, shadow_prev);
}

void update_unit_range(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* bf16_shadow, const uint16_t* shadow_prev) {
  RT_CHECK(0 <= b && b <= e && e <= u.numel, "[optim] range [", b, ", ", e, ") outside unit ", u.name, " of ", u.numel,
           " elements");
  if (u.muon) {
    RT_CHECK(b == 0 && e == u.numel && !shadow_prev, "[optim] unit ", u.name,
             ": Muon orthogonalises whole matrices, so it updates whole units in place; this caller updates "
             "ranges or from a previous shadow (chunked or delayed updates), which --optimizer muon does not support");
    return muon_unit_update(u, grad, o, clip_coef, bf16_shadow);
  }
  if (u.quantized())
    RT_CHECK(b % kQuantBlock == 0 && (e % kQuantBlock == 0 || e == u.numel), "[optim] unit ", u.name, ": range [", b,
             ", ", e, ") cuts a quantization block of the ", moment_storage_name(u.moments), " moments; ranges must ",
             "start and end at multiples of ", kQuantBlock, " elements (or at the unit's end)");
  const bool lean = u.quantized() || master_is_bf16(u.master_kind);
  if (u.shadow_master()) {
    if (!bf16_shadow && !shadow_prev && !u.split()) bf16_shadow = u.shadow(u.cur_shadow);  // bf16: in place
    int dst = -1;
    for (int k = 0; k < u.n_shadows; ++k)
      if (bf16_shadow == u.shadow(k)) dst = k;
    RT_CHECK(dst >= 0, "[optim] unit ", u.name, " holds a ", master_storage_name(u.master_kind),
             " master: the shadow written must be one of its own");
    RT_CHECK(!shadow_prev || (u.n_shadows == 2 && shadow_prev == u.shadow(1 - dst)), "[optim] unit ", u.name,
             ": the previous shadow must be the unit's other one");
    RT_CHECK(shadow_prev || dst == u.cur_shadow, "[optim] unit ", u.name,
             ": an in-place update must write the current shadow");
    if (lean) {
      adamw_lean_update(u, b, e, grad, o, clip_coef, bf16_shadow, shadow_prev ? shadow_prev : bf16_shadow);
    } else {
      const SplitMaster p = u.split_master(dst);
      for (size_t k = 0; k < u.entries.size(); ++k) {
        const int64_t lo = std::max(b, u.offsets[k]), hi = std::min(e, u.offsets[k] + u.entries[k].numel());
        if (lo >= hi) continue;
        adamw_update_split(p.at(lo), u.m() + lo, u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
                           weight_decay_for(u.entries[k], o), clip_coef, shadow_prev ? shadow_prev + lo : nullptr);
      }
    }
    if (e == u.numel) u.cur_shadow = dst;
    return;
  }
  RT_CHECK(!shadow_prev, "[optim] unit ", u.name, " holds an fp32 master: no previous shadow to read");
  if (lean) return adamw_lean_update(u, b, e, grad, o, clip_coef, bf16_shadow, nullptr);
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const int64_t lo = std::max(b, u.offsets[k]), hi = std::min(e, u.offsets[k] + u.entries[k].numel());
    if (lo >= hi) continue;
    adamw_update(u.master() + lo, u.m() + lo, u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
                 weight_decay_for(u.entries[k], o), clip_coef, bf16_shadow ? bf16_shadow + lo : nullptr);
  }
}

}  // namespace rt
