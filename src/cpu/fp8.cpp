// The FP8 linear layer's CPU twin (declared in cpu/fp8.h). Each quantizer
// handles rows (or 128-row bands) independently over the pool, so results do
// not depend on the thread count; the GEMMs are cpu/matmul.cpp's.
#include "cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"

namespace rt::cpu {
namespace {

int64_t blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// amax over |x| and whether any element is Inf/NaN, into a scale
struct AmaxAcc {
  float amax = 0.f;
  bool nonfinite = false;
  void add(float v) {
    const float a = std::fabs(v);
    if (!(a <= 3.4028235e38f)) nonfinite = true;  // Inf or NaN
    else if (a > amax) amax = a;
  }
};

// A block with a non-finite element is all NaN codes (its scale is NaN too):
// stated here rather than left to the sign NaN * x happens to get.
uint8_t encode(float v, const Fp8Scale& s, bool nonfinite) {
  return nonfinite ? kFp8E4m3NaN : fp8_e4m3_encode(v * s.inv);
}

}  // namespace

void fp8_quantize_1x128(uint8_t* q, float* scale, const float* x, int64_t R, int64_t K, int64_t row_stride,
                        int64_t col_stride) {
  RT_CHECK(R >= 0 && K >= 0, "[cpu/fp8_quantize_1x128] negative shape ", R, " x ", K);
  const int64_t KB = blocks(K);
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t kb = 0; kb < KB; ++kb) {
        const int64_t k0 = kb * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
        AmaxAcc acc;
        for (int64_t k = k0; k < k1; ++k) acc.add(x[r * row_stride + k * col_stride]);
        const Fp8Scale s = fp8_block_scale(acc.amax, acc.nonfinite);
        scale[r * KB + kb] = s.scale;
        for (int64_t k = k0; k < k1; ++k) q[r * K + k] = encode(x[r * row_stride + k * col_stride], s, acc.nonfinite);
      }
    }
  });
}

void fp8_quantize_128x128(uint8_t* q, float* scale, const float* x, int64_t R, int64_t K) {
  RT_CHECK(R >= 0 && K >= 0, "[cpu/fp8_quantize_128x128] negative shape ", R, " x ", K);
  const int64_t RB = blocks(R), KB = blocks(K);
  parallel_for(RB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t rb = b0; rb < b1; ++rb) {
      const int64_t r0 = rb * kFp8Block, r1 = std::min(R, r0 + kFp8Block);
      for (int64_t kb = 0; kb < KB; ++kb) {
        const int64_t k0 = kb * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
        AmaxAcc acc;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = k0; k < k1; ++k) acc.add(x[r * K + k]);
        const Fp8Scale s = fp8_block_scale(acc.amax, acc.nonfinite);
        scale[rb * KB + kb] = s.scale;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = k0; k < k1; ++k) q[r * K + k] = encode(x[r * K + k], s, acc.nonfinite);
      }
    }
  });
}

void fp8_dequantize_1x128(float* out, const uint8_t* q, const float* scale, int64_t R, int64_t K) {
  const int64_t KB = blocks(K);
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) out[r * K + k] = fp8_e4m3_decode(q[r * K + k]) * scale[r * KB + k / kFp8Block];
  });
}

void fp8_dequantize_128x128(float* out, const uint8_t* q, const float* scale, int64_t R, int64_t K) {
  const int64_t KB = blocks(K);
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k)
        out[r * K + k] = fp8_e4m3_decode(q[r * K + k]) * scale[(r / kFp8Block) * KB + k / kFp8Block];
  });
}

namespace {

// Q1 along K of x[R, K] (strided view as fp8_quantize_1x128), dequantized.
std::vector<float> qdq_1x128(const float* x, int64_t R, int64_t K, int64_t row_stride, int64_t col_stride) {
  std::vector<uint8_t> q(static_cast<size_t>(R * K));
  std::vector<float> s(static_cast<size_t>(R * blocks(K))), out(static_cast<size_t>(R * K));
  fp8_quantize_1x128(q.data(), s.data(), x, R, K, row_stride, col_stride);
  fp8_dequantize_1x128(out.data(), q.data(), s.data(), R, K);
  return out;
}
std::vector<float> qdq_128x128(const float* x, int64_t R, int64_t K) {
  std::vector<uint8_t> q(static_cast<size_t>(R * K));
  std::vector<float> s(static_cast<size_t>(blocks(R) * blocks(K))), out(static_cast<size_t>(R * K));
  fp8_quantize_128x128(q.data(), s.data(), x, R, K);
  fp8_dequantize_128x128(out.data(), q.data(), s.data(), R, K);
  return out;
}

}  // namespace

void fp8_linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                        int64_t O) {
  const auto xq = qdq_1x128(x, N, I, I, 1);  // x[N, I] along I
  const auto wq = qdq_128x128(w, O, I);      // w[O, I]
  linear_forward(out, xq.data(), wq.data(), bias, N, I, O);
}

void fp8_linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                         int64_t N, int64_t I, int64_t O) {
  if (dx) {
    const auto dyq = qdq_1x128(dout, N, O, O, 1);  // dout[N, O] along O
    const auto wq = qdq_128x128(w, O, I);          // the forward's codes: 128x128 blocks are their own transpose's
    matmul_nn(dx, dyq.data(), wq.data(), N, I, O);
  }
  if (dw) {
    const auto dytq = qdq_1x128(dout, O, N, 1, O);  // dout^T[O, N] along N
    const auto xtq = qdq_1x128(x, I, N, 1, I);      // x^T[I, N] along N
    matmul_nt(dw, dytq.data(), xtq.data(), O, I, N, 1.f);
  }
  if (dbias) linear_backward(nullptr, nullptr, dbias, dout, x, w, N, I, O);
}

float fp8_quantize_tensor(uint8_t* q, const float* x, int64_t R, int64_t K, int64_t row_stride, int64_t col_stride) {
  RT_CHECK(R >= 0 && K >= 0, "[cpu/fp8_quantize_tensor] negative shape ", R, " x ", K);
  // per-row amax, then the max over rows: max is exact and order-free, so
  // the result does not depend on the thread count
  std::vector<AmaxAcc> rows(static_cast<size_t>(R));
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) rows[r].add(x[r * row_stride + k * col_stride]);
  });
  AmaxAcc acc;
  for (const AmaxAcc& a : rows) {
    acc.nonfinite = acc.nonfinite || a.nonfinite;
    acc.amax = std::max(acc.amax, a.amax);
  }
  const Fp8Scale s = fp8_block_scale(acc.amax, acc.nonfinite);
  parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) q[r * K + k] = encode(x[r * row_stride + k * col_stride], s, acc.nonfinite);
  });
  return s.scale;
}

void fp8_dequantize_tensor(float* out, const uint8_t* q, float scale, int64_t n) {
  parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = fp8_e4m3_decode(q[i]) * scale;
  });
}

namespace {
// Qt of a row-major tensor x[R, K], dequantized.
std::vector<float> qdq_tensor(const float* x, int64_t R, int64_t K) {
  const int64_t n = R * K;
  std::vector<uint8_t> q(static_cast<size_t>(n));
  std::vector<float> out(static_cast<size_t>(n));
  const float s = fp8_quantize_tensor(q.data(), x, R, K, K, 1);
  fp8_dequantize_tensor(out.data(), q.data(), s, n);
  return out;
}
}  // namespace

void fp8_tensor_linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                               int64_t O) {
  const auto xq = qdq_tensor(x, N, I), wq = qdq_tensor(w, O, I);
  linear_forward(out, xq.data(), wq.data(), bias, N, I, O);
}

void fp8_tensor_linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                                int64_t N, int64_t I, int64_t O) {
  if (dx || dw) {
    const auto dyq = qdq_tensor(dout, N, O);
    if (dx) {
      const auto wq = qdq_tensor(w, O, I);
      matmul_nn(dx, dyq.data(), wq.data(), N, I, O);
    }
    if (dw) {
      const auto xq = qdq_tensor(x, N, I);
      matmul_tn(dw, dyq.data(), xq.data(), O, I, N, 1.f);  // dw[O, I] += dy^T[O, N] x[N, I]
    }
  }
  if (dbias) linear_backward(nullptr, nullptr, dbias, dout, x, w, N, I, O);
}

}  // namespace rt::cpu
