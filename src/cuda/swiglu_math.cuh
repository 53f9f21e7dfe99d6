// SwiGLU and its gradients for one element, fp32 math (cpu/ops.cpp's formulas):
// shared by cuda/swiglu.cu's kernels and the MoE backward's fused kernel
// (cuda/moe.cu), so both give the same bits for the same inputs.
#pragma once

namespace rt::cuda::detail {

// out = silu(g) u, before its rounding to bf16.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float sig = 1.f / (1.f + expf(-g));
  return g * sig * u;
}

// gpt-oss: out = (u' + 1) g' sigmoid(alpha g'), g' = min(g, L), u' = clamp(u, -L, L).
__device__ __forceinline__ float swiglu_clamped_value(float g0, float u0, float limit, float alpha) {
  const float g = fminf(g0, limit), u = fminf(fmaxf(u0, -limit), limit);
  return (u + 1.f) * (g / (1.f + expf(-(g * alpha))));
}

// out = silu(g) u: dg = d u sigmoid(g) (1 + g (1 - sigmoid(g))), du = d silu(g).
__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float* dg, float* du) {
  const float sig = 1.f / (1.f + expf(-g));
  const float silu = g * sig;
  *dg = d * u * sig * (1.f + g * (1.f - sig));
  *du = d * silu;
}

// gpt-oss: g' = min(g, L), u' = clamp(u, -L, L), out = (u' + 1) g' sigmoid(alpha g');
// the clamps pass the gradient where they leave the value unchanged.
__device__ __forceinline__ void swiglu_clamped_grad(float d, float g0, float u0, float limit, float alpha, float* dg,
                                                    float* du) {
  const float g = fminf(g0, limit), u = fminf(fmaxf(u0, -limit), limit);
  const float s = 1.f / (1.f + expf(-(g * alpha)));
  *dg = g0 <= limit ? d * (u + 1.f) * (s + alpha * g * s * (1.f - s)) : 0.f;
  *du = u0 >= -limit && u0 <= limit ? d * g * s : 0.f;
}

}  // namespace rt::cuda::detail
