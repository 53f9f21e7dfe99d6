// SwiGLU, GeGLU (Gemma) and elementwise add on bf16 with fp32 math, one
// element per thread step (grid-stride). silu(g) = g * sigmoid(g); expf, not
// __expf. gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanhf.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"
#include "cuda/swiglu_math.cuh"

namespace rt::cuda {
namespace {

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(n, 256), 65536)); }

// With FP8 per-tensor amax keys (kAmax: the keys are non-null) each block
// commits the max key of what it wrote once, so those launches use fewer
// blocks (kAmaxBlocks: the grid-stride loop covers the rest; the values are
// the same whatever the grid).
constexpr unsigned kAmaxBlocks = 4096;
unsigned grid_for(int64_t n, bool amax) { return amax ? std::min(grid_for(n), kAmaxBlocks) : grid_for(n); }

template <bool kAmax>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, int64_t n, uint32_t* amax) {
  uint32_t key = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
    const float sig = 1.f / (1.f + expf(-g));
    const bf16 o = __float2bfloat16(g * sig * u);
    out[i] = o;
    if (kAmax) key = max(key, detail::bf16_amax_key(o));
  }
  if (kAmax) detail::block_amax_commit(key, amax);
}

template <bool kAmax>
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                                       int64_t n, uint32_t* amax_dg, uint32_t* amax_du) {
  uint32_t kg = 0, ku = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float fg, fu;
    detail::swiglu_grad(__bfloat162float(dout[i]), __bfloat162float(gate[i]), __bfloat162float(up[i]), &fg, &fu);
    const bf16 dg = __float2bfloat16(fg), du = __float2bfloat16(fu);
    dgate[i] = dg;
    dup[i] = du;
    if (kAmax) kg = max(kg, detail::bf16_amax_key(dg)), ku = max(ku, detail::bf16_amax_key(du));
  }
  if (kAmax) {
    // a null key (only one of the two asked) commits into a block-local dummy
    __shared__ uint32_t unused;
    detail::block_amax_commit(kg, amax_dg ? amax_dg : &unused);
    detail::block_amax_commit(ku, amax_du ? amax_du : &unused);
  }
}

// gpt-oss: g' = min(g, L), u' = clamp(u, -L, L), out = (u' + 1) g' sigmoid(alpha g'); the clamps
// pass the gradient where they leave the value unchanged (cpu/ops.cpp's rule; cuda/swiglu_math.cuh).
__global__ void swiglu_clamped_forward_kernel(bf16* out, const bf16* gate, const bf16* up, int64_t n, float limit,
                                              float alpha) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = fminf(__bfloat162float(gate[i]), limit);
    const float u = fminf(fmaxf(__bfloat162float(up[i]), -limit), limit);
    out[i] = __float2bfloat16((u + 1.f) * (g / (1.f + expf(-(g * alpha)))));
  }
}

__global__ void swiglu_clamped_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                               const bf16* up, int64_t n, float limit, float alpha) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float dg, du;
    detail::swiglu_clamped_grad(__bfloat162float(dout[i]), __bfloat162float(gate[i]), __bfloat162float(up[i]), limit,
                                alpha, &dg, &du);
    dgate[i] = __float2bfloat16(dg);
    dup[i] = __float2bfloat16(du);
  }
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi), as cpu/ops.cpp
constexpr float kGeluA = 0.044715f;

__global__ void geglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    out[i] = __float2bfloat16(0.5f * g * (1.f + t) * u);
  }
}

__global__ void geglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                                      int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]), d = __bfloat162float(dout[i]);
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    const float dgelu = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluA * g * g);
    dgate[i] = __float2bfloat16(d * u * dgelu);
    dup[i] = __float2bfloat16(d * (0.5f * g * (1.f + t)));
  }
}

__global__ void add_inplace_kernel(bf16* y, const bf16* x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

__global__ void scale_kernel(bf16* y, const bf16* x, float alpha, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(alpha * __bfloat162float(x[i]));
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream, uint32_t* amax_key) {
  if (n == 0) return;
  if (amax_key)
    swiglu_forward_kernel<true><<<grid_for(n, true), 256, 0, stream>>>(out, gate, up, n, amax_key);
  else
    swiglu_forward_kernel<false><<<grid_for(n), 256, 0, stream>>>(out, gate, up, n, nullptr);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                     cudaStream_t stream, uint32_t* amax_dgate, uint32_t* amax_dup) {
  if (n == 0) return;
  if (amax_dgate || amax_dup)
    swiglu_backward_kernel<true>
        <<<grid_for(n, true), 256, 0, stream>>>(dgate, dup, dout, gate, up, n, amax_dgate, amax_dup);
  else
    swiglu_backward_kernel<false><<<grid_for(n), 256, 0, stream>>>(dgate, dup, dout, gate, up, n, nullptr, nullptr);
  CUDA_CHECK_LAUNCH();
}

void swiglu_clamped_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, float limit, float alpha,
                            cudaStream_t stream) {
  if (n == 0) return;
  swiglu_clamped_forward_kernel<<<grid_for(n), 256, 0, stream>>>(out, gate, up, n, limit, alpha);
  CUDA_CHECK_LAUNCH();
}

void swiglu_clamped_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                             float limit, float alpha, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_clamped_backward_kernel<<<grid_for(n), 256, 0, stream>>>(dgate, dup, dout, gate, up, n, limit, alpha);
  CUDA_CHECK_LAUNCH();
}

void geglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  geglu_forward_kernel<<<grid_for(n), 256, 0, stream>>>(out, gate, up, n);
  CUDA_CHECK_LAUNCH();
}

void geglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  geglu_backward_kernel<<<grid_for(n), 256, 0, stream>>>(dgate, dup, dout, gate, up, n);
  CUDA_CHECK_LAUNCH();
}

void add_inplace(bf16* y, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_inplace_kernel<<<grid_for(n), 256, 0, stream>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void scale(bf16* y, const bf16* x, float alpha, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), 256, 0, stream>>>(y, x, alpha, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
