#include "engine/fold_clip.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "optim/adamw.h"

namespace rt {

std::vector<size_t> fold_order(int64_t n_layers) {
  std::vector<size_t> order{static_cast<size_t>(n_layers + 1)};
  for (int64_t i = n_layers; i >= 1; --i) order.push_back(static_cast<size_t>(i));
  order.push_back(0);
  return order;
}

FoldDefer fold_defer_plan(const std::vector<int64_t>& numel, double fraction, uint64_t max_bytes) {
  RT_CHECK(fraction >= 0 && fraction < 1, "[engine] the deferred fold share must be in [0, 1), got ", fraction);
  double total = 0;
  for (int64_t n : numel) total += static_cast<double>(n);
  const double limit = std::min(fraction * total, static_cast<double>(max_bytes / 4));
  FoldDefer d;
  for (size_t k = 0; k + 1 < numel.size(); ++k) {
    const int64_t end = (d.elems + numel[k] + 15) / 16 * 16;
    if (static_cast<double>(end) > limit) break;
    d.at.push_back(d.elems);
    d.elems = end;
  }
  return d;
}

double fold_defer_share() {
  const char* v = std::getenv("RAMTRAIN_FOLD_DEFER");
  if (!v || !*v) return kFoldDeferShare;
  char* end = nullptr;
  const double f = std::strtod(v, &end);
  RT_CHECK(*end == '\0' && f >= 0 && f < 1, "RAMTRAIN_FOLD_DEFER (the share of the parameters whose --grads fold ",
           "update runs under the next forward) must be a number in [0, 1), got '", v, "': unset it for ",
           kFoldDeferShare);
  return f;
}

float FoldClip::next(double sumsq) {
  if (!std::isfinite(sumsq)) {
    finite_ = false;
    return 0.0f;
  }
  sq_ += sumsq;
  return clip_coefficient(std::sqrt(sq_), max_norm_);
}

}  // namespace rt
