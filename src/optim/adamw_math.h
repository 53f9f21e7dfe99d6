// The AdamW element maths shared by optim/adamw.cpp (the fp32 and split-master
// kernels) and optim/adamw_lean.cpp (quantized moments, bf16 masters): the
// per-call constants and the scalar specification of one element (the contract
// in optim/adamw.h). Include it only from a file that turns implicit FP
// contraction off before any include (as both do): the maths relies on every
// op being rounded once, FMAs only where written.
#pragma once
#include <cmath>
#include <cstdint>

#include "optim/adamw.h"

namespace rt {

// Per-call fp32 constants, derived in double exactly as torch does.
struct AdamWConsts {
  float grad_scale;
  float decay;       // 1 - lr*wd (1 when wd == 0: multiplying by 1 is exact)
  bool lerp_small;   // |1 - b1| < 0.5: torch's lerp uses m + w*(g - m)
  float lerp_coeff;  // w = 1 - b1, or w - 1 (fp32) for the other branch
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;
  float eps;
  float neg_step_size;  // -lr / (1 - b1^t)
};

inline AdamWConsts adamw_consts(const AdamWHyper& h, int64_t t, double lr, double wd, float grad_scale) {
  AdamWConsts c;
  c.grad_scale = grad_scale;
  c.decay = wd != 0 ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  float w = static_cast<float>(1.0 - h.beta1);
  c.lerp_small = std::fabs(w) < 0.5f;
  c.lerp_coeff = c.lerp_small ? w : w - 1.0f;
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  double step = static_cast<double>(t);
  double bc1 = 1.0 - std::pow(h.beta1, step);
  double bc2 = 1.0 - std::pow(h.beta2, step);
  c.bc2_sqrt = static_cast<float>(std::pow(bc2, 0.5));  // Python's bc2 ** 0.5
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  return c;
}

// The specification: one element, every op rounded to fp32 once. Returns the
// new p; m and v are updated in place. Every path (fp32 or split master) uses it.
inline float adamw_math(float p, float& m, float& v, float g, const AdamWConsts& c) {
  float gs = g * c.grad_scale;
  float pp = p * c.decay;
  float mm = m;
  float d = gs - mm;
  mm = std::fma(c.lerp_coeff, d, c.lerp_small ? mm : gs);
  float vv = std::fma(c.one_minus_beta2 * gs, gs, v * c.beta2);
  float denom = std::sqrt(vv) / c.bc2_sqrt + c.eps;
  pp = pp + (c.neg_step_size * mm) / denom;
  m = mm;
  v = vv;
  return pp;
}

// p, m, v updated in place over n elements with constants c, on the active
// SIMD path (no streaming stores, single-threaded: for small spans such as a
// quantization block). Bit-identical to adamw_update's element maths.
// bf16_out[n]: when given, also f32_to_bf16 of the new p (as adamw_update).
void adamw_span(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConsts& c,
                uint16_t* bf16_out = nullptr);

}  // namespace rt
