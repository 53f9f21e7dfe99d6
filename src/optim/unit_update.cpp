#include "optim/unit_update.h"

#include <algorithm>

#include "core/error.h"

namespace rt {

void update_unit(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow) {
  update_unit_range(u, 0, u.numel, grad, o, clip_coef, bf16_shadow);
}

void update_unit_range(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* bf16_shadow) {
  RT_CHECK(0 <= b && b <= e && e <= u.numel, "[optim] range [", b, ", ", e, ") outside unit ", u.name, " of ", u.numel,
           " elements");
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const int64_t lo = std::max(b, u.offsets[k]), hi = std::min(e, u.offsets[k] + u.entries[k].numel());
    if (lo >= hi) continue;
    adamw_update(u.master() + lo, u.m() + lo, u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
                 weight_decay_for(u.entries[k], o), clip_coef, bf16_shadow ? bf16_shadow + lo : nullptr);
  }
}

}  // namespace rt
