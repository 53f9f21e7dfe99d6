// FP8 quantizers (declared in cuda/fp8.h; cpu/fp8.h is the specification
// they match bit for bit): 1x128 rows (and transposed), 128x128 weight
// blocks with their transposed copy, and the per-tensor amax and codes.
// Encoding is CUDA's own __nv_cvt_float_to_fp8(satfinite, e4m3) on x * 2^-k
// (exact); the scale is core/fp8.h's fp8_block_scale (of a block's or the
// whole tensor's amax); a block or tensor with Inf/NaN is all NaN codes
// (0x7F). Each block quantizer zeroes its scale array first (the layouts'
// padding is 0). The GEMM and the linear layer are fp8.cu's.
#include <cuda_fp8.h>

#include "core/fp8.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/kernel_util.cuh"

namespace rt::cuda {

namespace {

__device__ __forceinline__ uint8_t fp8_encode_dev(float v, float inv, bool nonfinite) {
  if (nonfinite) return kFp8E4m3NaN;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ bool nonfinite_abs(float a) { return !(a <= 3.4028235e38f); }

// x[R, K] row-major -> q[R, K], 1x128 scales [KB][Rp]. One warp per (row,
// tile); lane l holds the 4 elements k0 + 4l .. k0 + 4l + 3. K % 4 == 0.
__global__ void quantize_1x128_rows_kernel(uint8_t* q, float* scale, const bf16* x, int64_t R, int64_t K, int64_t Rp) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + (threadIdx.x >> 5);
  const int64_t kb = blockIdx.x, k = kb * 128 + lane * 4;
  if (r >= R) return;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  const bool in = k < K;
  if (in) {
    const uint2 raw = *reinterpret_cast<const uint2*>(x + r * K + k);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  }
  float amax = 0.f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = fabsf(v[i]);
    if (nonfinite_abs(a))
      bad = true;
    else
      amax = fmaxf(amax, a);
  }
  amax = detail::warp_max(amax);
  bad = __any_sync(0xffffffffu, bad);
  const Fp8Scale s = fp8_block_scale(amax, bad);
  if (lane == 0) scale[kb * Rp + r] = s.scale;
  if (in) {
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(fp8_encode_dev(v[i], s.inv, bad)) << (8 * i);
    *reinterpret_cast<uint32_t*>(q + r * K + k) = packed;
  }
}

// x[K, R] row-major read as its transpose: q[R, K] along K, scales [KB][Rp]
// (the weight gradients' operands: a block is 128 tokens of one feature). A
// 256-thread block covers 128 k x 64 r: it loads the tile through shared
// memory in 16-byte vectors along r (scalar where R % 8 != 0), then four
// threads per r each take 32 consecutive k (amax over the four by shuffles)
// and store their 32 codes as two 16-byte vectors along k (scalar at tails).
constexpr int kColsR = 64;
__global__ void __launch_bounds__(256)
    quantize_1x128_cols_kernel(uint8_t* q, float* scale, const bf16* x, int64_t R, int64_t K, int64_t Rp) {
  __shared__ __align__(16) bf16 tile[128][kColsR + 8];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kColsR, kb = blockIdx.y, k0 = kb * 128;
  const bool vec_in = R % 8 == 0;
  for (int v = threadIdx.x; v < 128 * (kColsR / 8); v += blockDim.x) {
    const int kk = v / (kColsR / 8), rr = (v % (kColsR / 8)) * 8;
    const int64_t k = k0 + kk, r = r0 + rr;
    if (vec_in && k < K && r < R) {
      *reinterpret_cast<uint4*>(&tile[kk][rr]) = *reinterpret_cast<const uint4*>(x + k * R + r);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) tile[kk][rr + j] = (k < K && r + j < R) ? x[k * R + r + j] : __float2bfloat16(0.f);
    }
  }
  __syncthreads();
  const int rr = threadIdx.x >> 2, part = threadIdx.x & 3;  // 4 consecutive lanes share an r
  const int64_t r = r0 + rr;
  float v[32];
  float amax = 0.f;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] = __bfloat162float(tile[part * 32 + j][rr]);
    const float a = fabsf(v[j]);
    if (nonfinite_abs(a))
      bad = true;
    else
      amax = fmaxf(amax, a);
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  int b = bad ? 1 : 0;
  b |= __shfl_xor_sync(0xffffffffu, b, 1);
  b |= __shfl_xor_sync(0xffffffffu, b, 2);
  if (r >= R) return;
  const Fp8Scale sc = fp8_block_scale(amax, b != 0);
  if (part == 0) scale[kb * Rp + r] = sc.scale;
  const int64_t kp = k0 + part * 32;
  uint8_t* out = q + r * K + kp;
  if (K % 16 == 0 && kp + 32 <= K) {
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[i] |= static_cast<uint32_t>(fp8_encode_dev(v[4 * i + j], sc.inv, b != 0)) << (8 * j);
    }
    reinterpret_cast<uint4*>(out)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(out)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j)
      if (kp + j < K) out[j] = fp8_encode_dev(v[j], sc.inv, b != 0);
  }
}

// w[R, K] -> q[R, K], scale [RB][KBp]; qt[K, R], scale_t [KB][RBp] (qt may be
// null). One 256-thread block per 128x128 block.
__global__ void quantize_128x128_kernel(uint8_t* q, float* scale, uint8_t* qt, float* scale_t, const bf16* w, int64_t R,
                                        int64_t K, int64_t KBp, int64_t RBp) {
  __shared__ uint8_t codes[128][132];
  __shared__ float red[32];
  const int64_t kb = blockIdx.x, rb = blockIdx.y, r0 = rb * 128, k0 = kb * 128;
  float amax = 0.f;
  int bad = 0;
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int rr = i / 128, kk = i % 128;
    const int64_t r = r0 + rr, k = k0 + kk;
    if (r < R && k < K) {
      const float a = fabsf(__bfloat162float(w[r * K + k]));
      if (nonfinite_abs(a))
        bad = 1;
      else
        amax = fmaxf(amax, a);
    }
  }
  amax = detail::warp_max(amax);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) red[warp] = amax;
  bad = __syncthreads_or(bad);
  float m = lane < nwarps ? red[lane] : 0.f;
  m = detail::warp_max(m);
  const Fp8Scale s = fp8_block_scale(m, bad != 0);
  if (threadIdx.x == 0) {
    scale[rb * KBp + kb] = s.scale;
    if (scale_t) scale_t[kb * RBp + rb] = s.scale;
  }
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int rr = i / 128, kk = i % 128;
    const int64_t r = r0 + rr, k = k0 + kk;
    if (r < R && k < K) {
      const uint8_t c = fp8_encode_dev(__bfloat162float(w[r * K + k]), s.inv, bad != 0);
      q[r * K + k] = c;
      codes[rr][kk] = c;
    }
  }
  if (!qt) return;
  __syncthreads();
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int kk = i / 128, rr = i % 128;
    const int64_t r = r0 + rr, k = k0 + kk;
    if (r < R && k < K) qt[k * R + r] = codes[rr][kk];
  }
}

}  // namespace

void fp8_quantize_1x128(uint8_t* q, float* scale, const bf16* x, int64_t R, int64_t K, bool transposed,
                        cudaStream_t stream) {
  RT_CHECK(R > 0 && K > 0 && K % 4 == 0, "[cuda fp8_quantize_1x128] bad shape ", R, " x ", K,
           " (both > 0, K a multiple of 4)");
  const int64_t Rp = fp8_round4(R), KB = fp8_blocks(K);
  CUDA_CHECK(cudaMemsetAsync(scale, 0, static_cast<size_t>(KB * Rp) * sizeof(float), stream));
  if (!transposed) {
    const dim3 grid(static_cast<unsigned>(KB), static_cast<unsigned>(detail::ceil_div(R, 8)));
    quantize_1x128_rows_kernel<<<grid, 256, 0, stream>>>(q, scale, x, R, K, Rp);
  } else {
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(R, kColsR)), static_cast<unsigned>(KB));
    quantize_1x128_cols_kernel<<<grid, 256, 0, stream>>>(q, scale, x, R, K, Rp);
  }
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_128x128(uint8_t* q, float* scale, uint8_t* qt, float* scale_t, const bf16* w, int64_t R, int64_t K,
                          cudaStream_t stream) {
  RT_CHECK(R > 0 && K > 0, "[cuda fp8_quantize_128x128] bad shape ", R, " x ", K);
  const int64_t RB = fp8_blocks(R), KB = fp8_blocks(K);
  CUDA_CHECK(cudaMemsetAsync(scale, 0, static_cast<size_t>(fp8_scales_128x128(R, K)) * sizeof(float), stream));
  if (scale_t)
    CUDA_CHECK(cudaMemsetAsync(scale_t, 0, static_cast<size_t>(fp8_scales_128x128(K, R)) * sizeof(float), stream));
  const dim3 grid(static_cast<unsigned>(KB), static_cast<unsigned>(RB));
  quantize_128x128_kernel<<<grid, 256, 0, stream>>>(q, scale, qt, scale_t, w, R, K, fp8_round4(KB), fp8_round4(RB));
  CUDA_CHECK_LAUNCH();
}

// ---- per-tensor scaling ----

namespace {

// The slot: [0] the scale (fp32), [1] the amax as the bits of |x| (an
// unsigned max over non-negative floats' bits is the float max; Inf's bits
// are 0x7F800000 and NaN's larger, so key >= 0x7F800000 means non-finite).
// The producers' fused amaxes (Fp8Linear's taps) make the same keys from the
// bf16 bits (cuda/fp8_amax.cuh).
constexpr uint32_t kNonfiniteKey = 0x7F800000u;
__device__ __forceinline__ uint32_t amax_key(float v) { return __float_as_uint(fabsf(v)); }

// x[n] -> *key (zeroed before): 8 bf16 per 16-byte load when vec.
__global__ void __launch_bounds__(256) tensor_amax_kernel(uint32_t* key_out, const bf16* x, int64_t n, bool vec) {
  uint32_t key = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t i = t; i < n / 8; i += stride) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[i];
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
        key = max(key, max(amax_key(f.x), amax_key(f.y)));
      }
    }
  } else {
    for (int64_t i = t; i < n; i += stride) key = max(key, amax_key(__bfloat162float(x[i])));
  }
  detail::block_amax_commit(key, key_out);
}

__device__ __forceinline__ Fp8Scale tensor_scale(const uint32_t* key_in, bool* bad) {
  const uint32_t key = *key_in;
  *bad = key >= kNonfiniteKey;
  return fp8_block_scale(*bad ? 0.f : __uint_as_float(key), *bad);
}

// x[R, C] -> q[R, C] (q may be null) and qt[C, R] (qt may be null), one scale
// from the slot's amax; block (0, 0) writes the scale. A 256-thread block
// covers 64 rows x 64 columns: it loads 8 bf16 per thread-step (C % 8 == 0),
// writes their 8 codes to q, keeps them in shared memory and, when qt is
// asked, writes the transposed tile 4 codes (along R; R % 4 == 0) at a time.
constexpr int kTensorTile = 64;
__global__ void __launch_bounds__(256)
    tensor_codes_kernel(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C) {
  __shared__ __align__(16) uint8_t codes[kTensorTile][kTensorTile + 8];
  bool bad;
  const Fp8Scale s = tensor_scale(reinterpret_cast<const uint32_t*>(slot) + 1, &bad);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) slot[0] = s.scale;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTensorTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTensorTile;
  for (int v = threadIdx.x; v < kTensorTile * (kTensorTile / 8); v += blockDim.x) {
    const int rr = v / (kTensorTile / 8), cc = (v % (kTensorTile / 8)) * 8;
    const int64_t r = r0 + rr, c = c0 + cc;
    if (r >= R || c >= C) continue;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + r * C + c);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      const uint32_t pair = static_cast<uint32_t>(fp8_encode_dev(f.x, s.inv, bad)) |
                            (static_cast<uint32_t>(fp8_encode_dev(f.y, s.inv, bad)) << 8);
      packed[j / 2] |= pair << (16 * (j % 2));
    }
    const uint2 p2 = make_uint2(packed[0], packed[1]);
    if (q) *reinterpret_cast<uint2*>(q + r * C + c) = p2;
    if (qt) *reinterpret_cast<uint2*>(&codes[rr][cc]) = p2;
  }
  if (!qt) return;
  __syncthreads();
  for (int v = threadIdx.x; v < kTensorTile * (kTensorTile / 4); v += blockDim.x) {
    const int cc = v / (kTensorTile / 4), rr = (v % (kTensorTile / 4)) * 4;
    const int64_t r = r0 + rr, c = c0 + cc;
    if (r >= R || c >= C) continue;
    const uint32_t word = static_cast<uint32_t>(codes[rr][cc]) | (static_cast<uint32_t>(codes[rr + 1][cc]) << 8) |
                          (static_cast<uint32_t>(codes[rr + 2][cc]) << 16) |
                          (static_cast<uint32_t>(codes[rr + 3][cc]) << 24);
    *reinterpret_cast<uint32_t*>(qt + c * R + r) = word;
  }
}

}  // namespace

void fp8_tensor_amax(float* slot, const bf16* x, int64_t n, cudaStream_t stream) {
  RT_CHECK(n > 0, "[cuda fp8_tensor_amax] empty tensor");
  RT_CHECK(reinterpret_cast<uintptr_t>(slot) % 16 == 0, "[cuda fp8_tensor_amax] the slot must be 16-byte aligned");
  uint32_t* key = reinterpret_cast<uint32_t*>(slot) + 1;
  CUDA_CHECK(cudaMemsetAsync(key, 0, sizeof(uint32_t), stream));
  const bool vec = n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t work = vec ? n / 8 : n;
  const int64_t blocks = std::min<int64_t>(detail::ceil_div(work, 256), 132 * 8);  // enough to fill any card
  tensor_amax_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(key, x, n, vec);
  CUDA_CHECK_LAUNCH();
}

void fp8_tensor_codes(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C, cudaStream_t stream) {
  RT_CHECK(R > 0 && C > 0 && C % 8 == 0 && (!qt || R % 4 == 0), "[cuda fp8_tensor_codes] shape ", R, " x ", C,
           ": needs C % 8 == 0 (and R % 4 == 0 for transposed codes)");
  detail::check_aligned(x, "fp8 tensor quantizer input");
  if (q) detail::check_aligned(q, "fp8 tensor codes");
  if (qt) detail::check_aligned(qt, "fp8 tensor transposed codes");
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(C, kTensorTile)),
                  static_cast<unsigned>(detail::ceil_div(R, kTensorTile)));
  RT_CHECK(grid.y <= 65535u, "[cuda fp8_tensor_codes] ", R, " rows: more than 65535 tiles of 64");
  tensor_codes_kernel<<<grid, 256, 0, stream>>>(q, qt, slot, x, R, C);
  CUDA_CHECK_LAUNCH();
}

void fp8_quantize_tensor(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C,
                         cudaStream_t stream) {
  fp8_tensor_amax(slot, x, R * C, stream);
  fp8_tensor_codes(q, qt, slot, x, R, C, stream);
}

}  // namespace rt::cuda
