// gpt-oss's MoE biases as the layer template hands them to the ops'
// moe_forward / moe_backward (model/block.h): the router's [E] and each
// expert's gate, up [Fe] and down [C] biases, E pointers each; null where a
// model has none (every other MoE family).
#pragma once
#include <vector>

namespace rt {

template <class W>
struct MoeBiasesT {
  const W* router = nullptr;
  const W* const* gate = nullptr;
  const W* const* up = nullptr;
  const W* const* down = nullptr;
  bool any() const { return router || gate || up || down; }
};

// Their fp32 gradients (+=).
struct MoeBiasGrads {
  float* router = nullptr;
  float* const* gate = nullptr;
  float* const* up = nullptr;
  float* const* down = nullptr;
};

// v.data(), or null for an empty list.
template <class P>
P* const* ptrs_or_null(const std::vector<P*>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace rt
