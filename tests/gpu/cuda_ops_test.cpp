// CUDA ops (src/cuda/ops.h) against the CPU reference (src/cpu/ops.h), every
// op forward and backward, on random non-zero inputs. Inputs are drawn in
// fp32 and rounded through bf16 once; both sides see exactly those values, so
// the differences measured are the CUDA side's own roundings (bf16 outputs,
// bf16 intermediates such as P and dlogits) and fp32 summation order.
//
// Tolerances, per tensor (u = 2^-8 = 0.0039, the bf16 rounding step relative
// to a value; RNE makes each rounding <= u/2):
//  - fp32 results of exact bf16 products with fp32 sums on both sides (dW,
//    dtable, rstd, logits/loss): rel_l2 <= 1e-5, only summation order differs.
//  - one final bf16 rounding of an fp32 result (GEMM out, norm, rope, swiglu):
//    elementwise |err| <= u*|ref| + small atol, or rel_l2 <= 4e-3 where the
//    result is a sum (rounding can cross a boundary, still <= u).
//  - chains with bf16 intermediates (attention P/dS, CE dlogits, norm dx with
//    cancellation): rel_l2 <= 1e-2 and max |err| <= 5e-2 * max |ref|.
// Without a CUDA device every test skips; without CUDA at build time this
// file holds one test that skips.
#include <gtest/gtest.h>

#ifdef RAMTRAIN_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "cuda/check.h"
#include "cuda/device_info.h"
#include "cuda/ops.h"
#include "device_buffer.h"
#include "testutil.h"

namespace {

using rt::cuda::bf16;
using rt::test::max_rel_to_scale;
using rt::test::random_vec;
using rt::test::rel_l2;
using namespace rt::gputest;

// Random values in [lo, hi) rounded to bf16, never exactly zero.
std::vector<float> random_bf16(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  auto v = round_bf16(random_vec(n, seed, lo, hi));
  for (float& x : v)
    if (x == 0.f) x = 0.0078125f;
  return v;
}

std::unique_ptr<DeviceBuffer> alloc_bf16(int64_t n) {
  auto d = std::make_unique<DeviceBuffer>(static_cast<size_t>(n) * 2);
  d->poison();
  return d;
}
std::unique_ptr<DeviceBuffer> alloc_f32(int64_t n) {
  auto d = std::make_unique<DeviceBuffer>(static_cast<size_t>(n) * 4);
  d->poison();
  return d;
}
constexpr double kU = 1.0 / 256;  // bf16 rounding step relative to the value

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (rt::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the CUDA ops are tested on a GPU machine";
  }
};

// ---------------------------------------------------------------- GEMM / linear

TEST_F(CudaOps, MatmulLayoutsMatchCpu) {
  rt::cuda::Blas blas;
  const int64_t M = 72, N = 48, K = 40;
  auto a_mk = random_bf16(M * K, 1), a_km = random_bf16(K * M, 2);
  auto b_nk = random_bf16(N * K, 3), b_kn = random_bf16(K * N, 4);
  auto init = random_vec(M * N, 5);
  auto d_amk = upload_bf16(a_mk), d_akm = upload_bf16(a_km), d_bnk = upload_bf16(b_nk), d_bkn = upload_bf16(b_kn);
  struct Case {
    const char* name;
    int layout;
  };
  for (Case c : {Case{"nt", 0}, Case{"nn", 1}, Case{"tn", 2}}) {
    for (float beta : {0.f, 1.f}) {
      std::vector<float> ref = beta != 0.f ? init : std::vector<float>(M * N, 0.f);
      if (c.layout == 0) rt::cpu::matmul_nt(ref.data(), a_mk.data(), b_nk.data(), M, N, K, beta);
      if (c.layout == 1) rt::cpu::matmul_nn(ref.data(), a_mk.data(), b_kn.data(), M, N, K, beta);
      if (c.layout == 2) rt::cpu::matmul_tn(ref.data(), a_km.data(), b_kn.data(), M, N, K, beta);
      auto out = beta != 0.f ? upload(init) : alloc_f32(M * N);
      const bf16* a = (c.layout == 2 ? d_akm : d_amk)->as<bf16>();
      const bf16* b = (c.layout == 0 ? d_bnk : d_bkn)->as<bf16>();
      if (c.layout == 0) blas.matmul_nt(out->as<float>(), rt::cuda::DType::f32, a, b, M, N, K, beta, nullptr);
      if (c.layout == 1) blas.matmul_nn(out->as<float>(), rt::cuda::DType::f32, a, b, M, N, K, beta, nullptr);
      if (c.layout == 2) blas.matmul_tn(out->as<float>(), rt::cuda::DType::f32, a, b, M, N, K, beta, nullptr);
      // fp32 out of exact bf16 products: only summation order differs.
      expect_close(std::string(c.name) + " f32 beta=" + std::to_string(beta), download_f32(*out, M * N), ref, 1e-5,
                   1e-5);
      if (beta == 0.f) {
        auto outb = alloc_bf16(M * N);
        if (c.layout == 0) blas.matmul_nt(outb->as<bf16>(), rt::cuda::DType::bf16, a, b, M, N, K, 0.f, nullptr);
        if (c.layout == 1) blas.matmul_nn(outb->as<bf16>(), rt::cuda::DType::bf16, a, b, M, N, K, 0.f, nullptr);
        if (c.layout == 2) blas.matmul_tn(outb->as<bf16>(), rt::cuda::DType::bf16, a, b, M, N, K, 0.f, nullptr);
        // one bf16 rounding of each output
        EXPECT_TRUE(rt::test::expect_near(std::string(c.name) + " bf16", download_bf16(*outb, M * N), ref, 1e-5, kU));
      }
    }
  }
  // plans are cached per shape: the same calls again build nothing new
  const size_t plans = blas.plans_cached();
  auto out = alloc_f32(M * N);
  blas.matmul_nt(out->as<float>(), rt::cuda::DType::f32, d_amk->as<bf16>(), d_bnk->as<bf16>(), M, N, K, 0.f, nullptr);
  EXPECT_EQ(blas.plans_cached(), plans);
}

TEST_F(CudaOps, LinearForwardBackwardMatchCpu) {
  rt::cuda::Blas blas;
  const int64_t N = 64, I = 96, O = 80;
  auto x = random_bf16(N * I, 10), w = random_bf16(O * I, 11), bias = random_bf16(O, 12);
  auto dout = random_bf16(N * O, 13);
  auto dw0 = random_vec(O * I, 14), db0 = random_vec(O, 15);
  std::vector<float> out_ref(N * O), dx_ref(N * I), dw_ref = dw0, db_ref = db0;
  rt::cpu::linear_forward(out_ref.data(), x.data(), w.data(), bias.data(), N, I, O);
  rt::cpu::linear_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), w.data(), N, I, O);

  auto dx_ = upload_bf16(x), dw_ = upload_bf16(w), dbias = upload_bf16(bias), ddout = upload_bf16(dout);
  auto out = alloc_bf16(N * O), out32 = alloc_f32(N * O), dx = alloc_bf16(N * I);
  auto dw = upload(dw0), db = upload(db0);
  rt::cuda::linear_forward(blas, out->as<bf16>(), rt::cuda::DType::bf16, dx_->as<bf16>(), dw_->as<bf16>(),
                           dbias->as<bf16>(), N, I, O, nullptr);
  rt::cuda::linear_forward(blas, out32->as<float>(), rt::cuda::DType::f32, dx_->as<bf16>(), dw_->as<bf16>(), nullptr, N,
                           I, O, nullptr);
  rt::cuda::linear_backward(blas, dx->as<bf16>(), dw->as<float>(), db->as<float>(), ddout->as<bf16>(), dx_->as<bf16>(),
                            dw_->as<bf16>(), N, I, O, nullptr);
  // bias epilogue: at most two bf16 roundings (the epilogue may round x@w^T
  // before adding the bias), so 2u; atol for results that cancel to near 0.
  EXPECT_TRUE(rt::test::expect_near("linear out (bias, bf16)", download_bf16(*out, N * O), out_ref, 2e-2, 2 * kU));
  std::vector<float> nobias_ref(N * O);
  rt::cpu::linear_forward(nobias_ref.data(), x.data(), w.data(), nullptr, N, I, O);
  expect_close("linear out (f32)", download_f32(*out32, N * O), nobias_ref, 1e-5, 1e-5);
  EXPECT_TRUE(rt::test::expect_near("linear dx", download_bf16(*dx, N * I), dx_ref, 1e-5, kU));
  expect_close("linear dw (+=)", download_f32(*dw, O * I), dw_ref, 1e-5, 1e-5);
  expect_close("linear dbias (+=)", download_f32(*db, O), db_ref, 1e-5, 1e-5);
}

// ---------------------------------------------------------------- embedding

TEST_F(CudaOps, EmbeddingForwardBackwardMatchCpuAndAreDeterministic) {
  const int64_t V = 50, C = 64, N = 300;  // N >> V: many repeated ids
  auto table = random_bf16(V * C, 20), dout = random_bf16(N * C, 21);
  std::vector<int32_t> ids(N);
  std::mt19937 rng(22);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % V);
  ids[0] = ids[1] = ids[2] = 7;  // a run of equal ids
  auto dt0 = random_vec(V * C, 23);
  std::vector<float> out_ref(N * C), dt_ref = dt0;
  rt::cpu::embedding_forward(out_ref.data(), ids.data(), table.data(), N, C);
  rt::cpu::embedding_backward(dt_ref.data(), dout.data(), ids.data(), N, C);

  auto d_table = upload_bf16(table), d_dout = upload_bf16(dout), d_ids = upload(ids);
  auto out = alloc_bf16(N * C);
  rt::cuda::embedding_forward(out->as<bf16>(), d_ids->as<int32_t>(), d_table->as<bf16>(), N, C, nullptr);
  EXPECT_EQ(download_bf16(*out, N * C), out_ref);  // a gather: exact
  DeviceBuffer scratch(rt::cuda::embedding_backward_scratch_bytes(N, V));
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    auto dt = upload(dt0);
    rt::cuda::embedding_backward(dt->as<float>(), d_dout->as<bf16>(), d_ids->as<int32_t>(), N, C, V, scratch.scratch(),
                                 nullptr);
    auto got = download_f32(*dt, V * C);
    expect_close("embedding dtable (+=)", got, dt_ref, 1e-6, 1e-6);  // fp32 sums of the same bf16 values
    if (run == 0) {
      first = got;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * 4))
          << "embedding backward not bitwise repeatable";
    }
  }
}

// ---------------------------------------------------------------- RMSNorm

// off: Gemma's (1 + w) norms (w around 0, so that w_offset + w is in [0.5, 1.5] as for off = 0).
void rms_norm_case(int64_t N, int64_t C, bool residual, uint64_t seed, float off = 0.f) {
  const float eps = 1e-6f;
  auto x = random_bf16(N * C, seed), r = random_bf16(N * C, seed + 1),
       w = random_bf16(C, seed + 2, 0.5f - off, 1.5f - off);
  auto dout = random_bf16(N * C, seed + 3), dres = random_bf16(N * C, seed + 4);
  auto dw0 = random_vec(C, seed + 5);
  std::vector<float> xin = x;
  if (residual) {
    for (int64_t i = 0; i < N * C; ++i) xin[i] = x[i] + r[i];
    xin = round_bf16(xin);  // the GPU stores sum in bf16 and normalises that
  }
  std::vector<float> out_ref(N * C), rstd_ref(N), dx_ref(N * C), dw_ref = dw0;
  rt::cpu::rms_norm_forward(out_ref.data(), rstd_ref.data(), xin.data(), w.data(), N, C, eps, off);
  rt::cpu::rms_norm_backward(dx_ref.data(), dw_ref.data(), dout.data(), xin.data(), w.data(), rstd_ref.data(), N, C,
                             off);
  if (residual)
    for (int64_t i = 0; i < N * C; ++i) dx_ref[i] += dres[i];

  auto dx_in = upload_bf16(x), dr = upload_bf16(r), dwt = upload_bf16(w), ddout = upload_bf16(dout),
       ddres = upload_bf16(dres);
  auto out = alloc_bf16(N * C), sum = alloc_bf16(N * C), rstd = alloc_f32(N), dx = alloc_bf16(N * C);
  auto dw = upload(dw0);
  DeviceBuffer scratch(rt::cuda::rms_norm_backward_scratch_bytes(N, C));
  const bf16* xs = residual ? sum->as<bf16>() : dx_in->as<bf16>();
  if (residual)
    rt::cuda::rms_norm_residual_forward(out->as<bf16>(), sum->as<bf16>(), rstd->as<float>(), dx_in->as<bf16>(),
                                        dr->as<bf16>(), dwt->as<bf16>(), N, C, eps, nullptr, off);
  else
    rt::cuda::rms_norm_forward(out->as<bf16>(), rstd->as<float>(), dx_in->as<bf16>(), dwt->as<bf16>(), N, C, eps,
                               nullptr, off);
  rt::cuda::rms_norm_backward(dx->as<bf16>(), dw->as<float>(), ddout->as<bf16>(), xs, dwt->as<bf16>(),
                              rstd->as<float>(), residual ? ddres->as<bf16>() : nullptr, N, C, scratch.scratch(),
                              nullptr, off);
  const std::string tag = "rms_norm N=" + std::to_string(N) + " C=" + std::to_string(C) + (residual ? " +res" : "") +
                          (off != 0.f ? " (1 + w)" : "");
  if (residual) {
    EXPECT_EQ(download_bf16(*sum, N * C), xin) << tag << " sum";  // fp32 add, one rounding: exact
  }
  EXPECT_TRUE(rt::test::expect_near(tag + " out", download_bf16(*out, N * C), out_ref, 1e-5, kU));
  expect_close(tag + " rstd", download_f32(*rstd, N), rstd_ref, 1e-5, 1e-5);
  // dx = rs*w*g - x*coef: a difference of two terms; one bf16 rounding of the
  // difference, but cancellation makes elementwise rtol meaningless -> norm test.
  expect_close(tag + " dx", download_bf16(*dx, N * C), dx_ref, 4e-3, 1e-2);
  expect_close(tag + " dw (+=)", download_f32(*dw, C), dw_ref, 1e-5, 1e-5);
}

TEST_F(CudaOps, RmsNormMatchesCpu) {
  rms_norm_case(37, 512, false, 30);
  rms_norm_case(16, 1032, true, 40);      // C not a multiple of 256: partial lane loop
  rms_norm_case(64 * 8, 128, false, 50);  // per-head q/k norm: rows = N*heads, C = D
  rms_norm_case(2000, 64, true, 60);      // several dw row splits
  rms_norm_case(37, 512, false, 70, 1.f);  // Gemma's (1 + w)
  rms_norm_case(64 * 8, 256, true, 80, 1.f);
}

// ---------------------------------------------------------------- RoPE, SwiGLU, add

TEST_F(CudaOps, RopeMatchesCpu) {
  const int64_t N = 40, heads = 3, D = 128;
  rt::RopeConfig rope;
  rope.theta = 500000.0;
  rope.scaling = rt::RopeScaling::llama3;
  rope.factor = 8.0;
  auto inv_freq = rt::cpu::rope_inv_freq(rope, D);
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>((n * 977) % 8000);  // large angles too
  auto x = random_bf16(N * heads * D, 70), g = random_bf16(N * heads * D, 71);
  std::vector<float> fwd_ref = x, bwd_ref = g;
  rt::cpu::rope_forward(fwd_ref.data(), pos.data(), inv_freq.data(), N, heads, D);
  rt::cpu::rope_backward(bwd_ref.data(), pos.data(), inv_freq.data(), N, heads, D);
  auto dx = upload_bf16(x), dg = upload_bf16(g), dpos = upload(pos), dfreq = upload(inv_freq);
  rt::cuda::rope_forward(dx->as<bf16>(), dpos->as<int32_t>(), dfreq->as<float>(), N, heads, D, nullptr);
  rt::cuda::rope_backward(dg->as<bf16>(), dpos->as<int32_t>(), dfreq->as<float>(), N, heads, D, nullptr);
  // x1*cos - x2*sin rounded once; atol covers cancellation near zero (|x| <= 1,
  // sincosf vs std::sin differ by ~1e-7 of the angle's magnitude of rounding)
  EXPECT_TRUE(rt::test::expect_near("rope fwd", download_bf16(*dx, N * heads * D), fwd_ref, 1e-4, kU));
  EXPECT_TRUE(rt::test::expect_near("rope bwd", download_bf16(*dg, N * heads * D), bwd_ref, 1e-4, kU));
}

// Phi3: partial rotary (96 of head_dim 128, Phi-4-mini) with LongRoPE's long
// factors and cos/sin scale; the last 32 dims of each head must come back unchanged.
TEST_F(CudaOps, PartialRotaryScaledRopeMatchesCpu) {
  const int64_t N = 40, heads = 3, D = 128;
  rt::ModelSpec s = rt::spec_preset("phi-4-mini");
  for (size_t i = 0; i < s.rope.long_factor.size(); ++i) s.rope.long_factor[i] = 1.0 + 0.4 * static_cast<double>(i);
  const int64_t R = s.rotary_dim();
  const float scale = static_cast<float>(s.rope.attention_factor);  // ~1.19
  ASSERT_EQ(R, 96);
  auto inv_freq = rt::cpu::rope_inv_freq(s.rope, D, true);
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>((n * 977) % 8000);
  auto x = random_bf16(N * heads * D, 72), g = random_bf16(N * heads * D, 73);
  std::vector<float> fwd_ref = x, bwd_ref = g;
  rt::cpu::rope_forward(fwd_ref.data(), pos.data(), inv_freq.data(), N, heads, D, R, scale);
  rt::cpu::rope_backward(bwd_ref.data(), pos.data(), inv_freq.data(), N, heads, D, R, scale);
  auto dx = upload_bf16(x), dg = upload_bf16(g), dpos = upload(pos), dfreq = upload(inv_freq);
  rt::cuda::rope_forward(dx->as<bf16>(), dpos->as<int32_t>(), dfreq->as<float>(), N, heads, D, R, scale, nullptr);
  rt::cuda::rope_backward(dg->as<bf16>(), dpos->as<int32_t>(), dfreq->as<float>(), N, heads, D, R, scale, nullptr);
  // as RopeMatchesCpu, the values scaled by <= 1.2: atol 1.2e-4, one bf16 rounding
  const std::vector<float> fwd = download_bf16(*dx, N * heads * D), bwd = download_bf16(*dg, N * heads * D);
  EXPECT_TRUE(rt::test::expect_near("partial rope fwd", fwd, fwd_ref, 1.2e-4, kU));
  EXPECT_TRUE(rt::test::expect_near("partial rope bwd", bwd, bwd_ref, 1.2e-4, kU));
  for (int64_t r = 0; r < N * heads; ++r)  // pass-through dims: the input bits (x is bf16-representable)
    for (int64_t d = R; d < D; ++d) ASSERT_EQ(fwd[r * D + d], x[r * D + d]) << "row " << r << " dim " << d;
}

TEST_F(CudaOps, SwigluAndAddMatchCpu) {
  const int64_t n = 4099;
  auto gate = random_bf16(n, 80, -6.f, 6.f), up = random_bf16(n, 81), dout = random_bf16(n, 82);
  std::vector<float> out_ref(n), dg_ref(n), du_ref(n);
  rt::cpu::swiglu_forward(out_ref.data(), gate.data(), up.data(), n);
  rt::cpu::swiglu_backward(dg_ref.data(), du_ref.data(), dout.data(), gate.data(), up.data(), n);
  auto dgate = upload_bf16(gate), dup_in = upload_bf16(up), ddout = upload_bf16(dout);
  auto out = alloc_bf16(n), dg = alloc_bf16(n), du = alloc_bf16(n);
  rt::cuda::swiglu_forward(out->as<bf16>(), dgate->as<bf16>(), dup_in->as<bf16>(), n, nullptr);
  rt::cuda::swiglu_backward(dg->as<bf16>(), du->as<bf16>(), ddout->as<bf16>(), dgate->as<bf16>(), dup_in->as<bf16>(), n,
                            nullptr);
  // fp32 math (expf vs std::exp ~1 ulp) then one bf16 rounding
  EXPECT_TRUE(rt::test::expect_near("swiglu out", download_bf16(*out, n), out_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("swiglu dgate", download_bf16(*dg, n), dg_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("swiglu dup", download_bf16(*du, n), du_ref, 1e-6, kU));
  // 8 elements per access where the arrays are 16-byte aligned (the above:
  // 512 vectors and a tail of 3), one at a time where they are not (one
  // element in): the same bits
  {
    auto out1 = alloc_bf16(n), dg1 = alloc_bf16(n), du1 = alloc_bf16(n);
    rt::cuda::swiglu_forward(out1->as<bf16>() + 1, dgate->as<bf16>() + 1, dup_in->as<bf16>() + 1, n - 1, nullptr);
    rt::cuda::swiglu_backward(dg1->as<bf16>() + 1, du1->as<bf16>() + 1, ddout->as<bf16>() + 1, dgate->as<bf16>() + 1,
                              dup_in->as<bf16>() + 1, n - 1, nullptr);
    const auto tail = [&](const DeviceBuffer& b) {
      std::vector<float> v = download_bf16(b, n);
      return std::vector<float>(v.begin() + 1, v.end());
    };
    EXPECT_EQ(tail(*out1), tail(*out)) << "swiglu out: unaligned against 16-byte accesses";
    EXPECT_EQ(tail(*dg1), tail(*dg)) << "swiglu dgate: unaligned against 16-byte accesses";
    EXPECT_EQ(tail(*du1), tail(*du)) << "swiglu dup: unaligned against 16-byte accesses";
  }

  std::vector<float> sum_ref = up;
  rt::cpu::add_inplace(sum_ref.data(), dout.data(), n);
  rt::cuda::add_inplace(dup_in->as<bf16>(), ddout->as<bf16>(), n, nullptr);
  EXPECT_EQ(download_bf16(*dup_in, n), round_bf16(sum_ref));  // one rounding of an exact fp32 sum

  // scale (Granite's multipliers): the fp32 product alpha * x, rounded once to
  // bf16, as the CPU's fp32 product rounded to bf16; in place and out of place
  std::vector<float> scaled_ref(n);
  rt::cpu::scale(scaled_ref.data(), gate.data(), 0.22f, n);
  rt::cuda::scale(out->as<bf16>(), dgate->as<bf16>(), 0.22f, n, nullptr);
  EXPECT_EQ(download_bf16(*out, n), round_bf16(scaled_ref));
  rt::cuda::scale(dgate->as<bf16>(), dgate->as<bf16>(), 0.22f, n, nullptr);
  EXPECT_EQ(download_bf16(*dgate, n), round_bf16(scaled_ref));
}

TEST_F(CudaOps, GegluMatchesCpu) {
  const int64_t n = 4099;
  auto gate = random_bf16(n, 90, -6.f, 6.f), up = random_bf16(n, 91), dout = random_bf16(n, 92);
  std::vector<float> out_ref(n), dg_ref(n), du_ref(n);
  rt::cpu::geglu_forward(out_ref.data(), gate.data(), up.data(), n);
  rt::cpu::geglu_backward(dg_ref.data(), du_ref.data(), dout.data(), gate.data(), up.data(), n);
  auto dgate = upload_bf16(gate), dup_in = upload_bf16(up), ddout = upload_bf16(dout);
  auto out = alloc_bf16(n), dg = alloc_bf16(n), du = alloc_bf16(n);
  rt::cuda::geglu_forward(out->as<bf16>(), dgate->as<bf16>(), dup_in->as<bf16>(), n, nullptr);
  rt::cuda::geglu_backward(dg->as<bf16>(), du->as<bf16>(), ddout->as<bf16>(), dgate->as<bf16>(), dup_in->as<bf16>(), n,
                           nullptr);
  // fp32 math (tanhf vs std::tanh, a few ulp) then one bf16 rounding, as SwiGLU
  EXPECT_TRUE(rt::test::expect_near("geglu out", download_bf16(*out, n), out_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("geglu dgate", download_bf16(*dg, n), dg_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("geglu dup", download_bf16(*du, n), du_ref, 1e-6, kU));
}

// gpt-oss's clamped SwiGLU: limit 1.5 with inputs in [-6, 6] (most values clamped on one
// side or the other); the clamps pass or stop the gradient on the same bf16 inputs the CPU sees.
TEST_F(CudaOps, ClampedSwigluMatchesCpu) {
  const int64_t n = 4099;
  const float limit = 1.5f, alpha = 1.702f;
  auto gate = random_bf16(n, 93, -6.f, 6.f), up = random_bf16(n, 94, -6.f, 6.f), dout = random_bf16(n, 95);
  std::vector<float> out_ref(n), dg_ref(n), du_ref(n);
  rt::cpu::swiglu_clamped_forward(out_ref.data(), gate.data(), up.data(), n, limit, alpha);
  rt::cpu::swiglu_clamped_backward(dg_ref.data(), du_ref.data(), dout.data(), gate.data(), up.data(), n, limit, alpha);
  auto dgate = upload_bf16(gate), dup_in = upload_bf16(up), ddout = upload_bf16(dout);
  auto out = alloc_bf16(n), dg = alloc_bf16(n), du = alloc_bf16(n);
  rt::cuda::swiglu_clamped_forward(out->as<bf16>(), dgate->as<bf16>(), dup_in->as<bf16>(), n, limit, alpha, nullptr);
  rt::cuda::swiglu_clamped_backward(dg->as<bf16>(), du->as<bf16>(), ddout->as<bf16>(), dgate->as<bf16>(),
                                    dup_in->as<bf16>(), n, limit, alpha, nullptr);
  // fp32 math (expf vs std::exp, a few ulp) then one bf16 rounding, as SwiGLU
  EXPECT_TRUE(rt::test::expect_near("clamped swiglu out", download_bf16(*out, n), out_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("clamped swiglu dgate", download_bf16(*dg, n), dg_ref, 1e-6, kU));
  EXPECT_TRUE(rt::test::expect_near("clamped swiglu dup", download_bf16(*du, n), du_ref, 1e-6, kU));
}

// ---------------------------------------------------------------- LM head + cross-entropy

TEST_F(CudaOps, LmHeadCrossEntropyMatchesCpu) {
  // V = 1000: a multiple of 8. V = 1002 and 997: the op runs on Vr =
  // lm_head_rows(V) = 1008 / 1000 rows; the padding rows of w hold random
  // (finite) values here, which must change nothing (their logits are left
  // out by index, not by value), and dw's padding rows must stay exactly 0.
  for (const int64_t V : {int64_t{1000}, int64_t{1002}, int64_t{997}}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    rt::cuda::Blas blas;
    const int64_t N = 100, C = 64, chunk = 32;  // 4 chunks, the last one partial
    const int64_t Vr = rt::cuda::lm_head_rows(V);
    ASSERT_EQ(Vr % 8, 0);
    ASSERT_TRUE(Vr >= V && Vr < V + 8);
    const float grad_scale = 1.f / 90.f;
    auto h = random_bf16(N * C, 90), w = random_bf16(Vr * C, 91, -0.5f, 0.5f);  // rows V..Vr-1: padding
    std::vector<int32_t> targets(N);
    std::mt19937 rng(92);
    for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
    targets[3] = static_cast<int32_t>(V - 1);            // the last real id
    for (int i = 0; i < 10; ++i) targets[i * 7] = -100;  // ignored rows
    auto dw0 = random_vec(Vr * C, 93);
    for (int64_t i = V * C; i < Vr * C; ++i) dw0[i] = 0.f;
    std::vector<float> dh_ref(N * C), dw_ref = dw0;
    int64_t n_valid_ref = 0;
    const double loss_ref = rt::cpu::lm_head_cross_entropy(dh_ref.data(), dw_ref.data(), h.data(), w.data(),
                                                           targets.data(), N, C, V, grad_scale, 16, &n_valid_ref);
    auto dh_ = upload_bf16(h), dw_ = upload_bf16(w), dt = upload(targets);
    auto dh = alloc_bf16(N * C);
    auto dw = upload(dw0);
    rt::cuda::CrossEntropyTotals zero{0.0, 0};
    auto totals = upload(std::vector<rt::cuda::CrossEntropyTotals>{zero});
    DeviceBuffer scratch(rt::cuda::lm_head_cross_entropy_scratch_bytes(chunk, V));
    rt::cuda::lm_head_cross_entropy(blas, dh->as<bf16>(), dw->as<float>(), totals->as<rt::cuda::CrossEntropyTotals>(),
                                    dh_->as<bf16>(), dw_->as<bf16>(), dt->as<int32_t>(), N, C, V, grad_scale, chunk,
                                    scratch.scratch(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    rt::cuda::CrossEntropyTotals got{};
    CUDA_CHECK(cudaMemcpy(&got, totals->data(), sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got.n_valid, n_valid_ref);
    // fp32 logits from the same bf16 operands, fp32 softmax: loss agrees to fp32 rounding
    EXPECT_NEAR(got.loss_sum, loss_ref, 1e-5 * std::fabs(loss_ref)) << "loss sum";
    // dlogits are rounded to bf16 before the dh / dw GEMMs (and dh is bf16)
    expect_close("ce dh", download_bf16(*dh, N * C), dh_ref, 1e-2, 2e-2);
    std::vector<float> dw_all = download_f32(*dw, Vr * C);
    for (int64_t i = V * C; i < Vr * C; ++i) ASSERT_EQ(dw_all[i], 0.f) << "dw padding element " << i;
    std::vector<float> dw_got(dw_all.begin(), dw_all.begin() + V * C), ddw_got(V * C), ddw_ref(V * C);
    dw_ref.resize(V * C);
    for (int64_t i = 0; i < V * C; ++i) ddw_got[i] = dw_got[i] - dw0[i], ddw_ref[i] = dw_ref[i] - dw0[i];
    expect_close("ce dw increment", ddw_got, ddw_ref, 1e-2, 2e-2);
    expect_close("ce dw (+=)", dw_got, dw_ref, 1e-5, 1e-4);
  }
}

// Gemma 2's final soft cap in the LM head + cross-entropy.
TEST_F(CudaOps, SoftCappedCrossEntropyMatchesCpu) {
  rt::cuda::Blas blas;
  const int64_t N = 64, C = 64, V = 1000, chunk = 32;
  const int64_t Vr = rt::cuda::lm_head_rows(V);
  const float grad_scale = 1.f / 60.f, cap = 3.f;  // logits up to ~5: the cap bites
  auto h = random_bf16(N * C, 190), w = random_bf16(Vr * C, 191, -0.5f, 0.5f);
  std::vector<int32_t> targets(N);
  std::mt19937 rng(192);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
  for (int i = 0; i < 4; ++i) targets[i * 9] = -100;
  std::vector<float> dh_ref(N * C), dw_ref(Vr * C, 0.f);
  int64_t n_valid_ref = 0;
  const double loss_ref = rt::cpu::lm_head_cross_entropy(dh_ref.data(), dw_ref.data(), h.data(), w.data(),
                                                         targets.data(), N, C, V, grad_scale, 16, &n_valid_ref, cap);
  auto dh_ = upload_bf16(h), dw_ = upload_bf16(w), dt = upload(targets);
  auto dh = alloc_bf16(N * C);
  auto dw = upload(std::vector<float>(Vr * C, 0.f));
  rt::cuda::CrossEntropyTotals zero{0.0, 0};
  auto totals = upload(std::vector<rt::cuda::CrossEntropyTotals>{zero});
  DeviceBuffer scratch(rt::cuda::lm_head_cross_entropy_scratch_bytes(chunk, V));
  rt::cuda::lm_head_cross_entropy(blas, dh->as<bf16>(), dw->as<float>(), totals->as<rt::cuda::CrossEntropyTotals>(),
                                  dh_->as<bf16>(), dw_->as<bf16>(), dt->as<int32_t>(), N, C, V, grad_scale, chunk,
                                  scratch.scratch(), nullptr, cap);
  CUDA_CHECK(cudaDeviceSynchronize());
  rt::cuda::CrossEntropyTotals got{};
  CUDA_CHECK(cudaMemcpy(&got, totals->data(), sizeof(got), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got.n_valid, n_valid_ref);
  // as the uncapped case: fp32 logits of the same bf16 operands, fp32 tanh and softmax
  EXPECT_NEAR(got.loss_sum, loss_ref, 1e-5 * std::fabs(loss_ref)) << "loss sum";
  expect_close("capped ce dh", download_bf16(*dh, N * C), dh_ref, 1e-2, 2e-2);
  std::vector<float> dw_got = download_f32(*dw, Vr * C);
  dw_got.resize(V * C);
  dw_ref.resize(V * C);
  expect_close("capped ce dw", dw_got, dw_ref, 1e-2, 2e-2);
}

// ---------------------------------------------------------------- attention

struct AttnCase {
  int64_t B, T, H, G, D;
  std::vector<std::vector<int>> docs = {};  // packed documents: lengths per sequence (empty: none)
  int64_t window = 0;                       // sliding window (Gemma, gpt-oss; 0: none)
  bool sinks = false;                       // gpt-oss's sink logit per query head
  float softcap = 0.f;                      // Gemma 2's attention-logit soft cap (0: none)
};

// doc_start [B*T] of the case's packed documents (empty when it has none).
std::vector<int32_t> attention_doc_start(const AttnCase& c) {
  std::vector<int32_t> d;
  if (c.docs.empty()) return d;
  for (const auto& seq : c.docs) {
    int32_t start = 0;
    for (int n : seq) {
      for (int i = 0; i < n; ++i) d.push_back(start);
      start += n;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(d.size()), c.B * c.T) << "document lengths must fill every sequence";
  return d;
}

// The fused kernels (cuda::attention_forward / attention_backward, the kernel
// set chosen by the caller) against the CPU reference; with a window, sinks or
// a soft cap also against the fallback (cuda/attention_masked.cu) on the same
// inputs.
void attention_case(const AttnCase& c, uint64_t seed) {
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.G * c.D, nl = c.B * c.H * c.T;
  // q scaled up so the softmax is far from uniform (scores ~ +-3). With a soft cap c, q in
  // +-4c: s = q.k / sqrt(D) has standard deviation 4c/3 (k in +-1), so most scores are past
  // the knee of c tanh(s / c) and the largest several c (the cap bends them; checked below)
  const float q_range = c.softcap > 0.f ? 4.f * c.softcap : 2.f;
  auto q = random_bf16(nq, seed, -q_range, q_range), k = random_bf16(nkv, seed + 1), v = random_bf16(nkv, seed + 2);
  auto dout = random_bf16(nq, seed + 3);
  // sinks from -1 to 3 (as the fallback's test): from barely there to most of a short row's weight
  const std::vector<float> sinks = c.sinks ? random_bf16(c.H, seed + 4, -1.f, 3.f) : std::vector<float>{};
  const float* sinks_host = c.sinks ? sinks.data() : nullptr;
  std::vector<float> out_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nkv), dv_ref(nkv), dsink_ref(c.H, 0.f);
  const std::vector<int32_t> doc = attention_doc_start(c);
  const int32_t* doc_host = doc.empty() ? nullptr : doc.data();
  rt::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), c.B, c.T, c.H, c.G, c.D,
                             doc_host, c.window, c.softcap, sinks_host);
  rt::cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(), v.data(),
                              out_ref.data(), lse_ref.data(), c.B, c.T, c.H, c.G, c.D, doc_host, c.window, c.softcap,
                              sinks_host, c.sinks ? dsink_ref.data() : nullptr);
  if (c.softcap > 0.f) {  // the cap must matter: without it the reference is far off
    std::vector<float> out_free(nq), lse_free(nl);
    rt::cpu::attention_forward(out_free.data(), lse_free.data(), q.data(), k.data(), v.data(), c.B, c.T, c.H, c.G, c.D,
                               doc_host, c.window, 0.f, sinks_host);
    EXPECT_GT(rt::test::rel_l2(out_free.data(), out_ref.data(), nq), 0.1) << "the soft cap bends too little to test";
  }
  auto d_doc = doc.empty() ? nullptr : upload(doc);
  const int32_t* doc_dev = d_doc ? d_doc->as<int32_t>() : nullptr;
  auto d_sinks = c.sinks ? upload_bf16(sinks) : nullptr;
  auto d_dsinks = c.sinks ? upload(std::vector<float>(c.H, 0.f)) : nullptr;
  const bf16* sinks_dev = d_sinks ? d_sinks->as<bf16>() : nullptr;
  float* dsinks_dev = d_dsinks ? d_dsinks->as<float>() : nullptr;

  auto dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v), ddout = upload_bf16(dout);
  auto out = alloc_bf16(nq), lse = alloc_f32(nl);
  auto dq = alloc_bf16(nq), dk = alloc_bf16(nkv), dv = alloc_bf16(nkv);
  DeviceBuffer scratch(rt::cuda::attention_backward_scratch_bytes(c.B, c.T, c.H));
  rt::cuda::attention_forward(out->as<bf16>(), lse->as<float>(), dq_in->as<bf16>(), dk_in->as<bf16>(),
                              dv_in->as<bf16>(), c.B, c.T, c.H, c.G, c.D, nullptr, doc_dev, c.window, sinks_dev,
                              c.softcap);
  auto backward = [&] {
    rt::cuda::attention_backward(dq->as<bf16>(), dk->as<bf16>(), dv->as<bf16>(), ddout->as<bf16>(), dq_in->as<bf16>(),
                                 dk_in->as<bf16>(), dv_in->as<bf16>(), out->as<bf16>(), lse->as<float>(), c.B, c.T, c.H,
                                 c.G, c.D, scratch.scratch(), nullptr, doc_dev, c.window, sinks_dev, dsinks_dev,
                                 c.softcap);
  };
  backward();
  const std::string tag = "attention B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                          " H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) + " D=" + std::to_string(c.D) +
                          (doc.empty() ? "" : " packed documents") +
                          (c.window > 0 ? " window " + std::to_string(c.window) : "") + (c.sinks ? " sinks" : "") +
                          (c.softcap > 0.f ? " softcap " + std::to_string(c.softcap) : "");
  // The bounds below hold with a soft cap too (lse's absolute term aside): the cap's slope is
  // at most 1, so it passes on no more than the scores' fp32 regrouping error (larger with q in
  // +-4c: ~3e-5 in s at c = 50, P ~3e-5 relative, far under one bf16 step), the kernels' tanh
  // (attention/softmax.cuh) is off by ~c * 1e-7, and P and dS are rounded to bf16 as without
  // a cap.
  // out: P rounded to bf16 before P@V, fp32 accumulation, one final rounding
  auto out1 = download_bf16(*out, nq), lse1 = download_f32(*lse, nl);
  expect_close(tag + " out", out1, out_ref, 1e-2, 3e-2);
  // lse: fp32 scores of the same bf16 operands, fp32 exp/log: absolute error ~1e-5 with q in
  // +-2. The scores' regrouping error grows with |q| (partial sums ~ |q| sqrt(D)) and the cap
  // passes it on where s ~ 0 (slope 1), where lse can be ~0 in a short row: the absolute term
  // scales with the q range (1e-3 at c = 50, q in +-200: ~3e-5 expected)
  const double lse_atol = 1e-5 * std::max(1.0, static_cast<double>(q_range) / 2.0);
  EXPECT_TRUE(rt::test::expect_near(tag + " lse", lse1, lse_ref, 2e-4, lse_atol));
  // gradients: P, dS rounded to bf16 before their GEMMs; out is bf16 in delta
  auto dq1 = download_bf16(*dq, nq), dk1 = download_bf16(*dk, nkv), dv1 = download_bf16(*dv, nkv);
  expect_close(tag + " dq", dq1, dq_ref, 1e-2, 5e-2);
  expect_close(tag + " dk", dk1, dk_ref, 1e-2, 5e-2);
  expect_close(tag + " dv", dv1, dv_ref, 1e-2, 5e-2);
  // d sink: sum over B*T rows of -P_sink D_t from the fused lse and the bf16 out, as the fallback's
  // (the same sum, attention/sinks.h): the per-row error of D_t (as dq's) summed, norm-wise as dq's bound
  std::vector<float> dsinks1;
  if (c.sinks) {
    dsinks1 = download_f32(*d_dsinks, c.H);
    expect_close(tag + " dsinks", dsinks1, dsink_ref, 1e-2, 5e-2);
  }
  // deterministic: a second backward is bitwise identical
  dq->poison();
  dk->poison();
  dv->poison();
  if (c.sinks) CUDA_CHECK(cudaMemset(dsinks_dev, 0, c.H * sizeof(float)));
  backward();
  EXPECT_EQ(download_bf16(*dq, nq), dq1) << tag << " dq not repeatable";
  EXPECT_EQ(download_bf16(*dk, nkv), dk1) << tag << " dk not repeatable";
  EXPECT_EQ(download_bf16(*dv, nkv), dv1) << tag << " dv not repeatable";
  if (c.sinks) {
    EXPECT_EQ(download_f32(*d_dsinks, c.H), dsinks1) << tag << " dsinks not repeatable";
  }
  if (c.window == 0 && !c.sinks && c.softcap == 0.f) return;

  // the fallback these layers ran before, on the same inputs. It keeps P and dS in fp32 and
  // stays far inside the bounds above against the CPU (MaskedAttentionMatchesCpu), so the
  // fused-vs-fallback difference is the fused kernels' own bf16 roundings: the same bounds.
  auto out_m = alloc_bf16(nq), lse_m = alloc_f32(nl), dq_m = alloc_bf16(nq), dk_m = alloc_bf16(nkv),
       dv_m = alloc_bf16(nkv);
  auto d_dsinks_m = c.sinks ? upload(std::vector<float>(c.H, 0.f)) : nullptr;
  rt::cuda::attention_masked_forward(out_m->as<bf16>(), lse_m->as<float>(), dq_in->as<bf16>(), dk_in->as<bf16>(),
                                     dv_in->as<bf16>(), c.B, c.T, c.H, c.G, c.D, c.window, c.softcap, nullptr, doc_dev,
                                     sinks_dev);
  rt::cuda::attention_masked_backward(
      dq_m->as<bf16>(), dk_m->as<bf16>(), dv_m->as<bf16>(), ddout->as<bf16>(), dq_in->as<bf16>(), dk_in->as<bf16>(),
      dv_in->as<bf16>(), out_m->as<bf16>(), lse_m->as<float>(), c.B, c.T, c.H, c.G, c.D, c.window, c.softcap,
      scratch.scratch(), nullptr, doc_dev, sinks_dev, d_dsinks_m ? d_dsinks_m->as<float>() : nullptr);
  expect_close(tag + " out vs fallback", out1, download_bf16(*out_m, nq), 1e-2, 3e-2);
  EXPECT_TRUE(rt::test::expect_near(tag + " lse vs fallback", lse1, download_f32(*lse_m, nl), 2e-4, lse_atol));
  expect_close(tag + " dq vs fallback", dq1, download_bf16(*dq_m, nq), 1e-2, 5e-2);
  expect_close(tag + " dk vs fallback", dk1, download_bf16(*dk_m, nkv), 1e-2, 5e-2);
  expect_close(tag + " dv vs fallback", dv1, download_bf16(*dv_m, nkv), 1e-2, 5e-2);
  if (c.sinks) expect_close(tag + " dsinks vs fallback", dsinks1, download_f32(*d_dsinks_m, c.H), 1e-2, 5e-2);
}

// Gemma's sliding window and attention soft cap: the fallback kernels
// (cuda/attention_masked.cu) against the CPU reference. They keep P and dS
// in fp32 (no bf16 rounding before a GEMM), so the fused kernels' bounds
// above hold with room; the only roundings are the bf16 inputs and outputs.
// sinks (gpt-oss): a bf16 logit per head in [-1, 3], the CPU reading the same rounded values.
void masked_attention_case(const AttnCase& c, int64_t window, float cap, uint64_t seed, bool with_sinks = false) {
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.G * c.D;
  auto q = random_bf16(nq, seed, -2.f, 2.f), k = random_bf16(nkv, seed + 1), v = random_bf16(nkv, seed + 2);
  auto dout = random_bf16(nq, seed + 3);
  const std::vector<float> sinks = with_sinks ? random_bf16(c.H, seed + 4, -1.f, 3.f) : std::vector<float>{};
  const float* sinks_host = with_sinks ? sinks.data() : nullptr;
  std::vector<float> out_ref(nq), lse_ref(c.B * c.H * c.T), dq_ref(nq), dk_ref(nkv), dv_ref(nkv), dsink_ref(c.H, 0.f);
  const std::vector<int32_t> doc = attention_doc_start(c);
  const int32_t* doc_host = doc.empty() ? nullptr : doc.data();
  rt::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), c.B, c.T, c.H, c.G, c.D,
                             doc_host, window, cap, sinks_host);
  rt::cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(), v.data(),
                              out_ref.data(), lse_ref.data(), c.B, c.T, c.H, c.G, c.D, doc_host, window, cap,
                              sinks_host, with_sinks ? dsink_ref.data() : nullptr);
  auto d_sinks = with_sinks ? upload_bf16(sinks) : nullptr;
  auto d_dsinks = with_sinks ? upload(std::vector<float>(c.H, 0.f)) : nullptr;
  const bf16* sinks_dev = d_sinks ? d_sinks->as<bf16>() : nullptr;
  float* dsinks_dev = d_dsinks ? d_dsinks->as<float>() : nullptr;
  auto d_doc = doc.empty() ? nullptr : upload(doc);
  const int32_t* doc_dev = d_doc ? d_doc->as<int32_t>() : nullptr;
  auto dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v), ddout = upload_bf16(dout);
  auto out = alloc_bf16(nq), lse = alloc_f32(c.B * c.H * c.T);
  auto dq = alloc_bf16(nq), dk = alloc_bf16(nkv), dv = alloc_bf16(nkv);
  DeviceBuffer scratch(rt::cuda::attention_backward_scratch_bytes(c.B, c.T, c.H));
  rt::cuda::attention_masked_forward(out->as<bf16>(), lse->as<float>(), dq_in->as<bf16>(), dk_in->as<bf16>(),
                                     dv_in->as<bf16>(), c.B, c.T, c.H, c.G, c.D, window, cap, nullptr, doc_dev,
                                     sinks_dev);
  rt::cuda::attention_masked_backward(dq->as<bf16>(), dk->as<bf16>(), dv->as<bf16>(), ddout->as<bf16>(),
                                      dq_in->as<bf16>(), dk_in->as<bf16>(), dv_in->as<bf16>(), out->as<bf16>(),
                                      lse->as<float>(), c.B, c.T, c.H, c.G, c.D, window, cap, scratch.scratch(),
                                      nullptr, doc_dev, sinks_dev, dsinks_dev);
  const std::string tag = "masked attention T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
                          " G=" + std::to_string(c.G) + " D=" + std::to_string(c.D) + " window " +
                          std::to_string(window) + " cap " + std::to_string(cap) + (doc.empty() ? "" : " packed") +
                          (with_sinks ? " sinks" : "");
  // d sink: sum over B*T rows of -P_sink D_t, fp32 on both sides from bf16-rounded out and dO:
  // the per-row error of D_t (as dq's) summed, norm-wise as dq's bound
  if (with_sinks) expect_close(tag + " dsinks", download_f32(*d_dsinks, c.H), dsink_ref, 1e-2, 5e-2);
  expect_close(tag + " out", download_bf16(*out, nq), out_ref, 1e-2, 3e-2);
  EXPECT_TRUE(rt::test::expect_near(tag + " lse", download_f32(*lse, c.B * c.H * c.T), lse_ref, 2e-4, 1e-5));
  expect_close(tag + " dq", download_bf16(*dq, nq), dq_ref, 1e-2, 5e-2);
  expect_close(tag + " dk", download_bf16(*dk, nkv), dk_ref, 1e-2, 5e-2);
  expect_close(tag + " dv", download_bf16(*dv, nkv), dv_ref, 1e-2, 5e-2);
}

TEST_F(CudaOps, MaskedAttentionMatchesCpu) {
  masked_attention_case({2, 70, 4, 2, 64}, 16, 0.f, 500);      // window only, several 32-key chunks
  masked_attention_case({2, 70, 4, 2, 64}, 0, 1.5f, 510);      // soft cap only
  masked_attention_case({1, 100, 8, 4, 256}, 33, 2.f, 520);    // both, Gemma's head_dim
  masked_attention_case({2, 40, 4, 1, 128, {{17, 23}, {40}}}, 9, 3.f, 530);  // with packed documents
  masked_attention_case({2, 70, 8, 2, 64}, 16, 0.f, 540, true);              // gpt-oss: sinks and a window
  masked_attention_case({2, 70, 8, 2, 64}, 0, 0.f, 550, true);               // sinks alone
}

// Both kernel sets where the GPU runs them (wgmma: compute capability 9.0),
// each against the CPU reference with the tolerances above.
std::vector<rt::cuda::AttentionKernels> attention_kernel_sets() {
  std::vector<rt::cuda::AttentionKernels> r = {rt::cuda::AttentionKernels::mma_sync};
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
  if (rt::cuda::attention_kernels_in_use() == rt::cuda::AttentionKernels::wgmma)
    r.push_back(rt::cuda::AttentionKernels::wgmma);
  return r;
}

void attention_cases(const std::vector<AttnCase>& cases, uint64_t seed) {
  for (rt::cuda::AttentionKernels k : attention_kernel_sets()) {
    SCOPED_TRACE(rt::cuda::attention_kernels_name(k));
    rt::cuda::set_attention_kernels(k);
    for (size_t i = 0; i < cases.size(); ++i) {
      // head dims without wgmma kernels run mma_sync either way: test them once
      if (rt::cuda::attention_kernels_in_use(cases[i].D, cases[i].softcap) != k) continue;
      attention_case(cases[i], seed + 10 * i);
    }
  }
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
}

TEST_F(CudaOps, AttentionHeadDim64MatchesCpu) {
  attention_cases({{2, 100, 4, 2, 64},   // partial tiles, GQA group 2
                   {1, 256, 4, 4, 64}},  // whole tiles, no grouping
                  100);
}

TEST_F(CudaOps, AttentionHeadDim128MatchesCpu) {
  attention_cases({{1, 200, 8, 2, 128},   // GQA group 4, partial tiles
                   {2, 129, 2, 1, 128},   // one row past a tile, MQA
                   {1, 600, 4, 2, 128}},  // more key and query tiles than pipeline stages
                  120);
}

// head_dim 96 (Phi-3): tiles padded to 128 columns in shared memory
TEST_F(CudaOps, AttentionHeadDim96MatchesCpu) {
  attention_cases({{2, 100, 4, 2, 96},   // partial tiles, GQA group 2
                   {1, 300, 6, 2, 96}},  // several key and query tiles, GQA group 3
                  140);
}

// head_dim 256 (Gemma): own tile shapes (32-key forward tiles, 16-row dK/dV and
// 16-key dQ tiles, dK/dV in two column slices)
TEST_F(CudaOps, AttentionHeadDim256MatchesCpu) {
  attention_cases({{2, 100, 4, 2, 256},  // partial tiles, GQA group 2
                   {1, 300, 4, 1, 256},  // MQA, many more tiles than pipeline stages
                   {1, 64, 2, 2, 256}},  // exactly one block of each kernel
                  160);
}

// Packed documents (doc_start): against the CPU reference with the same
// document mask. Boundaries inside and on tiles; documents long enough that
// whole key tiles (forward, dQ) and query tiles (dK/dV) are skipped.
TEST_F(CudaOps, AttentionPackedDocumentsMatchCpu) {
  attention_cases({{2, 300, 4, 2, 64, {{70, 1, 100, 129}, {150, 150}}},
                   {1, 300, 4, 2, 128, {{64, 64, 1, 171}}},
                   {1, 200, 6, 2, 96, {{128, 5, 67}}},
                   {1, 200, 4, 2, 256, {{16, 17, 100, 67}}},
                   {1, 129, 2, 1, 128, {{1, 1, 1, 126}}}},
                  180);
}

// Sliding windows (Gemma: head_dim 256, window 1024 of 4096; gpt-oss: head_dim
// 64, window 128) in the fused kernels: each row's first key is max(document
// start, t - W + 1). Windows much shorter than T, so whole key tiles (forward,
// dQ) and query tiles (dK/dV) fall outside; windows on and off tile
// boundaries; a window of 2 (a window of 1 would make P = 1 and dq, dk
// vanish: nothing for a relative bound to measure).
TEST_F(CudaOps, AttentionSlidingWindowMatchesCpuAndFallback) {
  attention_cases({{2, 300, 8, 2, 64, {}, 128},  // gpt-oss's head_dim and window
                   {1, 130, 2, 1, 64, {}, 2},
                   {1, 600, 4, 2, 128, {}, 200},
                   {1, 300, 6, 2, 96, {}, 70},
                   {1, 700, 4, 2, 256, {}, 128},  // Gemma's head_dim, T / W ~ 5
                   {1, 700, 4, 1, 256, {}, 33}},
                  200);
}

// Windows and packed documents together: the later of the two starts.
TEST_F(CudaOps, AttentionSlidingWindowWithPackedDocumentsMatchesCpuAndFallback) {
  attention_cases({{2, 300, 4, 2, 64, {{70, 1, 100, 129}, {150, 150}}, 64},
                   {1, 300, 4, 2, 128, {{64, 64, 1, 171}}, 100},
                   {1, 700, 4, 2, 256, {{300, 17, 383}}, 128}},
                  220);
}

// gpt-oss's sinks in the fused kernels (the forward's last step; d sink from
// the fallback's per-head sum): with its window, alone (its full-attention
// layers), with documents.
TEST_F(CudaOps, AttentionSinksMatchCpuAndFallback) {
  attention_cases({{2, 300, 8, 2, 64, {}, 128, true},
                   {2, 200, 8, 2, 64, {}, 0, true},
                   {1, 300, 4, 2, 128, {{100, 200}}, 64, true},
                   {1, 200, 4, 2, 256, {}, 0, true}},
                  240);
}

// Gemma 2's attention-logit soft cap in the fused kernels (softcap_scores:
// the scores capped before the masks, dS times 1 - tanh^2): Gemma 2's cap 50
// and head_dim 256, with its sliding window (4096 of 8192 there; 128 of 700
// here) and without (its global layers); a small cap (5) that bends the
// scores harder; head_dim 64, 96 and 128 (Gemma 2 27B); packed documents;
// the cap with sinks (no model has both; the fallback does). q spans +-4c
// (attention_case), so |s| reaches several c. Both kernel sets where the GPU
// has them (wgmma: head_dim 64 and 128 on compute capability 9.0).
TEST_F(CudaOps, AttentionSoftCapMatchesCpuAndFallback) {
  attention_cases({{1, 700, 4, 2, 256, {}, 128, false, 50.f},
                   {1, 700, 4, 2, 256, {}, 0, false, 50.f},
                   {1, 700, 4, 2, 256, {}, 0, false, 5.f},
                   {1, 300, 4, 1, 256, {}, 33, false, 5.f},
                   {2, 300, 8, 2, 64, {}, 0, false, 5.f},
                   {2, 300, 8, 2, 64, {}, 64, false, 50.f},
                   {1, 600, 4, 2, 128, {}, 0, false, 50.f},
                   {1, 600, 4, 2, 128, {}, 200, false, 5.f},
                   {1, 300, 6, 2, 96, {}, 70, false, 5.f}},
                  300);
}

TEST_F(CudaOps, AttentionSoftCapWithPackedDocumentsMatchesCpuAndFallback) {
  attention_cases({{1, 700, 4, 2, 256, {{300, 17, 383}}, 128, false, 50.f},
                   {1, 200, 4, 2, 256, {{16, 17, 100, 67}}, 0, false, 5.f},
                   {2, 300, 4, 2, 128, {{70, 1, 100, 129}, {150, 150}}, 0, false, 50.f},
                   {2, 300, 4, 2, 64, {{70, 1, 100, 129}, {150, 150}}, 64, false, 5.f},
                   {2, 200, 8, 2, 64, {}, 64, true, 5.f}},  // sinks and the cap
                  400);
}

// RAMTRAIN_ATTENTION=masked: windows, sinks and the soft cap through
// cuda::attention_forward / attention_backward run the fallback (bitwise its
// results); plain causal calls run the fused kernels (they differ from the
// fallback in the last bits).
TEST_F(CudaOps, AttentionMaskedSetRunsTheFallbackForWindowsAndSinks) {
  const AttnCase c{1, 200, 4, 2, 64};
  const int64_t window = 50, nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.G * c.D, nl = c.B * c.H * c.T;
  auto q = upload_bf16(random_bf16(nq, 260, -2.f, 2.f)), k = upload_bf16(random_bf16(nkv, 261)),
       v = upload_bf16(random_bf16(nkv, 262)), dout = upload_bf16(random_bf16(nq, 263)),
       sinks = upload_bf16(random_bf16(c.H, 264, -1.f, 3.f));
  DeviceBuffer scratch(rt::cuda::attention_backward_scratch_bytes(c.B, c.T, c.H));
  // [0]: the fallback called directly; [1]: through attention_forward/backward with the masked set
  std::vector<float> res[2][4];
  for (int w : {0, 1, 2}) {
    for (int i = 0; i < 2; ++i) {
      const int64_t win = w == 1 ? window : 0;
      const bf16* sk = w == 0 ? sinks->as<bf16>() : nullptr;  // sinks alone, a window alone, the cap alone
      const float cap = w == 2 ? 1.5f : 0.f;
      auto out = alloc_bf16(nq), lse = alloc_f32(nl), dq = alloc_bf16(nq), dk = alloc_bf16(nkv), dv = alloc_bf16(nkv);
      if (i == 0) {
        rt::cuda::attention_masked_forward(out->as<bf16>(), lse->as<float>(), q->as<bf16>(), k->as<bf16>(),
                                           v->as<bf16>(), c.B, c.T, c.H, c.G, c.D, win, cap, nullptr, nullptr, sk);
        rt::cuda::attention_masked_backward(dq->as<bf16>(), dk->as<bf16>(), dv->as<bf16>(), dout->as<bf16>(),
                                            q->as<bf16>(), k->as<bf16>(), v->as<bf16>(), out->as<bf16>(),
                                            lse->as<float>(), c.B, c.T, c.H, c.G, c.D, win, cap, scratch.scratch(),
                                            nullptr, nullptr, sk);
      } else {
        rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::masked);
        rt::cuda::attention_forward(out->as<bf16>(), lse->as<float>(), q->as<bf16>(), k->as<bf16>(), v->as<bf16>(), c.B,
                                    c.T, c.H, c.G, c.D, nullptr, nullptr, win, sk, cap);
        rt::cuda::attention_backward(dq->as<bf16>(), dk->as<bf16>(), dv->as<bf16>(), dout->as<bf16>(), q->as<bf16>(),
                                     k->as<bf16>(), v->as<bf16>(), out->as<bf16>(), lse->as<float>(), c.B, c.T, c.H,
                                     c.G, c.D, scratch.scratch(), nullptr, nullptr, win, sk, nullptr, cap);
        rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
      }
      res[i][0] = download_bf16(*out, nq);
      res[i][1] = download_f32(*lse, nl);
      res[i][2] = download_bf16(*dq, nq);
      res[i][3] = download_bf16(*dk, nkv);
    }
    const std::string tag = w == 0 ? "sinks" : w == 1 ? "window" : "soft cap";
    EXPECT_EQ(res[1][0], res[0][0]) << tag << ": out is not the fallback's";
    EXPECT_EQ(res[1][1], res[0][1]) << tag << ": lse is not the fallback's";
    EXPECT_EQ(res[1][2], res[0][2]) << tag << ": dq is not the fallback's";
    EXPECT_EQ(res[1][3], res[0][3]) << tag << ": dk is not the fallback's";
  }
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::masked);
  EXPECT_NE(rt::cuda::attention_kernels_in_use(64), rt::cuda::AttentionKernels::masked)
      << "plain causal calls name the fused set they run";
  EXPECT_EQ(rt::cuda::attention_kernels_in_use(64, 1.5f), rt::cuda::AttentionKernels::masked);
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
}

TEST_F(CudaOps, AttentionOtherHeadDimsRunMmaSync) {
  // the rule of ops.h: wgmma has head_dim 64 and 128 only, whatever was chosen
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::wgmma);
  EXPECT_EQ(rt::cuda::attention_kernels_in_use(96), rt::cuda::AttentionKernels::mma_sync);
  EXPECT_EQ(rt::cuda::attention_kernels_in_use(256), rt::cuda::AttentionKernels::mma_sync);
  EXPECT_EQ(rt::cuda::attention_kernels_in_use(128), rt::cuda::AttentionKernels::wgmma);
  EXPECT_EQ(rt::cuda::attention_kernels_in_use(128, 50.f), rt::cuda::AttentionKernels::wgmma);  // the cap too
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
}

// The two kernel sets on one input: the same function up to their own
// roundings; with a soft cap, q in +-4c as attention_case (lse's absolute
// bound scaled as there).
void kernel_sets_agree(float cap) {
  SCOPED_TRACE(::testing::Message() << "softcap " << cap);
  const AttnCase c{2, 300, 4, 2, 128};
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.G * c.D;
  const float qr = cap > 0.f ? 4.f * cap : 2.f;
  auto q = upload_bf16(random_bf16(nq, 7, -qr, qr)), k = upload_bf16(random_bf16(nkv, 8)),
       v = upload_bf16(random_bf16(nkv, 9)), dout = upload_bf16(random_bf16(nq, 10));
  DeviceBuffer scratch(rt::cuda::attention_backward_scratch_bytes(c.B, c.T, c.H));
  std::vector<std::vector<float>> res[2];
  const rt::cuda::AttentionKernels sets[2] = {rt::cuda::AttentionKernels::mma_sync, rt::cuda::AttentionKernels::wgmma};
  for (int i = 0; i < 2; ++i) {
    rt::cuda::set_attention_kernels(sets[i]);
    auto out = alloc_bf16(nq), lse = alloc_f32(c.B * c.H * c.T), dq = alloc_bf16(nq), dk = alloc_bf16(nkv),
         dv = alloc_bf16(nkv);
    rt::cuda::attention_forward(out->as<bf16>(), lse->as<float>(), q->as<bf16>(), k->as<bf16>(), v->as<bf16>(), c.B,
                                c.T, c.H, c.G, c.D, nullptr, nullptr, 0, nullptr, cap);
    rt::cuda::attention_backward(dq->as<bf16>(), dk->as<bf16>(), dv->as<bf16>(), dout->as<bf16>(), q->as<bf16>(),
                                 k->as<bf16>(), v->as<bf16>(), out->as<bf16>(), lse->as<float>(), c.B, c.T, c.H, c.G,
                                 c.D, scratch.scratch(), nullptr, nullptr, 0, nullptr, nullptr, cap);
    res[i] = {download_bf16(*out, nq), download_f32(*lse, c.B * c.H * c.T), download_bf16(*dq, nq),
              download_bf16(*dk, nkv), download_bf16(*dv, nkv)};
  }
  rt::cuda::set_attention_kernels(rt::cuda::AttentionKernels::automatic);
  // out: each side rounds P to bf16 after its own max/sum order: a few bf16 steps apart at most
  expect_close("out wgmma vs mma", res[1][0], res[0][0], 1e-2, 3e-2);
  EXPECT_TRUE(rt::test::expect_near("lse wgmma vs mma", res[1][1], res[0][1], 2e-4, 1e-5 * std::max(1.f, qr / 2.f)));
  const char* names[] = {"dq", "dk", "dv"};
  for (int t = 2; t < 5; ++t)
    expect_close(std::string(names[t - 2]) + " wgmma vs mma", res[1][t], res[0][t], 1e-2, 5e-2);
}

TEST_F(CudaOps, AttentionKernelSetsAgree) {
  if (attention_kernel_sets().size() < 2) GTEST_SKIP() << "the wgmma kernels need compute capability 9.0";
  kernel_sets_agree(0.f);
  kernel_sets_agree(5.f);  // Gemma 2's soft cap (a small one: it bends the scores harder)
}

TEST_F(CudaOps, ErrorsNameTheCall) {
  try {
    CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<void*>(16), 1 << 20, cudaMemcpyDeviceToDevice));
    FAIL() << "expected an error";
  } catch (const rt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaMemcpy(nullptr"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda_ops_test.cpp:"), std::string::npos) << msg;
  }
  cudaGetLastError();
  rt::cuda::Blas blas;
  EXPECT_THROW(blas.matmul_nt(nullptr, rt::cuda::DType::bf16, nullptr, nullptr, 8, 7, 8, 0.f, nullptr), rt::Error);
}

}  // namespace

#else  // !RAMTRAIN_HAVE_CUDA

TEST(CudaOps, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device: built without the CUDA backend (RAMTRAIN_CUDA=OFF)";
}

#endif
