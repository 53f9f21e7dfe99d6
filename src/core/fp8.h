// FP8 (e4m3) numerics shared by the CPU twin (cpu/fp8.h) and the CUDA
// quantizers (cuda/fp8.cu): the code <-> value map, the block scale rule and
// which linear layers run in FP8. Header-only; the scale rule compiles for
// host and device (RT_FP8_HD) so both backends run the same bits.
//
// e4m3 ("e4m3fn", OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa bits;
// no infinities; S.1111.111 is NaN; the largest finite is 448 = 1.75 * 2^8;
// normals 2^-6 .. 448, subnormals k * 2^-9 (k = 1..7).
// Encoding (fp8_e4m3_encode) rounds to nearest, ties to even, and saturates:
// |v| >= 448 (Inf included) -> +-448, NaN -> 0x7F with the sign bit kept;
// this is what CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
// does (tests/gpu/fp8_test.cpp checks every bf16 value and random fp32).
// Error: for |v| in the normal range [2^-6, 448], |dec(enc(v)) - v| <= 2^-4 |v|
// (3 mantissa bits: half a step of 2^-3 relative to the leading bit); below
// 2^-6 the error is absolute, <= 2^-10 (half the subnormal step 2^-9).
//
// Block scales are powers of two: s = 2^k with k the smallest integer for
// which amax / s <= 448, clamped to k >= -126 (s and 1/s stay normal fp32).
// Then v / s is exact (a power-of-two multiply), no element saturates, and the
// dequantized value code * s is exact too, so CPU and GPU agree bit for bit
// without depending on how either rounds a division. The price against
// s = amax/448 is at most one binade of headroom (the block's largest element
// lands in [224, 448] instead of at 448), which costs nothing in the normal
// range (e4m3's relative step is the same in every binade) and only pushes
// the smallest elements of a block one binade closer to the subnormals.
// The same rule makes the single scale of a whole tensor (--fp8-scaling
// tensor, cpu/fp8.h): "block" below then means the tensor.
// amax == 0: s = 1 (all codes zero). A block holding Inf or NaN gets s = NaN,
// so every value of it dequantizes to NaN: non-finite inputs propagate, as
// they do through the bf16 GEMM, instead of being clipped to 448.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RT_FP8_HD __host__ __device__
#else
#define RT_FP8_HD
#endif

namespace rt {

// What the transformer layers' projection GEMMs run in (train --matmul, and
// --fp8-scaling for the two FP8 recipes). bf16: the backend's own precision
// (bf16 operands on the GPU, fp32 on the CPU); fp8: e4m3 operands with block
// scales (1x128 tiles, 128x128 weight blocks; `--fp8-scaling block`, the
// default); fp8_tensor: e4m3 operands with one scale per tensor
// (`--fp8-scaling tensor`). cpu/fp8.h is the spec of both.
enum class MatmulMode { bf16, fp8, fp8_tensor };
inline bool matmul_is_fp8(MatmulMode m) { return m != MatmulMode::bf16; }

inline constexpr int64_t kFp8Block = 128;       // scale block edge along each quantized dimension
inline constexpr float kFp8E4m3Max = 448.f;     // largest finite e4m3
inline constexpr uint8_t kFp8E4m3NaN = 0x7F;    // the NaN code (sign bit clear)

// A projection linear [N tokens, I in, O out] runs in FP8 only when every GEMM
// dimension (N, I, O: each is the reduction dim of one of the three GEMMs) is a
// multiple of 16, what cuBLASLt's FP8 kernels need (16-byte aligned rows);
// others (the shared expert's gate, O = 1; a tail MLP chunk) stay in bf16.
// Both backends use this rule, so the CPU twin computes what the GPU does.
inline bool fp8_linear_eligible(int64_t N, int64_t I, int64_t O) {
  return N > 0 && I > 0 && O > 0 && N % 16 == 0 && I % 16 == 0 && O % 16 == 0;
}

RT_FP8_HD inline uint32_t fp8_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
RT_FP8_HD inline float fp8_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// The exponent k of the block scale s = 2^k for a block whose largest |x| is
// amax (finite, >= 0): the smallest k with amax <= 448 * 2^k, at least -126.
// Exact integer work on amax's bits: amax = (1 + f) 2^E and 448 = 1.75 * 2^8,
// so k = E - 8 when 1 + f <= 1.75, else E - 7.
RT_FP8_HD inline int fp8_scale_exponent(float amax) {
  const uint32_t b = fp8_f32_bits(amax) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(b >> 23);
  if (biased == 0) return -126;  // zero or an fp32 subnormal: the smallest normal scale
  const int E = biased - 127;
  const uint32_t frac = b & 0x7FFFFFu;
  int k = frac <= 0x600000u ? E - 8 : E - 7;  // 0x600000: f = 0.75
  return k < -126 ? -126 : k;
}

// The block scale s (dequantized value = decode(code) * s) and its inverse
// (what the encoder multiplies by), from the block's amax and whether the
// block holds a non-finite value. Both are exact powers of two (or NaN).
struct Fp8Scale {
  float scale, inv;
};
RT_FP8_HD inline Fp8Scale fp8_block_scale(float amax, bool nonfinite) {
  if (nonfinite) {
    const float nan = fp8_bits_f32(0x7FC00000u);
    return {nan, nan};
  }
  if (amax == 0.f) return {1.f, 1.f};
  const int k = fp8_scale_exponent(amax);
  return {fp8_bits_f32(static_cast<uint32_t>(k + 127) << 23), fp8_bits_f32(static_cast<uint32_t>(127 - k) << 23)};
}

// e4m3 code -> value (NaN for 0x7F / 0xFF).
inline float fp8_e4m3_decode(uint8_t code) {
  const bool neg = code & 0x80;
  const int e = (code >> 3) & 0xF, m = code & 7;
  float v;
  if (e == 0xF && m == 7) {
    v = fp8_bits_f32(0x7FC00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * 0x1p-9f;  // subnormal: m * 2^-9
  } else {
    v = fp8_bits_f32(static_cast<uint32_t>(e - 7 + 127) << 23) * (1.f + static_cast<float>(m) * 0.125f);
  }
  return neg ? -v : v;
}

// value -> e4m3 code: round to nearest even, saturating (see the top).
// Written from the definition; plain fp32 arithmetic that is exact (power-of-
// two multiplies of values far inside fp32's range) plus one integer rounding.
inline uint8_t fp8_e4m3_encode(float v) {
  const uint32_t bits = fp8_f32_bits(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<uint8_t>(sign | kFp8E4m3NaN);  // NaN
  const float a = fp8_bits_f32(mag);
  if (a >= kFp8E4m3Max) return static_cast<uint8_t>(sign | 0x7E);  // saturate (Inf too)
  // round-to-nearest-even of a non-negative double already scaled so that one
  // unit is one step of the target grid (t < 2^12: exact in double)
  auto rne = [](double t) {
    double f = static_cast<double>(static_cast<int64_t>(t));
    const double r = t - f;
    if (r > 0.5 || (r == 0.5 && static_cast<int64_t>(f) % 2 != 0)) f += 1.0;
    return static_cast<int>(f);
  };
  if (a < 0x1p-6f) {  // subnormal range: step 2^-9; q == 8 is the smallest normal, code 0x08
    const int q = rne(static_cast<double>(a) * 512.0);
    return static_cast<uint8_t>(sign | q);
  }
  int E = static_cast<int>((mag >> 23)) - 127;  // a = (1 + f) 2^E, E in [-6, 8]
  // q in [8, 16]: the significand in steps of 2^(E-3)
  int q = rne(static_cast<double>(a) * static_cast<double>(fp8_bits_f32(static_cast<uint32_t>(3 - E + 127) << 23)));
  if (q == 16) {
    q = 8;
    ++E;
  }
  // a < 448 keeps (E, q) below (8, 15): 448 = (8, 14) is the largest reached
  return static_cast<uint8_t>(sign | ((E + 7) << 3) | (q - 8));
}

}  // namespace rt
