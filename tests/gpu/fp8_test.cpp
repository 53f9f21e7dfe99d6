// The CUDA FP8 path (cuda/fp8.h) against its CPU twin (cpu/fp8.h):
// - quantizers bit for bit: codes and scales of the 1x128 (row-major and
//   transposed reads) and 128x128 (with the transposed copy) quantizers, on
//   shapes with tails in every dimension and data holding every finite bf16
//   value (so CUDA's e4m3 conversion is checked against the twin's encoder on
//   each of them, times many power-of-two scales), plus a tile with an Inf;
//   the layouts' padding is zero.
// - the FP8 linear (forward, dgrad, wgrad, dbias) against the twin's, which
//   quantizes the same bits and sums exact products in fp32. What may differ:
//   the GPU's summation order and the precision of its FP8 accumulator
//   (Hopper's FP8 MMA keeps fewer than fp32's bits inside one K chunk;
//   cuBLASLt promotes to fp32 between chunks when fast accumulation is off),
//   bounded here by 2^-12 * sum_k |qa_k qb_k| per element (DeepSeek-V3
//   measured about 14 retained bits; 2^-12 leaves a factor 4), plus the bf16
//   rounding of bf16 outputs (<= 2^-9 |ref|, two roundings with a bias), plus
//   2^-22 |ref| for the fp32 add into a prefilled dw.
// - per-tensor scaling (--fp8-scaling tensor): the amax + quantizer (codes and
//   transposed codes, made together or apart) == cpu::fp8_quantize_tensor bit
//   for bit, scale included, on every bf16 value of a range, wide-spread data,
//   tails of the 64 x 64 tiles, and zero / Inf / NaN tensors; the per-tensor
//   linear within the same accumulation bound of its twin (why the same bound:
//   at expect_gemm_bound); shared inputs and weights give the same bits; the
//   amaxes RMSNorm's and SwiGLU's kernels make as they write (the taps) are
//   the amax pass's, bit for bit.
// Skips without a CUDA device; the GEMM tests skip where fp8_supported says
// the card does not run that scaling (block: sm_90; per-tensor: sm_89, sm_90).
#include <gtest/gtest.h>

#ifdef RAMTRAIN_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/fp8.h"
#include "cpu/ops.h"
#include "cuda/device_info.h"
#include "cuda/fp8.h"
#include "device_buffer.h"
#include "testutil.h"

namespace {

using namespace rt::gputest;
using rt::cuda::bf16;
using Vec = std::vector<float>;

// GTEST_SKIP returns from the function it is in: each test skips itself with
// this macro (a helper function that skipped would let the test body run on).
#define RT_REQUIRE_DEVICE()                                                                     \
  do {                                                                                          \
    if (rt::cuda::device_count() == 0)                                                          \
      GTEST_SKIP() << "no CUDA device: the FP8 path is tested on a GPU machine";                \
  } while (0)

// Every finite bf16 value (sign, exponent, mantissa) once, shuffled, then
// random values with a wide spread of magnitudes, all bf16; n values.
Vec bf16_values(int64_t n, uint64_t seed) {
  Vec v;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = rt::bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isfinite(f)) v.push_back(f);
  }
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> e(-20, 20);
  while (static_cast<int64_t>(v.size()) < n) v.push_back(std::ldexp(u(rng), e(rng)));
  v.resize(static_cast<size_t>(n));
  return round_bf16(v);
}

std::vector<uint8_t> download_u8(const DeviceBuffer& d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d.data(), h.size(), cudaMemcpyDeviceToHost));
  return h;
}

// First index where two code arrays differ, as a message (empty: equal).
std::string first_diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref, const Vec& src) {
  for (size_t i = 0; i < ref.size(); ++i)
    if (got[i] != ref[i])
      return "code " + std::to_string(i) + ": cuda " + std::to_string(got[i]) + " vs cpu " + std::to_string(ref[i]) +
             (i < src.size() ? " (source value " + std::to_string(src[i]) + ")" : "");
  return "";
}

// GPU 1x128 scales [KB][Rp] == CPU [R][KB], padding zero (bitwise compare: NaN scales too).
void expect_scales_1x128(const Vec& gpu, const Vec& cpu, int64_t R, int64_t K) {
  const int64_t KB = rt::cuda::fp8_blocks(K), Rp = rt::cuda::fp8_round4(R);
  for (int64_t kb = 0; kb < KB; ++kb)
    for (int64_t r = 0; r < Rp; ++r) {
      const float want = r < R ? cpu[r * KB + kb] : 0.f;
      ASSERT_EQ(std::memcmp(&gpu[kb * Rp + r], &want, 4), 0)
          << "scale row " << r << " tile " << kb << ": " << gpu[kb * Rp + r] << " vs " << want;
    }
}

void check_1x128(int64_t R, int64_t K, bool transposed) {
  // source: x[R, K] row-major, or x[K, R] read as its transpose
  Vec x = bf16_values(R * K, 100 + R + K);
  x[5] = std::numeric_limits<float>::infinity();  // one tile of NaN codes
  auto dx = upload_bf16(x);
  DeviceBuffer q(R * K), s(rt::cuda::fp8_scales_1x128(R, K) * 4);
  q.poison();
  s.poison();
  rt::cuda::fp8_quantize_1x128(q.as<uint8_t>(), s.as<float>(), dx->as<bf16>(), R, K, transposed, nullptr);
  std::vector<uint8_t> q_ref(R * K);
  Vec s_ref(R * rt::cuda::fp8_blocks(K));
  rt::cpu::fp8_quantize_1x128(q_ref.data(), s_ref.data(), x.data(), R, K, transposed ? 1 : K, transposed ? R : 1);
  const auto q_got = download_u8(q, R * K);
  const std::string d = first_diff(q_got, q_ref, {});
  EXPECT_TRUE(d.empty()) << (transposed ? "transposed " : "") << R << "x" << K << ": " << d;
  expect_scales_1x128(download_f32(s, rt::cuda::fp8_scales_1x128(R, K)), s_ref, R, K);
}

TEST(CudaFp8, Quantize1x128MatchesTheTwinBitForBit) {
  RT_REQUIRE_DEVICE();
  check_1x128(1027, 400, false);  // every finite bf16 value; rows not a multiple of 4, K tail of 16
  check_1x128(37, 132, false);
  check_1x128(1027, 400, true);
  check_1x128(45, 260, true);
}

TEST(CudaFp8, Quantize128x128MatchesTheTwinBitForBit) {
  RT_REQUIRE_DEVICE();
  for (auto [R, K] : {std::pair<int64_t, int64_t>{200, 336}, {640, 128}, {272, 520}}) {
    Vec w = bf16_values(R * K, 7 + R);
    w[R * K - 1] = -std::numeric_limits<float>::infinity();
    auto dw = upload_bf16(w);
    DeviceBuffer q(R * K), qt(R * K), s(rt::cuda::fp8_scales_128x128(R, K) * 4),
        st(rt::cuda::fp8_scales_128x128(K, R) * 4);
    q.poison();
    qt.poison();
    rt::cuda::fp8_quantize_128x128(q.as<uint8_t>(), s.as<float>(), qt.as<uint8_t>(), st.as<float>(), dw->as<bf16>(),
                                   R, K, nullptr);
    const int64_t RB = rt::cuda::fp8_blocks(R), KB = rt::cuda::fp8_blocks(K);
    std::vector<uint8_t> q_ref(R * K);
    Vec s_ref(RB * KB);
    rt::cpu::fp8_quantize_128x128(q_ref.data(), s_ref.data(), w.data(), R, K);
    const auto q_got = download_u8(q, R * K), qt_got = download_u8(qt, R * K);
    EXPECT_TRUE(first_diff(q_got, q_ref, w).empty()) << R << "x" << K << ": " << first_diff(q_got, q_ref, w);
    std::vector<uint8_t> qt_ref(R * K);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) qt_ref[k * R + r] = q_ref[r * K + k];
    EXPECT_TRUE(first_diff(qt_got, qt_ref, {}).empty()) << "transposed codes: " << first_diff(qt_got, qt_ref, {});
    const Vec sg = download_f32(s, rt::cuda::fp8_scales_128x128(R, K)),
              stg = download_f32(st, rt::cuda::fp8_scales_128x128(K, R));
    const int64_t KBp = rt::cuda::fp8_round4(KB), RBp = rt::cuda::fp8_round4(RB);
    for (int64_t rb = 0; rb < RB; ++rb)
      for (int64_t kb = 0; kb < KBp; ++kb) {
        const float want = kb < KB ? s_ref[rb * KB + kb] : 0.f;
        ASSERT_EQ(std::memcmp(&sg[rb * KBp + kb], &want, 4), 0) << "block " << rb << "," << kb;
      }
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int64_t rb = 0; rb < RBp; ++rb) {
        const float want = rb < RB ? s_ref[rb * KB + kb] : 0.f;
        ASSERT_EQ(std::memcmp(&stg[kb * RBp + rb], &want, 4), 0) << "transposed block " << kb << "," << rb;
      }
  }
}

// Quantize-dequantize on the CPU (the twin's) for the abs-sum of the bound.
Vec qdq_1x128(const Vec& x, int64_t R, int64_t K, int64_t rs, int64_t cs) {
  std::vector<uint8_t> q(R * K);
  Vec s(R * rt::cuda::fp8_blocks(K)), out(R * K);
  rt::cpu::fp8_quantize_1x128(q.data(), s.data(), x.data(), R, K, rs, cs);
  rt::cpu::fp8_dequantize_1x128(out.data(), q.data(), s.data(), R, K);
  return out;
}
Vec qdq_128x128(const Vec& x, int64_t R, int64_t K) {
  std::vector<uint8_t> q(R * K);
  Vec s(rt::cuda::fp8_blocks(R) * rt::cuda::fp8_blocks(K)), out(R * K);
  rt::cpu::fp8_quantize_128x128(q.data(), s.data(), x.data(), R, K);
  rt::cpu::fp8_dequantize_128x128(out.data(), q.data(), s.data(), R, K);
  return out;
}
Vec abs_of(Vec v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// |got - ref| <= 2^-10 * abs_sum + rel * (|ref| + extra) elementwise. The
// first term is the FP8 tensor cores' accumulation: Hopper's FP8 MMA sums
// each K-chunk in a fixed-point format aligned to the chunk's largest product
// that keeps about 14 bits (DeepSeek-V3 section 3.3.2), and cuBLASLt promotes
// to fp32 between chunks; measured on the H100 (2026-12-05): worst
// 2^-11.8 * sum |a_k b_k| (the first bound, 2^-12, failed by 2%); 2^-10 leaves
// 3.5x and still catches a wrong scale block (an error of order |ref|, which
// is sqrt(K) times larger than 2^-10 sum |a b| for these random operands).
// Per-tensor scaling: cuBLASLt sums the products of the codes in the same
// FP8 MMA with the same fp32 promotion (fast accumulation stays off) and
// multiplies the sum by the two power-of-two scales (exact), so the error
// relative to sum |qa qb| is the same accumulation error and the same bound
// holds (its sum is over the dequantized values, which the exact scaling
// maps one-to-one onto the codes' sum).
void expect_gemm_bound(const std::string& name, const Vec& got, const Vec& ref, const Vec& abs_sum, double rel,
                       const Vec& extra = {}) {
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound =
        std::ldexp(abs_sum[i], -10) + rel * (std::fabs(ref[i]) + (extra.empty() ? 0.0 : extra[i])) + 1e-30;
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    ASSERT_TRUE(err <= bound) << name << " element " << i << ": cuda " << got[i] << " vs twin " << ref[i]
                              << " (bound " << bound << ")";
    worst = std::max(worst, err / bound);
  }
  std::printf("%s: worst |cuda - twin| / bound = %.3f\n", name.c_str(), worst);
}

Vec qdq_tensor(const Vec& x, int64_t R, int64_t K) {
  std::vector<uint8_t> q(R * K);
  Vec out(R * K);
  const float s = rt::cpu::fp8_quantize_tensor(q.data(), x.data(), R, K, K, 1);
  rt::cpu::fp8_dequantize_tensor(out.data(), q.data(), s, R * K);
  return out;
}
Vec transposed(const Vec& x, int64_t R, int64_t K) {
  Vec t(R * K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) t[k * R + r] = x[r * K + k];
  return t;
}

void check_linear(int64_t N, int64_t I, int64_t O, rt::MatmulMode mode = rt::MatmulMode::fp8) {
  const bool tensor = mode == rt::MatmulMode::fp8_tensor;
  {
    const std::string shape = std::to_string(N) + "x" + std::to_string(I) + "x" + std::to_string(O);
    const Vec x = round_bf16(rt::test::random_vec(N * I, 1)), w = round_bf16(rt::test::random_vec(O * I, 2, -.1f, .1f));
    const Vec b = round_bf16(rt::test::random_vec(O, 3)), dy = round_bf16(rt::test::random_vec(N * O, 4));
    auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_b = upload_bf16(b), d_dy = upload_bf16(dy);
    DeviceBuffer d_y(N * O * 2), d_dx(N * I * 2);
    const Vec dw0 = rt::test::random_vec(O * I, 5), db0 = rt::test::random_vec(O, 6);
    auto d_dw = upload_f32(dw0), d_db = upload_f32(db0);
    rt::cuda::Fp8Linear lin(mode);
    lin.forward(d_y.as<bf16>(), d_x->as<bf16>(), d_w->as<bf16>(), d_b->as<bf16>(), N, I, O, nullptr);
    lin.backward(d_dx.as<bf16>(), d_dw->as<float>(), d_db->as<float>(), d_dy->as<bf16>(), d_x->as<bf16>(),
                 d_w->as<bf16>(), N, I, O, nullptr);
    Vec y(N * O), dx(N * I), dw(dw0), db(db0);
    if (tensor) {
      rt::cpu::fp8_tensor_linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
      rt::cpu::fp8_tensor_linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O);
    } else {
      rt::cpu::fp8_linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
      rt::cpu::fp8_linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O);
    }

    const Vec xq = abs_of(tensor ? qdq_tensor(x, N, I) : qdq_1x128(x, N, I, I, 1));
    const Vec wq = abs_of(tensor ? qdq_tensor(w, O, I) : qdq_128x128(w, O, I));
    const Vec dyq = abs_of(tensor ? qdq_tensor(dy, N, O) : qdq_1x128(dy, N, O, O, 1));
    const Vec dytq = tensor ? transposed(dyq, N, O) : abs_of(qdq_1x128(dy, O, N, 1, O));
    const Vec xtq = tensor ? transposed(xq, N, I) : abs_of(qdq_1x128(x, I, N, 1, I));
    Vec sy(N * O), sdx(N * I), sdw(O * I);
    rt::cpu::matmul_nt(sy.data(), xq.data(), wq.data(), N, O, I);
    rt::cpu::matmul_nn(sdx.data(), dyq.data(), wq.data(), N, I, O);
    rt::cpu::matmul_nt(sdw.data(), dytq.data(), xtq.data(), O, I, N);
    // y: two bf16 roundings, of the GEMM's value (|ref - b| at most |ref| + |b|
    // away) and of the sum with the bias; dx: one; dw: the fp32 add into dw0
    Vec yb(N * O);
    for (int64_t i = 0; i < N * O; ++i) yb[i] = std::fabs(y[i]) + 2 * std::fabs(b[i % O]);
    const std::string shape_mode = shape + (tensor ? " tensor" : "");
    expect_gemm_bound("y " + shape_mode, download_bf16(d_y, N * O), y, sy, std::ldexp(1.0, -9), yb);
    expect_gemm_bound("dx " + shape_mode, download_bf16(d_dx, N * I), dx, sdx, std::ldexp(1.0, -9));
    expect_gemm_bound("dw " + shape_mode, download_f32(*d_dw, O * I), dw, sdw, std::ldexp(1.0, -22));
    // db: an fp32 running sum of the same N bf16 values (error <= N 2^-24 sum |dy|)
    // vs the twin's double sum, each added into db0 (one more rounding each)
    const Vec db_got = download_f32(*d_db, O);
    for (int64_t o = 0; o < O; ++o) {
      double abs_sum = 0;
      for (int64_t n = 0; n < N; ++n) abs_sum += std::fabs(dy[n * O + o]);
      EXPECT_NEAR(db_got[o], db[o], std::ldexp(N * abs_sum + 2 * std::fabs(db[o]) + 2 * abs_sum, -24)) << "db " << o;
    }
  }
}

// Every dimension a multiple of 128 (Qwen2.5-7B's projections are).
TEST(CudaFp8, LinearMatchesTheTwinWithinTheAccumulationBound) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8, &why)) GTEST_SKIP() << why;
  check_linear(256, 384, 512);
  check_linear(384, 128, 256);
}

// Dimensions that are multiples of 16 but not of 128 (tiny-byte's F = 704):
// tails in each GEMM's reduction dim. Should this fail with "no FP8
// algorithm", cuBLASLt wants multiples of 128 and fp8_linear_eligible must say so.
TEST(CudaFp8, LinearWithTailsMatchesTheTwin) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8, &why)) GTEST_SKIP() << why;
  check_linear(256, 384, 320);
  check_linear(272, 208, 704);
}

// share_input (q/k/v read one input) and share_weights (layer-major: one
// layer's weights for K micro-batches): the same bits as quantizing per call,
// forward, input gradient and weight gradient, with a second projection of
// another width and a second "micro-batch".
void check_shared_bits(rt::MatmulMode mode) {
  const int64_t N = 256, I = 384, O1 = 512, O2 = 128;
  const Vec x = round_bf16(rt::test::random_vec(N * I, 1)), w1 = round_bf16(rt::test::random_vec(O1 * I, 2, -.1f, .1f)),
            w2 = round_bf16(rt::test::random_vec(O2 * I, 3, -.1f, .1f)),
            x2 = round_bf16(rt::test::random_vec(N * I, 6));
  const Vec dy1 = round_bf16(rt::test::random_vec(N * O1, 4)), dy2 = round_bf16(rt::test::random_vec(N * O2, 5));
  auto d_x = upload_bf16(x), d_x2 = upload_bf16(x2), d_w1 = upload_bf16(w1), d_w2 = upload_bf16(w2),
       d_dy1 = upload_bf16(dy1), d_dy2 = upload_bf16(dy2);
  auto run = [&](bool share_x, bool share_w) {
    DeviceBuffer y1(N * O1 * 2), y2(N * O2 * 2), y3(N * O1 * 2), dx1(N * I * 2), dx2(N * I * 2);
    const Vec zero1(O1 * I, 0.f), zero2(O2 * I, 0.f);
    auto dw1 = upload_f32(zero1), dw2 = upload_f32(zero2);
    rt::cuda::Fp8Linear lin(mode);
    if (share_w) lin.share_weights();
    if (share_x) lin.share_input(d_x->as<bf16>(), N, I);
    lin.forward(y1.as<bf16>(), d_x->as<bf16>(), d_w1->as<bf16>(), nullptr, N, I, O1, nullptr);
    lin.forward(y2.as<bf16>(), d_x->as<bf16>(), d_w2->as<bf16>(), nullptr, N, I, O2, nullptr);
    lin.backward(dx1.as<bf16>(), dw1->as<float>(), nullptr, d_dy1->as<bf16>(), d_x->as<bf16>(), d_w1->as<bf16>(), N, I,
                 O1, nullptr);
    lin.backward(dx2.as<bf16>(), dw2->as<float>(), nullptr, d_dy2->as<bf16>(), d_x->as<bf16>(), d_w2->as<bf16>(), N, I,
                 O2, nullptr);
    if (share_x) lin.end_share();
    // the next micro-batch: another input through the same (shared) weights
    lin.forward(y3.as<bf16>(), d_x2->as<bf16>(), d_w1->as<bf16>(), nullptr, N, I, O1, nullptr);
    if (share_w) lin.end_share_weights();
    return std::vector<Vec>{download_bf16(y1, N * O1), download_bf16(y2, N * O2), download_bf16(y3, N * O1),
                            download_bf16(dx1, N * I), download_bf16(dx2, N * I), download_f32(*dw1, O1 * I),
                            download_f32(*dw2, O2 * I)};
  };
  const auto a = run(false, false);
  for (auto [sx, sw] : {std::pair{true, false}, {false, true}, {true, true}}) {
    const auto b = run(sx, sw);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].size(), b[i].size());
      EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
          << "output " << i << " (share input " << sx << ", weights " << sw << ")";
    }
  }
}

TEST(CudaFp8, SharedInputsAndWeightsGiveTheSameBits) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8, &why)) GTEST_SKIP() << why;
  check_shared_bits(rt::MatmulMode::fp8);
}

// ---- per-tensor scaling ----

// x[R, C] through fp8_quantize_tensor (codes and transposed codes in one
// pass), and through fp8_tensor_amax + fp8_tensor_codes making each apart,
// against the twin: codes, transposed codes and the slot's scale bit for bit.
void check_tensor(const Vec& x, int64_t R, int64_t C, const std::string& what) {
  auto d_x = upload_bf16(x);
  std::vector<uint8_t> q_ref(R * C), qt_ref(R * C);
  const float s_ref = rt::cpu::fp8_quantize_tensor(q_ref.data(), x.data(), R, C, C, 1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) qt_ref[c * R + r] = q_ref[r * C + c];
  for (int apart = 0; apart < 2; ++apart) {
    DeviceBuffer q(R * C), qt(R * C), slot(rt::cuda::kFp8TensorSlot);
    q.poison();
    qt.poison();
    slot.poison();
    if (apart) {
      rt::cuda::fp8_tensor_amax(slot.as<float>(), d_x->as<bf16>(), R * C, nullptr);
      rt::cuda::fp8_tensor_codes(nullptr, qt.as<uint8_t>(), slot.as<float>(), d_x->as<bf16>(), R, C, nullptr);
      rt::cuda::fp8_tensor_codes(q.as<uint8_t>(), nullptr, slot.as<float>(), d_x->as<bf16>(), R, C, nullptr);
    } else {
      rt::cuda::fp8_quantize_tensor(q.as<uint8_t>(), qt.as<uint8_t>(), slot.as<float>(), d_x->as<bf16>(), R, C,
                                    nullptr);
    }
    const std::string name = what + " " + std::to_string(R) + "x" + std::to_string(C) + (apart ? " (apart)" : "");
    const auto q_got = download_u8(q, R * C), qt_got = download_u8(qt, R * C);
    EXPECT_TRUE(first_diff(q_got, q_ref, x).empty()) << name << ": " << first_diff(q_got, q_ref, x);
    EXPECT_TRUE(first_diff(qt_got, qt_ref, {}).empty()) << name << " transposed: " << first_diff(qt_got, qt_ref, {});
    const float s_got = download_f32(slot, 1)[0];
    EXPECT_EQ(std::memcmp(&s_got, &s_ref, 4), 0) << name << ": scale " << s_got << " vs twin " << s_ref;
  }
}

TEST(CudaFp8, TensorQuantizerMatchesTheTwinBitForBit) {
  RT_REQUIRE_DEVICE();
  // every finite bf16 value (amax ~3.4e38: most codes 0, the largest exercised)
  check_tensor(bf16_values(272 * 336, 21), 272, 336, "every bf16");  // 64-tiles with tails of 16 in both dims
  // every bf16 value with |v| in [2^-20, 2^9): each one encoded at one scale (amax < 512)
  Vec range;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = rt::bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isfinite(f) && std::fabs(f) >= std::ldexp(1.f, -20) && std::fabs(f) < 512.f) range.push_back(f);
  }
  range.resize(64 * 128, 0.f);  // 2 x 29 x 128 = 7424 values, zero-padded
  check_tensor(range, 64, 128, "bf16 range");
  // magnitudes 2^-20..2^20 (the small ones in e4m3's subnormals or flushed to 0)
  Vec spread = rt::test::random_vec(1028 * 72, 22);
  std::mt19937_64 rng(22);
  std::uniform_int_distribution<int> e(-20, 20);
  for (float& v : spread) v = std::ldexp(v, e(rng));
  check_tensor(round_bf16(spread), 1028, 72, "spread");
  check_tensor(Vec(64 * 64, 0.f), 64, 64, "zero");
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Vec x = round_bf16(rt::test::random_vec(128 * 48, 23));
    x[777] = bad;
    check_tensor(x, 128, 48, std::isnan(bad) ? "NaN" : "Inf");
  }
}

TEST(CudaFp8, TensorLinearMatchesTheTwinWithinTheAccumulationBound) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8_tensor, &why)) GTEST_SKIP() << why;
  check_linear(256, 384, 512, rt::MatmulMode::fp8_tensor);
  check_linear(384, 128, 256, rt::MatmulMode::fp8_tensor);
  check_linear(272, 208, 704, rt::MatmulMode::fp8_tensor);  // not multiples of 64 or 128
}

TEST(CudaFp8, TensorSharedInputsAndWeightsGiveTheSameBits) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8_tensor, &why)) GTEST_SKIP() << why;
  check_shared_bits(rt::MatmulMode::fp8_tensor);
}

// ---- per-tensor amaxes made by the producers (CudaOps::amax_tap) ----

uint32_t slot_key(const DeviceBuffer& slot) {
  CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t k[2];
  CUDA_CHECK(cudaMemcpy(k, slot.data(), sizeof k, cudaMemcpyDeviceToHost));
  return k[1];
}
// fp8_tensor_amax's key over y[n]: what the producer's key must equal.
uint32_t amax_pass_key(const DeviceBuffer& y, int64_t n) {
  DeviceBuffer slot(rt::cuda::kFp8TensorSlot);
  rt::cuda::fp8_tensor_amax(slot.as<float>(), y.as<bf16>(), n, nullptr);
  return slot_key(slot);
}
bool same_bytes(const DeviceBuffer& a, const DeviceBuffer& b, size_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> ha(bytes), hb(bytes);
  CUDA_CHECK(cudaMemcpy(ha.data(), a.data(), bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hb.data(), b.data(), bytes, cudaMemcpyDeviceToHost));
  return ha == hb;
}
// Values of magnitude 2^-e_max..2^e_max, bf16, n of them; special: one Inf (1) or NaN (2) at index n / 3.
Vec spread_values(int64_t n, uint64_t seed, int e_max, int special) {
  Vec v = rt::test::random_vec(n, seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> e(-e_max, e_max);
  for (float& x : v) x = std::ldexp(x, e(rng));
  if (special)
    v[static_cast<size_t>(n / 3)] =
        special == 1 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  return round_bf16(v);
}

// RMSNorm's forward and SwiGLU's forward and backward, given an amax key,
// commit the key of max |value| they wrote: fp8_tensor_amax's over their
// output, bit for bit, with an Inf or a NaN among the inputs too; their outputs
// are the keyless launch's. Shapes with tails: 203 rows (the norm's blocks
// hold 8), 136 columns (a warp's stride is 256), and 1.3M SwiGLU values (more
// than the keyed launch's 4096 blocks of 256 cover in one pass).
TEST(CudaFp8, ProducersCommitTheAmaxOfWhatTheyWrite) {
  RT_REQUIRE_DEVICE();
  namespace cu = rt::cuda;
  for (int special = 0; special < 3; ++special) {
    const std::string tag = special == 0 ? "finite" : special == 1 ? "an Inf" : "a NaN";
    {
      const int64_t N = 203, C = 136;
      auto x = upload_bf16(spread_values(N * C, 41, 12, special));
      auto w = upload_bf16(spread_values(C, 42, 2, 0));
      DeviceBuffer y1(N * C * 2), y2(N * C * 2), rstd(N * 4), slot(cu::kFp8TensorSlot);
      CUDA_CHECK(cudaMemset(slot.data(), 0, cu::kFp8TensorSlot));
      cu::rms_norm_forward(y1.as<bf16>(), rstd.as<float>(), x->as<bf16>(), w->as<bf16>(), N, C, 1e-5f, nullptr);
      cu::rms_norm_forward(y2.as<bf16>(), rstd.as<float>(), x->as<bf16>(), w->as<bf16>(), N, C, 1e-5f, nullptr, 0.f,
                           slot.as<uint32_t>() + 1);
      EXPECT_TRUE(same_bytes(y1, y2, N * C * 2)) << "rms_norm_forward, " << tag;
      const uint32_t want = amax_pass_key(y1, N * C);
      EXPECT_NE(want, 0u);
      EXPECT_EQ(slot_key(slot), want) << "rms_norm_forward, " << tag;
    }
    {
      const int64_t n = 1'300'003;
      auto g = upload_bf16(spread_values(n, 43, 4, special)), u = upload_bf16(spread_values(n, 44, 4, 0)),
           dy = upload_bf16(spread_values(n, 45, 6, 0));
      DeviceBuffer a1(n * 2), a2(n * 2), dg1(n * 2), dg2(n * 2), du1(n * 2), du2(n * 2);
      DeviceBuffer ka(cu::kFp8TensorSlot), kg(cu::kFp8TensorSlot), ku(cu::kFp8TensorSlot);
      for (auto* k : {&ka, &kg, &ku}) CUDA_CHECK(cudaMemset(k->data(), 0, cu::kFp8TensorSlot));
      cu::swiglu_forward(a1.as<bf16>(), g->as<bf16>(), u->as<bf16>(), n, nullptr);
      cu::swiglu_forward(a2.as<bf16>(), g->as<bf16>(), u->as<bf16>(), n, nullptr, ka.as<uint32_t>() + 1);
      cu::swiglu_backward(dg1.as<bf16>(), du1.as<bf16>(), dy->as<bf16>(), g->as<bf16>(), u->as<bf16>(), n, nullptr);
      cu::swiglu_backward(dg2.as<bf16>(), du2.as<bf16>(), dy->as<bf16>(), g->as<bf16>(), u->as<bf16>(), n, nullptr,
                          kg.as<uint32_t>() + 1, ku.as<uint32_t>() + 1);
      EXPECT_TRUE(same_bytes(a1, a2, n * 2)) << "swiglu_forward, " << tag;
      EXPECT_TRUE(same_bytes(dg1, dg2, n * 2)) << "swiglu_backward dgate, " << tag;
      EXPECT_TRUE(same_bytes(du1, du2, n * 2)) << "swiglu_backward dup, " << tag;
      EXPECT_EQ(slot_key(ka), amax_pass_key(a1, n)) << "swiglu_forward, " << tag;
      EXPECT_EQ(slot_key(kg), amax_pass_key(dg1, n)) << "swiglu_backward dgate, " << tag;
      EXPECT_EQ(slot_key(ku), amax_pass_key(du1, n)) << "swiglu_backward dup, " << tag;
      if (special) {
        EXPECT_GE(slot_key(ka), 0x7F800000u) << "a non-finite gate must give a non-finite key";
      }
    }
  }
}

// Fp8Linear's taps: none for block scales; a producer's key only for the
// tapped tensor and size, once (a second write closes the tap); a closed or
// ended tap gives none; at most kFp8Taps at once.
TEST(CudaFp8, TapsKeyOnlyTheFirstWriteOfTheTappedTensor) {
  RT_REQUIRE_DEVICE();
  namespace cu = rt::cuda;
  DeviceBuffer x(1024), z(1024);
  const bf16* p = x.as<bf16>();
  {
    cu::Fp8Linear block(rt::MatmulMode::fp8);
    EXPECT_EQ(block.tap_begin(p, 512, nullptr), -1);
  }
  cu::Fp8Linear lin(rt::MatmulMode::fp8_tensor);
  const int t = lin.tap_begin(p, 512, nullptr);
  ASSERT_GE(t, 0);
  EXPECT_EQ(lin.tap_key(p, 256), nullptr);             // another size
  EXPECT_EQ(lin.tap_key(z.as<bf16>(), 512), nullptr);  // another tensor
  EXPECT_NE(lin.tap_key(p, 512), nullptr);
  EXPECT_EQ(lin.tap_key(p, 512), nullptr);  // the second write closes it
  lin.tap_end(t);
  const int t2 = lin.tap_begin(p, 512, nullptr);
  ASSERT_GE(t2, 0);
  lin.tap_end(t2);
  EXPECT_EQ(lin.tap_key(p, 512), nullptr);  // ended
  std::vector<int> open;
  for (int i = 0; i < cu::Fp8Linear::kFp8Taps; ++i) open.push_back(lin.tap_begin(p, 512, nullptr));
  for (int i : open) EXPECT_GE(i, 0);
  EXPECT_EQ(lin.tap_begin(p, 512, nullptr), -1);  // all taken: the caller falls back to the amax pass
  for (int i : open) lin.tap_end(i);
}

TEST(CudaFp8, TensorGemmRefusesMixedScaling) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8_tensor, &why)) GTEST_SKIP() << why;
  rt::cuda::Fp8Gemm g;
  EXPECT_THROW(g.matmul(nullptr, rt::cuda::DType::bf16, nullptr, nullptr, rt::cuda::Fp8Scaling::tensor, nullptr,
                        nullptr, rt::cuda::Fp8Scaling::vec128, 16, 16, 16, 0.f, nullptr),
               rt::Error);
  EXPECT_EQ(g.plans_cached(), 0u);
}

TEST(CudaFp8, GemmCachesPlansAndRefusesBadShapes) {
  RT_REQUIRE_DEVICE();
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8, &why)) GTEST_SKIP() << why;
  rt::cuda::Fp8Gemm g;
  EXPECT_THROW(g.matmul(nullptr, rt::cuda::DType::bf16, nullptr, nullptr, rt::cuda::Fp8Scaling::vec128, nullptr,
                        nullptr, rt::cuda::Fp8Scaling::vec128, 16, 24, 16, 0.f, nullptr),
               rt::Error);  // N = 24 is not a multiple of 16
  EXPECT_THROW(g.matmul(nullptr, rt::cuda::DType::bf16, nullptr, nullptr, rt::cuda::Fp8Scaling::blk128x128, nullptr,
                        nullptr, rt::cuda::Fp8Scaling::blk128x128, 16, 16, 16, 0.f, nullptr),
               rt::Error);  // 2D x 2D
  EXPECT_EQ(g.plans_cached(), 0u);
}

}  // namespace

#else  // !RAMTRAIN_HAVE_CUDA

TEST(CudaFp8, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device: built without the CUDA backend (RAMTRAIN_CUDA=OFF)"; }

#endif
