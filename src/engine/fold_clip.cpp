#include "engine/fold_clip.h"

#include <cmath>

#include "optim/adamw.h"

namespace rt {

std::vector<size_t> fold_order(int64_t n_layers) {
  std::vector<size_t> order{static_cast<size_t>(n_layers + 1)};
  for (int64_t i = n_layers; i >= 1; --i) order.push_back(static_cast<size_t>(i));
  order.push_back(0);
  return order;
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
