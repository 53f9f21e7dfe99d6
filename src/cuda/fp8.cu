// FP8 quantizers (block and per-tensor scales), the cuBLASLt FP8 GEMM (block-
// scaled or with scalar scales) and the FP8 linear layer (declared in
// cuda/fp8.h; cpu/fp8.h is the specification they match bit for bit up to the
// GEMM's fp32 summation order). Encoding is CUDA's own
// __nv_cvt_float_to_fp8(satfinite, e4m3) on x * 2^-k (exact); the scale is
// core/fp8.h's fp8_block_scale (of a block's or the whole tensor's amax); a
// block or tensor with Inf/NaN is all NaN codes (0x7F). Each block quantizer
// zeroes its scale array first (the layouts' padding is 0).
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/fp8.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/kernel_util.cuh"
#include "cuda/lt_plan.h"

namespace rt::cuda {

bool fp8_supported(int device, MatmulMode mode, std::string* why) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  const bool fp8_cores = p.major > 8 || (p.major == 8 && p.minor >= 9);
  if (mode == MatmulMode::fp8_tensor) {
    // per-tensor scaled FP8 in cuBLASLt: every card with FP8 tensor cores
    // (compute capability 8.9+: Ada, Hopper, Blackwell; tested on Hopper)
    if (fp8_cores) return true;
    if (why)
      *why = cat("GPU ", device, " (", p.name, ") is sm_", p.major, p.minor, ": --matmul fp8 --fp8-scaling tensor ",
                 "runs cuBLASLt's per-tensor scaled FP8 GEMM, which needs FP8 tensor cores (sm_89 and newer: RTX "
                 "4090, H100, ...); this card has none; use --matmul bf16 (the default)");
    return false;
  }
  if (p.major == 9) return true;
  if (why) {
    *why = cat("GPU ", device, " (", p.name, ") is sm_", p.major, p.minor, ": --matmul fp8 runs cuBLASLt's FP8 GEMM ",
               "with 1x128/128x128 block scales (--fp8-scaling block, the default), which cuBLASLt implements on "
               "Hopper (sm_90: H100, H200) only; ",
               !fp8_cores ? "this card has no FP8 tensor cores; use --matmul bf16 (the default)"
               : p.major == 8
                   ? "on Ada (sm_89) cuBLASLt's FP8 takes per-tensor scales: use --fp8-scaling tensor, or --matmul bf16"
                   : "Blackwell's block-scaled FP8 is MXFP8 (32-element e8m0 scales), not wired here; use --matmul "
                     "bf16 (the default)");
  }
  return false;
}

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
    if (nonfinite_abs(a)) bad = true;
    else amax = fmaxf(amax, a);
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
__global__ void quantize_128x128_kernel(uint8_t* q, float* scale, uint8_t* qt, float* scale_t, const bf16* w,
                                        int64_t R, int64_t K, int64_t KBp, int64_t RBp) {
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
      if (nonfinite_abs(a)) bad = 1;
      else amax = fmaxf(amax, a);
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

// out[n, o] += bias[o] in fp32, rounded to bf16 once more.
__global__ void add_bias_kernel(bf16* out, const bf16* bias, int64_t N, int64_t O) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * O) return;
  out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % O]));
}

// dbias[o] += sum_n dout[n, o], one thread per column, rows in order.
__global__ void bias_grad_rows_kernel(float* dbias, const bf16* dout, int64_t N, int64_t O) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= O) return;
  float s = 0.f;
  for (int64_t n = 0; n < N; ++n) s += __bfloat162float(dout[n * O + o]);
  dbias[o] += s;
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
constexpr uint32_t kNonfiniteKey = 0x7F800000u;
__device__ __forceinline__ uint32_t amax_key(float v) { return __float_as_uint(fabsf(v)); }

// max over the block of each thread's key, then one atomicMax per block (the
// result is the max whatever the order). 256 threads.
__device__ __forceinline__ void block_amax_commit(uint32_t key, uint32_t* out) {
  __shared__ uint32_t red[8];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) m = max(m, red[i]);
    if (m) atomicMax(out, m);
  }
}

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
  block_amax_commit(key, key_out);
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

void fp8_tensor_codes(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C,
                      cudaStream_t stream) {
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

// ---- the GEMM ----

namespace {

using Fp8PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool, int, int>;

int32_t scale_mode(Fp8Scaling s) {
  return s == Fp8Scaling::vec128       ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
         : s == Fp8Scaling::blk128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                       : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}
const char* scale_name(Fp8Scaling s) {
  return s == Fp8Scaling::vec128 ? "1x128" : s == Fp8Scaling::blk128x128 ? "128x128" : "tensor";
}

}  // namespace

struct Fp8Gemm::Impl {
  explicit Impl(size_t workspace_bytes) : lt(workspace_bytes) {}
  LtContext lt;  // first: the plans go before the handle
  std::map<Fp8PlanKey, std::unique_ptr<LtPlan>> plans;

  // Row-major out[M,N] = a[M,K] b[N,K]^T is column-major out^T[N,M] =
  // op(A) B with cuBLAS A := b (stored K x N, TRANSA = T) and B := a (stored
  // K x M, TRANSB = N): the "TN" layout FP8 needs.
  // The scale pointers are set before the heuristic is asked (the order
  // NVIDIA's block-scaled samples use) and again before every call.
  LtPlan& plan_get(int64_t M, int64_t N, int64_t K, DType out_type, bool accumulate, Fp8Scaling a_mode,
                    Fp8Scaling b_mode, const float* a_scale, const float* b_scale) {
    Fp8PlanKey key{M, N, K, static_cast<int>(out_type), accumulate, static_cast<int>(a_mode),
                   static_cast<int>(b_mode)};
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto p = std::make_unique<LtPlan>();
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    const int32_t mode_a = scale_mode(b_mode), mode_b = scale_mode(a_mode);  // cuBLAS A is our b
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
    // FAST_ACCUM stays at its default (off): the periodic promotion to fp32
    // that DeepSeek-V3 relies on; block-scaled modes take no other setting,
    // and per-tensor scaling keeps it off too (the same accumulation bound).
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, K, M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, out_type == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &lt.workspace_bytes, sizeof(lt.workspace_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt.handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    RT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "[cuda fp8 gemm] cuBLASLt has no FP8 algorithm for M=", M,
             " N=", N, " K=", K, " out=", out_type == DType::bf16 ? "bf16" : "fp32", " beta=", accumulate ? 1 : 0,
             " scales a=", scale_name(a_mode), " b=", scale_name(b_mode), " (status ", cublasLtGetStatusString(st),
             "); FP8 needs dimensions that are multiples of 16, block scales sm_90 and per-tensor scales sm_89 or "
             "sm_90; use --matmul bf16");
    p->algo = result.algo;
    auto& ref = *p;
    plans.emplace(key, std::move(p));
    return ref;
  }
};

Fp8Gemm::Fp8Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>(workspace_bytes)) {
}
Fp8Gemm::~Fp8Gemm() = default;
size_t Fp8Gemm::plans_cached() const { return impl_->plans.size(); }

void Fp8Gemm::matmul(void* out, DType out_type, const uint8_t* a, const float* a_scale, Fp8Scaling a_mode,
                     const uint8_t* b, const float* b_scale, Fp8Scaling b_mode, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream) {
  RT_CHECK(beta == 0.f || beta == 1.f, "[cuda fp8 gemm] beta must be 0 or 1, got ", beta);
  RT_CHECK(beta == 0.f || out_type == DType::f32, "[cuda fp8 gemm] accumulation (beta=1) needs an fp32 output");
  RT_CHECK(!(a_mode == Fp8Scaling::blk128x128 && b_mode == Fp8Scaling::blk128x128),
           "[cuda fp8 gemm] cuBLASLt takes 128x128 block scales on one operand at most");
  RT_CHECK((a_mode == Fp8Scaling::tensor) == (b_mode == Fp8Scaling::tensor),
           "[cuda fp8 gemm] per-tensor scales on one operand and block scales on the other: not supported");
  RT_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0, "[cuda fp8 gemm] bad shape M=", M,
           " N=", N, " K=", K, " (all > 0 and multiples of 16)");
  detail::check_aligned(out, "fp8 gemm out");
  detail::check_aligned(a, "fp8 gemm a");
  detail::check_aligned(b, "fp8 gemm b");
  detail::check_aligned(a_scale, "fp8 gemm a scales");
  detail::check_aligned(b_scale, "fp8 gemm b scales");
  LtPlan& p = impl_->plan_get(M, N, K, out_type, beta != 0.f, a_mode, b_mode, a_scale, b_scale);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasLtMatmul(impl_->lt.handle, p.desc, &alpha, b, p.la, a, p.lb, &beta, out, p.lc, out, p.lc, &p.algo,
                              impl_->lt.workspace, impl_->lt.workspace_bytes, stream));
}

// ---- the linear layer ----

namespace {

// Grows buf to at least need bytes. Work queued on `stream` (the whole
// device when null) may still read the old buffer: synchronised first.
void grow_device_buffer(void*& buf, size_t& bytes, size_t need, cudaStream_t stream) {
  if (need <= bytes) return;
  CUDA_CHECK(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize());
  if (buf) CUDA_CHECK(cudaFree(buf));
  buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, need));
  bytes = need;
}

// Regions of the given byte sizes, each 256-byte aligned (fp8_region), in a row.
template <size_t Nr>
size_t regions_bytes(const size_t (&sizes)[Nr]) {
  size_t total = 0;
  for (size_t b : sizes) total += fp8_region(b);
  return total;
}
template <size_t Nr>
void split_regions(void* base, const size_t (&sizes)[Nr], void* (&out)[Nr]) {
  size_t off = 0;
  for (size_t i = 0; i < Nr; ++i) {
    out[i] = static_cast<char*>(base) + off;
    off += fp8_region(sizes[i]);
  }
}

}  // namespace

struct Fp8Linear::Impl {
  explicit Impl(MatmulMode m) : mode(m) {}
  const MatmulMode mode;
  bool tensor() const { return mode == MatmulMode::fp8_tensor; }
  Fp8Gemm gemm;
  void* buf = nullptr;
  size_t bytes = 0;
  // share_input's state: the input, its codes along I (rows) and along N
  // (cols) once made, in a buffer of their own
  const bf16* shared_x = nullptr;
  int64_t shared_N = 0, shared_I = 0;
  bool have_rows = false, have_cols = false;
  void* shared_buf = nullptr;
  size_t shared_bytes = 0;
  uint8_t *sq = nullptr, *sqt = nullptr;
  float *ss = nullptr, *sst = nullptr;  // per-tensor scaling: ss is the slot, sst unused
  bool have_amax = false;               // per-tensor scaling: the slot's amax is made
  // share_weights' state: one entry per distinct weight seen in the scope,
  // reused in order by the next scope (a dense model's layers have the same
  // shapes, so buffers grow on the first layer only)
  struct WeightCodes {
    const bf16* w = nullptr;
    int64_t O = 0, I = 0;
    void* buf = nullptr;
    size_t bytes = 0;
    uint8_t *q = nullptr, *qt = nullptr;
    float *s = nullptr, *st = nullptr;  // per-tensor scaling: s is the slot (q and qt share it), st unused
  };
  bool weights_shared = false;
  std::vector<WeightCodes> wcodes;
  size_t wnext = 0;
  ~Impl() {
    if (buf) cudaFree(buf);
    if (shared_buf) cudaFree(shared_buf);
    for (auto& c : wcodes)
      if (c.buf) cudaFree(c.buf);
  }
  // w's codes (and transposed codes) while weights are shared, else null
  const WeightCodes* weight_codes(const bf16* w, int64_t O, int64_t I, cudaStream_t stream) {
    if (!weights_shared) return nullptr;
    for (size_t j = 0; j < wnext; ++j)
      if (wcodes[j].w == w && wcodes[j].O == O && wcodes[j].I == I) return &wcodes[j];
    if (wnext == wcodes.size()) wcodes.emplace_back();
    WeightCodes& c = wcodes[wnext++];
    if (tensor()) {
      const size_t sizes[3] = {static_cast<size_t>(O * I), static_cast<size_t>(O * I),
                               kFp8TensorSlot};  // = fp8_shared_weight_bytes(O, I, fp8_tensor)
      grow_device_buffer(c.buf, c.bytes, regions_bytes(sizes), stream);
      void* r[3];
      split_regions(c.buf, sizes, r);
      c.q = static_cast<uint8_t*>(r[0]), c.qt = static_cast<uint8_t*>(r[1]);
      c.s = static_cast<float*>(r[2]), c.st = nullptr;
      c.w = w, c.O = O, c.I = I;
      fp8_quantize_tensor(c.q, c.qt, c.s, w, O, I, stream);
      return &c;
    }
    const size_t sizes[4] = {static_cast<size_t>(O * I), static_cast<size_t>(O * I),
                             static_cast<size_t>(fp8_scales_128x128(O, I)) * 4,
                             static_cast<size_t>(fp8_scales_128x128(I, O)) * 4};  // = fp8_shared_weight_bytes
    grow_device_buffer(c.buf, c.bytes, regions_bytes(sizes), stream);
    void* r[4];
    split_regions(c.buf, sizes, r);
    c.q = static_cast<uint8_t*>(r[0]), c.qt = static_cast<uint8_t*>(r[1]);
    c.s = static_cast<float*>(r[2]), c.st = static_cast<float*>(r[3]);
    c.w = w, c.O = O, c.I = I;
    fp8_quantize_128x128(c.q, c.s, c.qt, c.st, w, O, I, stream);
    return &c;
  }
  bool shares(const bf16* x, int64_t N, int64_t I) const {
    return shared_x && x == shared_x && N == shared_N && I == shared_I;
  }
  // x's codes along I: made on first use while shared (per-tensor scaling:
  // the amax once, then the codes or the transposed codes from it)
  void shared_amax(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (!have_amax) fp8_tensor_amax(ss, x, N * I, stream);
    have_amax = true;
  }
  void rows(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (have_rows) return;
    if (tensor()) {
      shared_amax(x, N, I, stream);
      fp8_tensor_codes(sq, nullptr, ss, x, N, I, stream);
    } else {
      fp8_quantize_1x128(sq, ss, x, N, I, false, stream);
    }
    have_rows = true;
  }
  void cols(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (have_cols) return;
    if (tensor()) {
      shared_amax(x, N, I, stream);
      fp8_tensor_codes(nullptr, sqt, ss, x, N, I, stream);
    } else {
      fp8_quantize_1x128(sqt, sst, x, I, N, true, stream);
    }
    have_cols = true;
  }
  // Carves regions of the given byte sizes (each 256-byte aligned) out of
  // one buffer that grows to the largest request (synchronising the stream
  // first: the old buffer may still be read by queued work).
  template <size_t Nr>
  void carve(const size_t (&sizes)[Nr], void* (&out)[Nr], cudaStream_t stream) {
    grow_device_buffer(buf, bytes, regions_bytes(sizes), stream);
    split_regions(buf, sizes, out);
  }
};

Fp8Linear::Fp8Linear(MatmulMode mode) : impl_(std::make_unique<Impl>(mode)) {
  RT_CHECK(matmul_is_fp8(mode), "[cuda fp8 linear] internal: made for --matmul bf16");
}
Fp8Linear::~Fp8Linear() = default;
Fp8Gemm& Fp8Linear::gemm() { return impl_->gemm; }

void Fp8Linear::share_input(const bf16* x, int64_t N, int64_t I) {
  Impl& m = *impl_;
  RT_CHECK(!m.shared_x, "[cuda fp8 linear] share_input while another input is shared");
  RT_CHECK(x && N > 0 && I > 0, "[cuda fp8 linear] share_input: bad input ", N, " x ", I);
  m.shared_x = x, m.shared_N = N, m.shared_I = I;
  m.have_rows = m.have_cols = m.have_amax = false;
  if (m.tensor()) {
    const size_t sizes[3] = {static_cast<size_t>(N * I), static_cast<size_t>(N * I),
                             kFp8TensorSlot};  // = fp8_shared_input_bytes(N, I, fp8_tensor)
    grow_device_buffer(m.shared_buf, m.shared_bytes, regions_bytes(sizes), nullptr);
    void* r[3];
    split_regions(m.shared_buf, sizes, r);
    m.sq = static_cast<uint8_t*>(r[0]), m.sqt = static_cast<uint8_t*>(r[1]);
    m.ss = static_cast<float*>(r[2]), m.sst = nullptr;
    return;
  }
  const size_t sizes[4] = {static_cast<size_t>(N * I), static_cast<size_t>(N * I),
                           static_cast<size_t>(fp8_scales_1x128(N, I)) * 4,
                           static_cast<size_t>(fp8_scales_1x128(I, N)) * 4};  // = fp8_shared_input_bytes
  grow_device_buffer(m.shared_buf, m.shared_bytes, regions_bytes(sizes), nullptr);
  void* r[4];
  split_regions(m.shared_buf, sizes, r);
  m.sq = static_cast<uint8_t*>(r[0]), m.sqt = static_cast<uint8_t*>(r[1]);
  m.ss = static_cast<float*>(r[2]), m.sst = static_cast<float*>(r[3]);
}

void Fp8Linear::share_weights() {
  RT_CHECK(!impl_->weights_shared, "[cuda fp8 linear] share_weights while weights are shared");
  impl_->weights_shared = true;
  impl_->wnext = 0;
}

void Fp8Linear::end_share_weights() {
  impl_->weights_shared = false;
  for (auto& c : impl_->wcodes) c.w = nullptr;
  impl_->wnext = 0;
}

void Fp8Linear::end_share() {
  impl_->shared_x = nullptr;
  impl_->have_rows = impl_->have_cols = impl_->have_amax = false;
}

namespace {
size_t f32_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
size_t u8_bytes(int64_t n) { return static_cast<size_t>(n); }
void check_linear_shape(const char* what, int64_t N, int64_t I, int64_t O) {
  RT_CHECK(fp8_linear_eligible(N, I, O), "[cuda ", what, "] FP8 linear needs N, I, O multiples of 16, got N=", N,
           " I=", I, " O=", O);
}
}  // namespace

void Fp8Linear::forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int64_t N, int64_t I, int64_t O,
                        cudaStream_t stream) {
  check_linear_shape("fp8 linear_forward", N, I, O);
  Impl& m = *impl_;
  if (m.tensor()) {
    tensor_forward(out, x, w, N, I, O, stream);
    add_bias(out, bias, N, O, stream);
    return;
  }
  const bool shared = m.shares(x, N, I);
  const Impl::WeightCodes* wc = m.weight_codes(w, O, I, stream);
  void* r[4];
  m.carve({u8_bytes(shared ? 0 : N * I), f32_bytes(shared ? 0 : fp8_scales_1x128(N, I)), u8_bytes(wc ? 0 : O * I),
           f32_bytes(wc ? 0 : fp8_scales_128x128(O, I))},
          r, stream);
  auto* qx = static_cast<uint8_t*>(r[0]);
  auto* sx = static_cast<float*>(r[1]);
  auto* qw = static_cast<uint8_t*>(r[2]);
  auto* sw = static_cast<float*>(r[3]);
  if (shared) {
    m.rows(x, N, I, stream);
    qx = m.sq, sx = m.ss;
  } else {
    fp8_quantize_1x128(qx, sx, x, N, I, false, stream);
  }
  if (wc)
    qw = wc->q, sw = wc->s;
  else
    fp8_quantize_128x128(qw, sw, nullptr, nullptr, w, O, I, stream);
  impl_->gemm.matmul(out, DType::bf16, qx, sx, Fp8Scaling::vec128, qw, sw, Fp8Scaling::blk128x128, N, O, I, 0.f,
                     stream);
  add_bias(out, bias, N, O, stream);
}

void Fp8Linear::backward(bf16* dx, float* dw, float* dbias, const bf16* dout, const bf16* x, const bf16* w, int64_t N,
                         int64_t I, int64_t O, cudaStream_t stream) {
  check_linear_shape("fp8 linear_backward", N, I, O);
  if (impl_->tensor()) {
    tensor_backward(dx, dw, dout, x, w, N, I, O, stream);
  } else if (dx) {  // dx[N, I] = dq(dout)[N, O] @ dq(w^T)[I, O]^T
    const Impl::WeightCodes* wc = impl_->weight_codes(w, O, I, stream);
    const int64_t wn = wc ? 0 : O * I;
    void* r[6];
    impl_->carve(
        {u8_bytes(N * O), f32_bytes(fp8_scales_1x128(N, O)), u8_bytes(wn), f32_bytes(wc ? 0 : fp8_scales_128x128(O, I)),
         u8_bytes(wn), f32_bytes(wc ? 0 : fp8_scales_128x128(I, O))},
        r, stream);
    auto* qdy = static_cast<uint8_t*>(r[0]);
    auto* sdy = static_cast<float*>(r[1]);
    auto* qwt = static_cast<uint8_t*>(r[4]);
    auto* swt = static_cast<float*>(r[5]);
    fp8_quantize_1x128(qdy, sdy, dout, N, O, false, stream);
    if (wc)
      qwt = wc->qt, swt = wc->st;
    else
      fp8_quantize_128x128(static_cast<uint8_t*>(r[2]), static_cast<float*>(r[3]), qwt, swt, w, O, I, stream);
    impl_->gemm.matmul(dx, DType::bf16, qdy, sdy, Fp8Scaling::vec128, qwt, swt, Fp8Scaling::blk128x128, N, I, O, 0.f,
                       stream);
  }
  if (dw && !impl_->tensor()) {  // dw[O, I] += dq(dout^T)[O, N] @ dq(x^T)[I, N]^T, both along tokens
    Impl& m = *impl_;
    const bool shared = m.shares(x, N, I);
    void* r[4];
    m.carve({u8_bytes(O * N), f32_bytes(fp8_scales_1x128(O, N)), u8_bytes(shared ? 0 : I * N),
             f32_bytes(shared ? 0 : fp8_scales_1x128(I, N))},
            r, stream);
    auto* qdyt = static_cast<uint8_t*>(r[0]);
    auto* sdyt = static_cast<float*>(r[1]);
    auto* qxt = static_cast<uint8_t*>(r[2]);
    auto* sxt = static_cast<float*>(r[3]);
    fp8_quantize_1x128(qdyt, sdyt, dout, O, N, true, stream);
    if (shared) {
      m.cols(x, N, I, stream);
      qxt = m.sqt, sxt = m.sst;
    } else {
      fp8_quantize_1x128(qxt, sxt, x, I, N, true, stream);
    }
    impl_->gemm.matmul(dw, DType::f32, qdyt, sdyt, Fp8Scaling::vec128, qxt, sxt, Fp8Scaling::vec128, O, I, N, 1.f,
                       stream);
  }
  if (dbias) {
    bias_grad_rows_kernel<<<static_cast<unsigned>(detail::ceil_div(O, 128)), 128, 0, stream>>>(dbias, dout, N, O);
    CUDA_CHECK_LAUNCH();
  }
}

void Fp8Linear::add_bias(bf16* out, const bf16* bias, int64_t N, int64_t O, cudaStream_t stream) {
  if (!bias) return;
  add_bias_kernel<<<static_cast<unsigned>(detail::ceil_div(N * O, 256)), 256, 0, stream>>>(out, bias, N, O);
  CUDA_CHECK_LAUNCH();
}

// Per-tensor scaling (cpu::fp8_tensor_linear_forward): y = Qt(x) Qt(w)^T.
void Fp8Linear::tensor_forward(bf16* out, const bf16* x, const bf16* w, int64_t N, int64_t I, int64_t O,
                               cudaStream_t stream) {
  Impl& m = *impl_;
  const bool shared = m.shares(x, N, I);
  const Impl::WeightCodes* wc = m.weight_codes(w, O, I, stream);
  void* r[4];
  m.carve({u8_bytes(shared ? 0 : N * I), shared ? 0 : kFp8TensorSlot, u8_bytes(wc ? 0 : O * I),
           wc ? 0 : kFp8TensorSlot},
          r, stream);
  auto* qx = static_cast<uint8_t*>(r[0]);
  auto* sx = static_cast<float*>(r[1]);
  auto* qw = static_cast<uint8_t*>(r[2]);
  auto* sw = static_cast<float*>(r[3]);
  if (shared) {
    m.rows(x, N, I, stream);
    qx = m.sq, sx = m.ss;
  } else {
    fp8_quantize_tensor(qx, nullptr, sx, x, N, I, stream);
  }
  if (wc)
    qw = wc->q, sw = wc->s;
  else
    fp8_quantize_tensor(qw, nullptr, sw, w, O, I, stream);
  m.gemm.matmul(out, DType::bf16, qx, sx, Fp8Scaling::tensor, qw, sw, Fp8Scaling::tensor, N, O, I, 0.f, stream);
}

// Per-tensor scaling (cpu::fp8_tensor_linear_backward): dy is quantized once,
// into its codes (dgrad, along O) and transposed codes (wgrad, along N);
// dx = Qt(dy) Qt(w) with w's transposed codes, dw += Qt(dy)^T Qt(x) with x's.
void Fp8Linear::tensor_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int64_t N,
                                int64_t I, int64_t O, cudaStream_t stream) {
  if (!dx && !dw) return;
  Impl& m = *impl_;
  const Impl::WeightCodes* wc = dx ? m.weight_codes(w, O, I, stream) : nullptr;
  const bool shared = dw && m.shares(x, N, I);
  const bool own_w = dx && !wc, own_x = dw && !shared;
  void* r[7];
  m.carve({u8_bytes(dx ? N * O : 0), u8_bytes(dw ? N * O : 0), kFp8TensorSlot, u8_bytes(own_w ? O * I : 0),
           own_w ? kFp8TensorSlot : 0, u8_bytes(own_x ? N * I : 0), own_x ? kFp8TensorSlot : 0},
          r, stream);
  auto* qdy = static_cast<uint8_t*>(r[0]);
  auto* qdyt = static_cast<uint8_t*>(r[1]);
  auto* sdy = static_cast<float*>(r[2]);
  fp8_quantize_tensor(dx ? qdy : nullptr, dw ? qdyt : nullptr, sdy, dout, N, O, stream);
  if (dx) {  // dx[N, I] = Qt(dy)[N, O] @ Qt(w^T)[I, O]^T
    const uint8_t* qwt = wc ? wc->qt : static_cast<uint8_t*>(r[3]);
    const float* sw = wc ? wc->s : static_cast<float*>(r[4]);
    if (!wc) fp8_quantize_tensor(nullptr, static_cast<uint8_t*>(r[3]), static_cast<float*>(r[4]), w, O, I, stream);
    m.gemm.matmul(dx, DType::bf16, qdy, sdy, Fp8Scaling::tensor, qwt, sw, Fp8Scaling::tensor, N, I, O, 0.f, stream);
  }
  if (dw) {  // dw[O, I] += Qt(dy^T)[O, N] @ Qt(x^T)[I, N]^T
    const uint8_t* qxt = static_cast<uint8_t*>(r[5]);
    const float* sx = static_cast<float*>(r[6]);
    if (shared) {
      m.cols(x, N, I, stream);
      qxt = m.sqt, sx = m.ss;
    } else {
      fp8_quantize_tensor(nullptr, static_cast<uint8_t*>(r[5]), static_cast<float*>(r[6]), x, N, I, stream);
    }
    m.gemm.matmul(dw, DType::f32, qdyt, sdy, Fp8Scaling::tensor, qxt, sx, Fp8Scaling::tensor, O, I, N, 1.f, stream);
  }
}

}  // namespace rt::cuda
