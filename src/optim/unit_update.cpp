#include "optim/unit_update.h"

#include <algorithm>

#include "core/error.h"

namespace rt {

void update_unit(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow,
                 const uint16_t* shadow_prev) {
  update_unit_range(u, 0, u.numel, grad, o, clip_coef, bf16_shadow, shadow_prev);
}

void update_unit_range(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* bf16_shadow, const uint16_t* shadow_prev) {
  RT_CHECK(0 <= b && b <= e && e <= u.numel, "[optim] range [", b, ", ", e, ") outside unit ", u.name, " of ", u.numel,
           " elements");
  if (u.split()) {
    int dst = -1;
    for (int k = 0; k < u.n_shadows; ++k)
      if (bf16_shadow == u.shadow(k)) dst = k;
    RT_CHECK(dst >= 0, "[optim] unit ", u.name, " holds a split master: the shadow written must be one of its own");
    RT_CHECK(!shadow_prev || (u.n_shadows == 2 && shadow_prev == u.shadow(1 - dst)), "[optim] unit ", u.name,
             ": the previous shadow must be the unit's other one");
    RT_CHECK(shadow_prev || dst == u.cur_shadow, "[optim] unit ", u.name,
             ": an in-place update must write the current shadow");
    const SplitMaster p = u.split_master(dst);
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t lo = std::max(b, u.offsets[k]), hi = std::min(e, u.offsets[k] + u.entries[k].numel());
      if (lo >= hi) continue;
      adamw_update_split(p.at(lo), u.m() + lo, u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
                         weight_decay_for(u.entries[k], o), clip_coef, shadow_prev ? shadow_prev + lo : nullptr);
    }
    if (e == u.numel) u.cur_shadow = dst;
    return;
  }
  RT_CHECK(!shadow_prev, "[optim] unit ", u.name, " holds an fp32 master: no previous shadow to read");
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const int64_t lo = std::max(b, u.offsets[k]), hi = std::min(e, u.offsets[k] + u.entries[k].numel());
    if (lo >= hi) continue;
    adamw_update(u.master() + lo, u.m() + lo, u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
                 weight_decay_for(u.entries[k], o), clip_coef, bf16_shadow ? bf16_shadow + lo : nullptr);
  }
}

}  // namespace rt
