// SwiGLU, GeGLU (Gemma) and elementwise add on bf16 with fp32 math, 8
// elements per thread step where the arrays allow (grid-stride; map_kernel).
// silu(g) = g * sigmoid(g); expf, not __expf. gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanhf.
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

// The elementwise kernels below are one per-element function Op over NI bf16
// inputs and NO bf16 outputs (fp32 math, each output rounded once), run by
// map_kernel: 8 elements per 16-byte access where every pointer is 16-byte
// aligned, one at a time for the rest (and for unaligned pointers). Every
// element gets the same arithmetic either way, so the bits do not depend on
// the path. kAmax: each output's FP8 per-tensor amax key (null: not kept).
template <int NI, int NO>
struct MapArgs {
  const bf16* in[NI];
  bf16* out[NO];
  uint32_t* amax[NO];
};

template <int NI, int NO>
bool aligned16(const MapArgs<NI, NO>& a) {
  bool ok = true;
  for (int k = 0; k < NI; ++k) ok = ok && reinterpret_cast<uintptr_t>(a.in[k]) % 16 == 0;
  for (int k = 0; k < NO; ++k) ok = ok && reinterpret_cast<uintptr_t>(a.out[k]) % 16 == 0;
  return ok;
}

template <int NI, int NO, bool kAmax, class Op>
__global__ void map_kernel(MapArgs<NI, NO> a, Op op, int64_t n, int64_t nvec) {
  uint32_t key[NO] = {};
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < nvec; v += stride) {
    float x[NI][8], y[NO][8];
#pragma unroll
    for (int k = 0; k < NI; ++k) detail::bf16x8_to_float(reinterpret_cast<const detail::bf16x8*>(a.in[k])[v], x[k]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float xi[NI], yo[NO];
#pragma unroll
      for (int k = 0; k < NI; ++k) xi[k] = x[k][j];
      op(xi, yo);
#pragma unroll
      for (int k = 0; k < NO; ++k) y[k][j] = yo[k];
    }
#pragma unroll
    for (int k = 0; k < NO; ++k) {
      const detail::bf16x8 r = detail::float_to_bf16x8(y[k]);
      reinterpret_cast<detail::bf16x8*>(a.out[k])[v] = r;
      if (kAmax) key[k] = max(key[k], detail::bf16x8_amax_key(r));
    }
  }
  for (int64_t i = nvec * 8 + first; i < n; i += stride) {
    float xi[NI], yo[NO];
#pragma unroll
    for (int k = 0; k < NI; ++k) xi[k] = __bfloat162float(a.in[k][i]);
    op(xi, yo);
#pragma unroll
    for (int k = 0; k < NO; ++k) {
      const bf16 r = __float2bfloat16(yo[k]);
      a.out[k][i] = r;
      if (kAmax) key[k] = max(key[k], detail::bf16_amax_key(r));
    }
  }
  if (kAmax) {
    __shared__ uint32_t unused;  // an output whose key was not asked commits into a block-local dummy
#pragma unroll
    for (int k = 0; k < NO; ++k) detail::block_amax_commit(key[k], a.amax[k] ? a.amax[k] : &unused);
  }
}

// Runs op over n elements of a's arrays on stream (n > 0).
template <int NI, int NO, class Op>
void map(const MapArgs<NI, NO>& a, const Op& op, int64_t n, cudaStream_t stream) {
  bool amax = false;
  for (int k = 0; k < NO; ++k) amax = amax || a.amax[k];
  const int64_t nvec = aligned16(a) ? n / 8 : 0;
  const int64_t threads = nvec + (n - nvec * 8);  // enough for either loop in one pass
  const unsigned grid = grid_for(threads, amax);
  if (amax)
    map_kernel<NI, NO, true><<<grid, 256, 0, stream>>>(a, op, n, nvec);
  else
    map_kernel<NI, NO, false><<<grid, 256, 0, stream>>>(a, op, n, nvec);
  CUDA_CHECK_LAUNCH();
}

// x = {gate, up}: y = {silu(gate) up}
struct SwigluForward {
  __device__ void operator()(const float* x, float* y) const { y[0] = detail::swiglu_value(x[0], x[1]); }
};
// x = {dout, gate, up}: y = {dgate, dup}
struct SwigluBackward {
  __device__ void operator()(const float* x, float* y) const { detail::swiglu_grad(x[0], x[1], x[2], &y[0], &y[1]); }
};
// gpt-oss: g' = min(g, L), u' = clamp(u, -L, L), out = (u' + 1) g' sigmoid(alpha g'); the clamps
// pass the gradient where they leave the value unchanged (cpu/ops.cpp's rule; cuda/swiglu_math.cuh).
struct SwigluClampedForward {
  float limit, alpha;
  __device__ void operator()(const float* x, float* y) const {
    y[0] = detail::swiglu_clamped_value(x[0], x[1], limit, alpha);
  }
};
struct SwigluClampedBackward {
  float limit, alpha;
  __device__ void operator()(const float* x, float* y) const {
    detail::swiglu_clamped_grad(x[0], x[1], x[2], limit, alpha, &y[0], &y[1]);
  }
};

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi), as cpu/ops.cpp
constexpr float kGeluA = 0.044715f;

struct GegluForward {
  __device__ void operator()(const float* x, float* y) const {
    const float g = x[0], u = x[1];
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    y[0] = 0.5f * g * (1.f + t) * u;
  }
};
struct GegluBackward {
  __device__ void operator()(const float* x, float* y) const {
    const float d = x[0], g = x[1], u = x[2];
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    const float dgelu = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluA * g * g);
    y[0] = d * u * dgelu;
    y[1] = d * (0.5f * g * (1.f + t));
  }
};
struct Add {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + x[1]; }
};
struct Scale {
  float alpha;
  __device__ void operator()(const float* x, float* y) const { y[0] = alpha * x[0]; }
};

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream, uint32_t* amax_key) {
  if (n == 0) return;
  map(MapArgs<2, 1>{{gate, up}, {out}, {amax_key}}, SwigluForward{}, n, stream);
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                     cudaStream_t stream, uint32_t* amax_dgate, uint32_t* amax_dup) {
  if (n == 0) return;
  map(MapArgs<3, 2>{{dout, gate, up}, {dgate, dup}, {amax_dgate, amax_dup}}, SwigluBackward{}, n, stream);
}

void swiglu_clamped_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, float limit, float alpha,
                            cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<2, 1>{{gate, up}, {out}, {nullptr}}, SwigluClampedForward{limit, alpha}, n, stream);
}

void swiglu_clamped_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                             float limit, float alpha, cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<3, 2>{{dout, gate, up}, {dgate, dup}, {nullptr, nullptr}}, SwigluClampedBackward{limit, alpha}, n,
      stream);
}

void geglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<2, 1>{{gate, up}, {out}, {nullptr}}, GegluForward{}, n, stream);
}

void geglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<3, 2>{{dout, gate, up}, {dgate, dup}, {nullptr, nullptr}}, GegluBackward{}, n, stream);
}

void add_inplace(bf16* y, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<2, 1>{{y, x}, {y}, {nullptr}}, Add{}, n, stream);
}

void scale(bf16* y, const bf16* x, float alpha, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  map(MapArgs<1, 1>{{x}, {y}, {nullptr}}, Scale{alpha}, n, stream);
}

}  // namespace rt::cuda
