// The CUDA mixture-of-experts ops (cuda/ops.h, cuda/moe.cu) against the CPU
// reference (cpu/moe.h) on the same bf16-rounded inputs, for each family's
// routing: softmax then top-k with norm_topk (Qwen3-MoE, Qwen2-MoE; Mixtral's
// top-k then softmax is the same function), without it (OLMoE), top-1 with
// tied router rows, an expert that never gets a token, a router width E that
// is not a multiple of 8, and the load-balancing gradient dprob; plus the
// Qwen2-MoE shared-expert gate; gpt-oss's variant (router bias, softmax over
// the top-k logits, expert biases, the clamped SwiGLU) with every bias nonzero.
//
// Tolerances (u = 2^-8, the bf16 step relative to a value), as in
// cuda_ops_test.cpp:
//  - router probabilities and their per-expert sums: fp32 results of exact
//    bf16 products with fp32 sums on both sides: rel_l2 <= 1e-5.
//  - tokens per expert: exact (the routing must be the same; the inputs are
//    drawn so that no row's K-th and (K+1)-th probabilities are within 1e-4
//    of each other unless they are exactly tied, far above the ~1e-6 that
//    the summation order changes).
//  - out, dx and the weight gradients: chains with bf16 intermediates (g, u,
//    SwiGLU, d_o, the unweighted d_a, d_g, d_u, the router's dl are bf16 on
//    the GPU, fp32 on the CPU; the GPU's routing-weight gradient is <d_a, a>
//    where the CPU's is <dout, o>, the same sum in another order): rel_l2 <= 1e-2 and max |err| <= 5e-2 * max |ref|,
//    the bound of cuda_ops_test's attention and cross-entropy chains. A token sent to the wrong expert, a wrong weight
//    or a dropped norm_topk term is O(1).
//  - an expert with no token: its weight gradients are untouched (bit-exact).
// Every case runs in both expert GEMM modes (cuda/ops.h MoeBlas): looped and
// grouped each against the CPU with the bounds above; the grouped mode must
// have run all 5 of its grouped calls (no fall-back to the loop), and
//  - grouped vs looped out, element by element: |diff| <= 16 u S[n, c], S the
//    sum over the token's experts of |w| sum_f m_f |Wd[c, f]| (+ |bias|),
//    m_f = |a_f| + |g_f| (|u_f| + 1) from the CPU's fp32 g, u, a. Between the
//    modes g and u are fp32 sums in another order (~2^-24 C relative, far
//    below u) that may round to neighbouring bf16 values (2u |g|, 2u |u|);
//    the SwiGLU's slopes (<= 1.1 |u| in g, |g| in u; the clamped variant's
//    <= 1.5 (|u| + 1)) and its own rounding give |da| <= ~7u m; the down
//    product sums them over f; the grouped mode rounds o to bf16 (u |o|);
//    both final roundings of out add 2u |out| <= 2u S: ~10u S, bounded at
//    16u S. A wrong expert, weight or row is O(|o|), not a few u of S.
//  - the grouped mode twice: out, dx and every gradient bit for bit;
//  - the weight gradients on the call's stream and on 3 lanes (MoeBlas's
//    weight-gradient lanes): the default lanes' bits;
//  - the gate+up weight-gradient pair (MoeBlas's default; off in the other
//    runs here, so that they keep the plain GEMMs' bits): on, one call for each
//    active expert when gate's gradient lies below up's (the engine's
//    layout: HF names in natural order), the same bits on any lane, two
//    GEMMs the other way round (each run against the CPU);
//  - gate and up as one (their weights in one buffer, gate first, the pair
//    on: MoeBlas::merged_gate_up; not with gpt-oss's biases): each mode
//    against the CPU, twice bit for bit (lanes and none), and not taken
//    with the pair off or with up's gradient first;
//  - auto (MoeGemm::by_size) on these small calls: grouped's bits.
// Without a CUDA device every test skips; without CUDA at build time this
// file holds one test that skips.
#include <gtest/gtest.h>

#ifdef RAMTRAIN_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "cuda/check.h"
#include "cuda/device_info.h"
#include "cuda/ops.h"
#include "model/moe_aux.h"
#include "device_buffer.h"
#include "testutil.h"

namespace {

using rt::cuda::bf16;
using rt::test::max_rel_to_scale;
using rt::test::random_vec;
using rt::test::rel_l2;
using namespace rt::gputest;

constexpr double kChainRel = 1e-2, kChainMax = 5e-2;  // chains with bf16 intermediates (header)
constexpr double kExactSumRel = 1e-5;                 // fp32 sums of exact products (header)
constexpr double kModesOutRel = 16.0 / 256;           // grouped vs looped out: 16 u S (header)

class CudaMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (rt::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the CUDA MoE ops are tested on a GPU machine";
  }
};

struct Case {
  int64_t N, C, E, K, F;
  bool norm_topk;
  int idle_expert;   // router row that no token picks (-1: none)
  int tie_a, tie_b;  // router rows made identical (-1: none)
  bool with_dprob;
  uint64_t seed;
  bool gptoss = false;  // router and expert biases, top-k softmax, SwiGLU clamped at 1
};

// Sorted probabilities of a row: the K-th and the (K+1)-th are tied exactly
// or at least `gap` apart (so fp32 summation order cannot flip the routing).
bool routing_is_robust(const float* p, int64_t E, int64_t K, float gap) {
  if (K == E) return true;
  std::vector<float> s(p, p + E);
  std::sort(s.begin(), s.end(), std::greater<float>());
  const float d = s[static_cast<size_t>(K - 1)] - s[static_cast<size_t>(K)];
  return d == 0.f || d >= gap;
}

std::vector<float> download_at(const float* d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> f(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(f.data(), d, f.size() * 4, cudaMemcpyDeviceToHost));
  return f;
}

// What one GPU run of a case leaves: out, dx and every weight gradient.
struct GpuResult {
  std::vector<float> out, dx;
  std::vector<std::vector<float>> grads;  // router, then each expert's gate, up, down
  int64_t grouped_calls = 0;
  int64_t wgrad_pairs = 0;   // gate+up weight-gradient pairs run as one call (MoeBlas::matmul_tn_pair)
  int64_t merged_calls = 0;  // backward calls that took gate and up as one (MoeBlas::merged_gate_up)
};

// S[n, c] = sum over n's experts e (the CPU's routing of probs) of |w_e| (sum
// over f of m_f |Wd_e[c, f]| + |bd_e[c]|), m_f = |a_f| + |g_f| (|u_f| + 1):
// the magnitude the down product and the weighted sum add up for out[n, c],
// in fp32 from the CPU's g, u and a (header: the grouped-vs-looped bound).
std::vector<float> out_scale(const std::vector<float>& x, const std::vector<std::vector<float>>& wg,
                             const std::vector<std::vector<float>>& wu, const std::vector<std::vector<float>>& wd,
                             const std::vector<float>& probs, int64_t N, int64_t C, int64_t E, int64_t K, int64_t F,
                             bool norm_topk, const rt::cpu::MoeVariant& v) {
  std::vector<float> S(static_cast<size_t>(N * C), 0.f), m(static_cast<size_t>(F));
  std::vector<int32_t> idx(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K)), sel(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x.data() + n * C;
    rt::cpu::moe_topk(probs.data() + n * E, E, K, norm_topk && !v.topk_softmax, idx.data(), w.data());
    if (v.topk_softmax) {  // gpt-oss: the softmax of the K selected logits
      float mx = w[0], z = 0.f;
      for (int64_t j = 0; j < K; ++j) z += (sel[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx));
      for (int64_t j = 0; j < K; ++j) w[static_cast<size_t>(j)] = sel[static_cast<size_t>(j)] / z;
    }
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = idx[static_cast<size_t>(j)];
      for (int64_t f = 0; f < F; ++f) {
        float g = v.gate_bias ? v.gate_bias[e][f] : 0.f, u = v.up_bias ? v.up_bias[e][f] : 0.f;
        for (int64_t c = 0; c < C; ++c) {
          g += xn[c] * wg[static_cast<size_t>(e)][static_cast<size_t>(f * C + c)];
          u += xn[c] * wu[static_cast<size_t>(e)][static_cast<size_t>(f * C + c)];
        }
        float a = 0.f;
        if (v.glu_limit > 0.f)
          rt::cpu::swiglu_clamped_forward(&a, &g, &u, 1, v.glu_limit, v.glu_alpha);
        else
          rt::cpu::swiglu_forward(&a, &g, &u, 1);
        m[static_cast<size_t>(f)] = std::fabs(a) + std::fabs(g) * (std::fabs(u) + 1.f);
      }
      for (int64_t c = 0; c < C; ++c) {
        float t = v.down_bias ? std::fabs(v.down_bias[e][c]) : 0.f;
        for (int64_t f = 0; f < F; ++f)
          t += m[static_cast<size_t>(f)] * std::fabs(wd[static_cast<size_t>(e)][static_cast<size_t>(c * F + f)]);
        S[static_cast<size_t>(n * C + c)] += std::fabs(w[static_cast<size_t>(j)]) * t;
      }
    }
  }
  return S;
}

// gpt-oss's clamped SwiGLU: g' = min(g, L), u' = clamp(u, -L, L); the
// gradient passes where the clamp leaves the value alone, so it jumps at +-L.
// True when every gate and up pre-activation of the row's K experts (top-k of
// the router logits in probs) is on the same side of each limit in fp32 (the
// CPU's value) and as the GPU holds it: the GEMM's output rounded to bf16,
// plus the bias, rounded again (cuda/moe.cu add_bias).
bool clamp_branches_are_robust(const float* xn, const float* probs, const std::vector<std::vector<float>>& wg,
                               const std::vector<std::vector<float>>& wu, const std::vector<std::vector<float>>& bg,
                               const std::vector<std::vector<float>>& bu, int64_t C, int64_t E, int64_t K, int64_t F,
                               float limit) {
  std::vector<int32_t> idx(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K));
  rt::cpu::moe_topk(probs, E, K, false, idx.data(), w.data());
  auto rb = [](double v) { return rt::bf16_to_f32(rt::f32_to_bf16(static_cast<float>(v))); };
  auto same_side = [&](double dot, float bias, bool two_sided) {
    const float cpu = static_cast<float>(dot) + bias, gpu = rb(rb(dot) + bias);
    const bool a = cpu <= limit && (!two_sided || cpu >= -limit), b = gpu <= limit && (!two_sided || gpu >= -limit);
    return a == b;
  };
  for (int64_t j = 0; j < K; ++j) {
    const auto e = static_cast<size_t>(idx[static_cast<size_t>(j)]);
    for (int64_t f = 0; f < F; ++f) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < C; ++c) {
        g += static_cast<double>(xn[c]) * wg[e][static_cast<size_t>(f * C + c)];
        u += static_cast<double>(xn[c]) * wu[e][static_cast<size_t>(f * C + c)];
      }
      if (!same_side(g, bg[e][static_cast<size_t>(f)], false) || !same_side(u, bu[e][static_cast<size_t>(f)], true))
        return false;
    }
  }
  return true;
}

void run_case(const Case& k) {
  const int64_t N = k.N, C = k.C, E = k.E, K = k.K, F = k.F;
  // gpt-oss: bf16 biases of size ~0.3 (the router's 0.05: logits stay in the range the idle expert needs)
  std::vector<float> router_bias;
  std::vector<std::vector<float>> bg, bu, bd;
  if (k.gptoss) {
    router_bias = round_bf16(random_vec(E, k.seed + 600, -0.05f, 0.05f));
    for (int64_t e = 0; e < E; ++e) {
      bg.push_back(round_bf16(random_vec(F, k.seed + 610 + e, -0.3f, 0.3f)));
      bu.push_back(round_bf16(random_vec(F, k.seed + 710 + e, -0.3f, 0.3f)));
      bd.push_back(round_bf16(random_vec(C, k.seed + 810 + e, -0.3f, 0.3f)));
    }
  }
  auto cptrs = [](const std::vector<std::vector<float>>& v) {
    std::vector<const float*> p;
    for (auto& t : v) p.push_back(t.data());
    return p;
  };
  const std::vector<const float*> cbg = cptrs(bg), cbu = cptrs(bu), cbd = cptrs(bd);
  const rt::cpu::MoeVariant variant =
      k.gptoss ? rt::cpu::MoeVariant{true, 1.f, 1.702f, router_bias.data(), cbg.data(), cbu.data(), cbd.data()}
               : rt::cpu::MoeVariant{};
  // router: small random rows; the idle expert's logit is -8 x0 <= -8 (x0 >= 1), far below the others (|l| < 1)
  std::vector<float> router = round_bf16(random_vec(E * C, k.seed, -0.05f, 0.05f));
  if (k.idle_expert >= 0) {
    std::fill(router.begin() + k.idle_expert * C, router.begin() + (k.idle_expert + 1) * C, 0.f);
    router[static_cast<size_t>(k.idle_expert * C)] = -8.f;
  }
  if (k.tie_a >= 0) {  // a strong shared direction, so that the tied pair is often at the top
    for (int64_t c = 0; c < C; ++c) router[static_cast<size_t>(k.tie_a * C + c)] *= 6.f;
    router = round_bf16(router);
    std::copy(router.begin() + k.tie_a * C, router.begin() + (k.tie_a + 1) * C, router.begin() + k.tie_b * C);
  }
  std::vector<std::vector<float>> wg, wu, wd, gg0, gu0, gd0;
  for (int64_t e = 0; e < E; ++e) {
    wg.push_back(round_bf16(random_vec(F * C, k.seed + 10 + e, -0.2f, 0.2f)));
    wu.push_back(round_bf16(random_vec(F * C, k.seed + 100 + e, -0.2f, 0.2f)));
    wd.push_back(round_bf16(random_vec(C * F, k.seed + 200 + e, -0.2f, 0.2f)));
    gg0.push_back(random_vec(F * C, k.seed + 300 + e));  // initial gradients: the ops accumulate
    gu0.push_back(random_vec(F * C, k.seed + 400 + e));
    gd0.push_back(random_vec(C * F, k.seed + 500 + e));
  }
  // x: rows redrawn until the routing is robust (see routing_is_robust) and, for gpt-oss, until no gate or
  // up pre-activation of the row's experts changes its side of the clamp (+-limit) when rounded as
  // the GPU holds it (clamp_branches_are_robust): the clamp's derivative jumps there, so a value
  // within bf16 rounding of the limit would turn a rounding difference into a whole term
  std::vector<float> x(static_cast<size_t>(N * C)), probs(static_cast<size_t>(N * E));
  for (int64_t n = 0; n < N; ++n) {
    for (uint64_t attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 100u) << "no robust routing for row " << n << "; change the seed";
      std::vector<float> row = round_bf16(random_vec(C, k.seed * 1000003 + n * 131 + attempt, -1.f, 1.f));
      row[0] = rt::bf16_to_f32(rt::f32_to_bf16(1.f + std::fabs(row[0])));  // x0 >= 1 (idle expert)
      std::copy(row.begin(), row.end(), x.begin() + n * C);
      rt::cpu::moe_forward(nullptr, probs.data() + n * E, x.data() + n * C, router.data(), nullptr, nullptr, nullptr, 1,
                           C, E, K, F, k.norm_topk, nullptr, nullptr, variant);
      if (routing_is_robust(probs.data() + n * E, E, K, 1e-4f) &&
          (!k.gptoss || clamp_branches_are_robust(x.data() + n * C, probs.data() + n * E, wg, wu, bg, bu, C, E, K, F,
                                                  1.f)))
        break;
    }
  }
  const std::vector<float> dout = round_bf16(random_vec(N * C, k.seed + 7));
  const std::vector<float> grouter0 = random_vec(E * C, k.seed + 8);
  std::vector<float> dprob;
  if (k.with_dprob) dprob = random_vec(E, k.seed + 9, 0.f, 0.5f);

  // CPU reference
  auto ptrs = [](std::vector<std::vector<float>>& v) {
    std::vector<float*> p;
    for (auto& t : v) p.push_back(t.data());
    return p;
  };
  std::vector<float*> pg = ptrs(wg), pu = ptrs(wu), pd = ptrs(wd);
  std::vector<const float*> cg(pg.begin(), pg.end()), cu(pu.begin(), pu.end()), cd(pd.begin(), pd.end());
  std::vector<float> ref_out(static_cast<size_t>(N * C)), ref_probs(probs.size());
  std::vector<int64_t> ref_tokens(static_cast<size_t>(E), 0);
  std::vector<double> ref_psum(static_cast<size_t>(E), 0.0);
  // row by row, as the robustness check above computed the router: the CPU
  // matmul may order a row's sums differently in a many-row call, which would
  // break the exact ties of identical router rows that the check accepted
  for (int64_t n = 0; n < N; ++n)
    rt::cpu::moe_forward(ref_out.data() + n * C, ref_probs.data() + n * E, x.data() + n * C, router.data(), cg.data(),
                         cu.data(), cd.data(), 1, C, E, K, F, k.norm_topk, ref_tokens.data(), ref_psum.data(), variant);
  auto ref_gg = gg0, ref_gu = gu0, ref_gd = gd0;
  std::vector<float> ref_grouter = grouter0, ref_dx(static_cast<size_t>(N * C));
  std::vector<float*> rgg = ptrs(ref_gg), rgu = ptrs(ref_gu), rgd = ptrs(ref_gd);
  // gpt-oss's bias gradients, from zero (the ops accumulate)
  std::vector<float> ref_grb(k.gptoss ? E : 0, 0.f);
  std::vector<std::vector<float>> ref_gbg, ref_gbu, ref_gbd;
  for (int64_t e = 0; e < (k.gptoss ? E : 0); ++e) {
    ref_gbg.emplace_back(F, 0.f);
    ref_gbu.emplace_back(F, 0.f);
    ref_gbd.emplace_back(C, 0.f);
  }
  std::vector<float*> rgbg = ptrs(ref_gbg), rgbu = ptrs(ref_gbu), rgbd = ptrs(ref_gbd);
  const rt::MoeBiasGrads ref_bias_grads =
      k.gptoss ? rt::MoeBiasGrads{ref_grb.data(), rgbg.data(), rgbu.data(), rgbd.data()} : rt::MoeBiasGrads{};
  rt::cpu::moe_backward(ref_dx.data(), ref_grouter.data(), rgg.data(), rgu.data(), rgd.data(), dout.data(), x.data(),
                        ref_probs.data(), router.data(), cg.data(), cu.data(), cd.data(), N, C, E, K, F, k.norm_topk,
                        k.with_dprob ? dprob.data() : nullptr, variant, ref_bias_grads);
  if (k.idle_expert >= 0) {
    ASSERT_EQ(ref_tokens[static_cast<size_t>(k.idle_expert)], 0) << "the idle expert got tokens";
  }

  // GPU, in one expert GEMM mode (cuda/ops.h MoeBlas), against the CPU
  // lanes: the weight-gradient lanes (MoeBlas); -1 leaves the default.
  // Each expert's gate and up gradients share one buffer, gate first (the
  // weight-gradient pair's layout) or up first (up_first: two GEMMs); pair:
  // the gate+up weight-gradient pair on (MoeBlas::matmul_tn_pair). joint:
  // each expert's gate and up weights in one buffer, gate first (the
  // engine's layout), so that with the pair on (and gate's gradient first)
  // the backward takes gate and up as one (MoeBlas::merged_gate_up).
  auto gpu_run = [&](rt::cuda::MoeGemm mode, int lanes = -1, bool up_first = false, bool pair = false,
                     bool joint = false) {
    rt::cuda::MoeBlas blas;
    blas.set_gemm_mode(mode);
    blas.set_wgrad_pair(pair);
    if (lanes >= 0) blas.set_wgrad_lanes(lanes);
    const rt::cuda::MoeDims d{N, C, E, K, F, k.norm_topk, k.gptoss, k.gptoss ? 1.f : 0.f, k.gptoss ? 1.702f : 1.f};
    // gpt-oss's biases on the device, and their gradients from zero
    std::vector<std::unique_ptr<DeviceBuffer>> dbg, dbu, dbd, dgbg, dgbu, dgbd;
    std::vector<const bf16*> pbg, pbu, pbd;
    std::vector<float*> pgbg, pgbu, pgbd;
    auto d_rb = k.gptoss ? upload_bf16(router_bias) : nullptr;
    auto d_grb = k.gptoss ? upload_f32(std::vector<float>(E, 0.f)) : nullptr;
    for (int64_t e = 0; e < (k.gptoss ? E : 0); ++e) {
      dbg.push_back(upload_bf16(bg[e]));
      dbu.push_back(upload_bf16(bu[e]));
      dbd.push_back(upload_bf16(bd[e]));
      dgbg.push_back(upload_f32(std::vector<float>(F, 0.f)));
      dgbu.push_back(upload_f32(std::vector<float>(F, 0.f)));
      dgbd.push_back(upload_f32(std::vector<float>(C, 0.f)));
      pbg.push_back(dbg.back()->as<bf16>());
      pbu.push_back(dbu.back()->as<bf16>());
      pbd.push_back(dbd.back()->as<bf16>());
      pgbg.push_back(dgbg.back()->as<float>());
      pgbu.push_back(dgbu.back()->as<float>());
      pgbd.push_back(dgbd.back()->as<float>());
    }
    const rt::MoeBiasesT<bf16> biases =
        k.gptoss ? rt::MoeBiasesT<bf16>{d_rb->as<bf16>(), pbg.data(), pbu.data(), pbd.data()} : rt::MoeBiasesT<bf16>{};
    const rt::MoeBiasGrads bias_grads =
        k.gptoss ? rt::MoeBiasGrads{d_grb->as<float>(), pgbg.data(), pgbu.data(), pgbd.data()} : rt::MoeBiasGrads{};
    DeviceBuffer scratch(rt::cuda::moe_scratch_bytes(d));
    scratch.poison();
    auto d_x = upload_bf16(x), d_router = upload_bf16(router), d_dout = upload_bf16(dout);
    std::vector<std::unique_ptr<DeviceBuffer>> dwg, dwd, dggu, dgd;
    std::vector<const bf16*> pwg, pwu, pwd;
    std::vector<float*> pgg, pgu, pgd;
    for (int64_t e = 0; e < E; ++e) {
      // one buffer each expert: gate then up (joint), or up then gate, so
      // that up never follows gate (separate allocations may be adjacent)
      std::vector<float> both = joint ? wg[e] : wu[e];
      both.insert(both.end(), (joint ? wu[e] : wg[e]).begin(), (joint ? wu[e] : wg[e]).end());
      dwg.push_back(upload_bf16(both));
      dwd.push_back(upload_bf16(wd[e]));
      std::vector<float> gu_pair = up_first ? gu0[e] : gg0[e];
      gu_pair.insert(gu_pair.end(), (up_first ? gg0[e] : gu0[e]).begin(), (up_first ? gg0[e] : gu0[e]).end());
      dggu.push_back(upload_f32(gu_pair));
      dgd.push_back(upload_f32(gd0[e]));
      pwg.push_back(dwg.back()->as<bf16>() + (joint ? 0 : F * C));
      pwu.push_back(dwg.back()->as<bf16>() + (joint ? F * C : 0));
      pwd.push_back(dwd.back()->as<bf16>());
      pgg.push_back(dggu.back()->as<float>() + (up_first ? F * C : 0));
      pgu.push_back(dggu.back()->as<float>() + (up_first ? 0 : F * C));
      pgd.push_back(dgd.back()->as<float>());
    }
    DeviceBuffer out(static_cast<size_t>(N * C) * 2), d_probs(static_cast<size_t>(N * E) * 4),
        dx(static_cast<size_t>(N * C) * 2);
    out.poison();
    d_probs.poison();
    dx.poison();
    auto d_grouter = upload_f32(grouter0);
    // the routing statistics and dprob live on the device (added to: from zero)
    auto d_tokens = upload(std::vector<int64_t>(static_cast<size_t>(E), 0));
    auto d_psum = upload(std::vector<double>(static_cast<size_t>(E), 0.0));
    auto d_dprob = k.with_dprob ? upload_f32(dprob) : nullptr;
    rt::cuda::moe_forward(blas, out.as<bf16>(), d_probs.as<float>(), d_x->as<bf16>(), d_router->as<bf16>(), pwg.data(),
                          pwu.data(), pwd.data(), d, d_tokens->as<int64_t>(), d_psum->as<double>(), scratch.scratch(),
                          nullptr, biases);
    const std::vector<int64_t> tokens = download<int64_t>(*d_tokens, E);
    const std::vector<double> psum = download<double>(*d_psum, E);
    EXPECT_EQ(tokens, ref_tokens);
    std::vector<float> psum_f(psum.begin(), psum.end()), ref_psum_f(ref_psum.begin(), ref_psum.end());
    expect_close("prob_sum", psum_f, ref_psum_f, kExactSumRel, kExactSumRel);
    expect_close("probs", download_f32(d_probs, N * E), ref_probs, kExactSumRel, kExactSumRel);
    expect_close("out", download_bf16(out, N * C), ref_out, kChainRel, kChainMax);

    // backward from the GPU's own probabilities (as the block does), after a
    // router-only forward (the recompute's call) rewrote them
    rt::cuda::moe_forward(blas, nullptr, d_probs.as<float>(), d_x->as<bf16>(), d_router->as<bf16>(), pwg.data(),
                          pwu.data(), pwd.data(), d, nullptr, nullptr, scratch.scratch(), nullptr, biases);
    scratch.poison();
    rt::cuda::moe_backward(blas, dx.as<bf16>(), d_grouter->as<float>(), pgg.data(), pgu.data(), pgd.data(),
                           d_dout->as<bf16>(), d_x->as<bf16>(), d_probs.as<float>(), d_router->as<bf16>(), pwg.data(),
                           pwu.data(), pwd.data(), d, k.with_dprob ? d_dprob->as<float>() : nullptr, scratch.scratch(),
                           nullptr, biases, bias_grads);
    expect_close("dx", download_bf16(dx, N * C), ref_dx, kChainRel, kChainMax);
    // the accumulated part of each weight gradient (what the op added)
    auto added = [](std::vector<float> after, const std::vector<float>& before) {
      for (size_t i = 0; i < after.size(); ++i) after[i] -= before[i];
      return after;
    };
    expect_close("drouter", added(download_f32(*d_grouter, E * C), grouter0), added(ref_grouter, grouter0), kChainRel,
                 kChainMax);
    for (int64_t e = 0; e < E; ++e) {
      const std::string en = "expert " + std::to_string(e);
      const auto got_g = download_at(pgg[static_cast<size_t>(e)], F * C),
                 got_u = download_at(pgu[static_cast<size_t>(e)], F * C), got_d = download_f32(*dgd[e], C * F);
      if (ref_tokens[static_cast<size_t>(e)] == 0) {  // untouched, bit for bit
        EXPECT_EQ(got_g, gg0[e]) << en;
        EXPECT_EQ(got_u, gu0[e]) << en;
        EXPECT_EQ(got_d, gd0[e]) << en;
        continue;
      }
      expect_close(en + " dgate", added(got_g, gg0[e]), added(ref_gg[e], gg0[e]), kChainRel, kChainMax);
      expect_close(en + " dup", added(got_u, gu0[e]), added(ref_gu[e], gu0[e]), kChainRel, kChainMax);
      expect_close(en + " ddown", added(got_d, gd0[e]), added(ref_gd[e], gd0[e]), kChainRel, kChainMax);
      if (k.gptoss) {  // column sums of the same bf16 chains
        expect_close(en + " dgate bias", download_f32(*dgbg[e], F), ref_gbg[e], kChainRel, kChainMax);
        expect_close(en + " dup bias", download_f32(*dgbu[e], F), ref_gbu[e], kChainRel, kChainMax);
        expect_close(en + " ddown bias", download_f32(*dgbd[e], C), ref_gbd[e], kChainRel, kChainMax);
      }
    }
    if (k.gptoss) expect_close("drouter bias", download_f32(*d_grb, E), ref_grb, kChainRel, kChainMax);
    // what the other mode and the rerun compare (every gradient includes its initial value)
    GpuResult r;
    r.out = download_bf16(out, N * C);
    r.dx = download_bf16(dx, N * C);
    r.grads.push_back(download_f32(*d_grouter, E * C));
    for (int64_t e = 0; e < E; ++e) {
      r.grads.push_back(download_at(pgg[static_cast<size_t>(e)], F * C));
      r.grads.push_back(download_at(pgu[static_cast<size_t>(e)], F * C));
      r.grads.push_back(download_f32(*dgd[e], C * F));
    }
    r.grouped_calls = blas.grouped_calls();
    r.wgrad_pairs = blas.wgrad_pairs();
    r.merged_calls = blas.merged_calls();
    return r;
  };
  const GpuResult looped = gpu_run(rt::cuda::MoeGemm::looped);
  const GpuResult grouped = gpu_run(rt::cuda::MoeGemm::grouped);
  EXPECT_EQ(looped.grouped_calls, 0);
  // forward: gate+up, down; router-only forward: none; backward: gate+up, d_a, the input gradients
  EXPECT_EQ(grouped.grouped_calls, 5) << "the grouped mode fell back to the loop";
  EXPECT_EQ(grouped.wgrad_pairs, 0) << "the weight-gradient pair ran while off";
  // grouped against looped, element by element (header: 16 u S)
  const std::vector<float> scale = out_scale(x, wg, wu, wd, ref_probs, N, C, E, K, F, k.norm_topk, variant);
  int bad = 0;
  for (int64_t i = 0; i < N * C; ++i) {
    const double diff =
        std::fabs(static_cast<double>(grouped.out[static_cast<size_t>(i)]) - looped.out[static_cast<size_t>(i)]);
    if (!(diff <= kModesOutRel * scale[static_cast<size_t>(i)]) && bad++ < 5)
      ADD_FAILURE() << "out[" << i / C << ", " << i % C << "]: grouped " << grouped.out[static_cast<size_t>(i)]
                    << ", looped " << looped.out[static_cast<size_t>(i)] << ", bound "
                    << kModesOutRel * scale[static_cast<size_t>(i)];
  }
  EXPECT_EQ(bad, 0) << "out elements past the grouped-vs-looped bound";
  // deterministic: the grouped mode again, bit for bit
  const GpuResult again = gpu_run(rt::cuda::MoeGemm::grouped);
  EXPECT_TRUE(again.out == grouped.out) << "grouped out differs between two runs";
  EXPECT_TRUE(again.dx == grouped.dx) << "grouped dx differs between two runs";
  EXPECT_TRUE(again.grads == grouped.grads) << "grouped weight gradients differ between two runs";
  // the weight gradients on the call's stream and on 3 lanes (experts
  // spread unevenly): the same GEMMs, so the same bits
  const GpuResult no_lanes = gpu_run(rt::cuda::MoeGemm::grouped, 0);
  const GpuResult three_lanes = gpu_run(rt::cuda::MoeGemm::grouped, 3);
  EXPECT_TRUE(no_lanes.out == grouped.out && no_lanes.dx == grouped.dx && no_lanes.grads == grouped.grads)
      << "the weight gradients on the call's stream differ from the default lanes'";
  EXPECT_TRUE(three_lanes.out == grouped.out && three_lanes.dx == grouped.dx && three_lanes.grads == grouped.grads)
      << "the weight gradients on 3 lanes differ from the default lanes'";
  // the gate+up weight-gradient pair on: one call for every expert with
  // tokens (gate's gradient below up's), two GEMMs where up's lies below
  // gate's; each run against the CPU inside gpu_run; both modes
  const int64_t active = E - std::count(ref_tokens.begin(), ref_tokens.end(), int64_t{0});
  EXPECT_EQ(gpu_run(rt::cuda::MoeGemm::looped, -1, false, true).wgrad_pairs, active);
  const GpuResult paired = gpu_run(rt::cuda::MoeGemm::grouped, -1, false, true);
  EXPECT_EQ(paired.wgrad_pairs, active);
  const GpuResult paired_lanes = gpu_run(rt::cuda::MoeGemm::grouped, 0, false, true);
  EXPECT_TRUE(paired_lanes.grads == paired.grads) << "the pair on the call's stream differs from the lanes'";
  EXPECT_EQ(gpu_run(rt::cuda::MoeGemm::grouped, -1, true, true).wgrad_pairs, 0)
      << "a pair ran with up's gradient below gate's";
  EXPECT_EQ(paired.merged_calls, 0) << "gate and up taken as one with their weights apart";
  // gate and up as one (the engine's layout, the pair on): one input-gradient
  // product of width 2F and one weight-gradient GEMM per expert; each run
  // against the CPU inside gpu_run, in both modes, bit for bit again, the
  // same bits on any lane, and not taken with the pair off or up's gradient first
  for (const auto mode : {rt::cuda::MoeGemm::looped, rt::cuda::MoeGemm::grouped}) {
    const GpuResult joint = gpu_run(mode, -1, false, true, true);
    // gpt-oss's gate and up biases keep them apart (their gradients are column sums of d_g, d_u)
    EXPECT_EQ(joint.merged_calls, k.gptoss ? 0 : 1) << "gate and up as one, with biases: " << k.gptoss;
    EXPECT_EQ(joint.wgrad_pairs, k.gptoss ? active : 0);
    if (mode == rt::cuda::MoeGemm::grouped) {
      EXPECT_EQ(joint.grouped_calls, 5);
    }
    const GpuResult joint_again = gpu_run(mode, 0, false, true, true);
    EXPECT_TRUE(joint_again.out == joint.out && joint_again.dx == joint.dx && joint_again.grads == joint.grads)
        << "gate and up as one differ between two runs (the default lanes, then none)";
  }
  EXPECT_EQ(gpu_run(rt::cuda::MoeGemm::grouped, -1, false, false, true).merged_calls, 0)
      << "gate and up taken as one with the pair off";
  EXPECT_EQ(gpu_run(rt::cuda::MoeGemm::grouped, -1, true, true, true).merged_calls, 0)
      << "gate and up taken as one with up's gradient first";
  // auto (MoeGemm::by_size): these calls' expert GEMMs are far below
  // kMoeGroupedMaxWork, so it runs grouped: the grouped results bit for bit
  ASSERT_TRUE(rt::cuda::moe_small_experts(N, K, E, C, F));
  const GpuResult by_size = gpu_run(rt::cuda::MoeGemm::by_size);
  EXPECT_EQ(by_size.grouped_calls, grouped.grouped_calls) << "auto did not run the small groups grouped";
  EXPECT_TRUE(by_size.out == grouped.out && by_size.dx == grouped.dx && by_size.grads == grouped.grads)
      << "auto differs from grouped on calls it should run grouped";
}

// Qwen3-MoE / Qwen2-MoE / Mixtral routing: softmax, top-k, renormalised;
// expert 5 never routed to; the load-balancing gradient on.
TEST_F(CudaMoe, NormTopkMatchesCpu) { run_case({96, 64, 8, 2, 48, true, 5, -1, -1, true, 11}); }

// OLMoE routing: softmax, top-k, not renormalised; E = 6 (not a multiple of 8), K = 3.
TEST_F(CudaMoe, PlainTopkMatchesCpu) { run_case({80, 32, 6, 3, 24, false, 2, -1, -1, true, 12}); }

// Top-1 with router rows 1 and 4 identical: every tie goes to expert 1
// (tokens per expert compared exactly), without dprob.
TEST_F(CudaMoe, TiesGoToTheLowerExpert) {
  run_case({64, 32, 5, 1, 16, true, -1, 1, 4, false, 13});
  run_case({64, 32, 5, 2, 16, false, -1, 1, 4, false, 14});
}

// A token count that is not a multiple of 8 and an expert width that is odd.
TEST_F(CudaMoe, OddShapesMatchCpu) { run_case({37, 40, 8, 2, 20, true, 7, -1, -1, true, 15}); }

// gpt-oss: router bias, softmax over the top-4 logits, expert biases, SwiGLU clamped at 1; an idle expert.
TEST_F(CudaMoe, GptOssVariantMatchesCpu) { run_case({96, 64, 8, 4, 48, false, 5, -1, -1, false, 16, true}); }

// Widths that are not multiples of the GEMM tiles (C = 520, F = 136), with
// experts of about two 128-row chunks: the weight gradients' and products'
// tiles cut at both edges.
TEST_F(CudaMoe, TileEdgeWidthsMatchCpu) { run_case({400, 520, 4, 2, 136, true, -1, -1, -1, true, 18}); }

// Experts with several kMoeChunk-row chunks (~330 rows each over 3 experts,
// chunks of 128): the grouped mode's batched chunks, their padded tails and
// an idle expert's (no rows, no chunk) neighbours.
TEST_F(CudaMoe, ExpertsOfSeveralChunksMatchCpu) {
  static_assert(rt::cuda::kMoeChunk == 128, "the case below sizes its experts in 128-row chunks");
  run_case({500, 64, 4, 2, 48, true, 2, -1, -1, true, 17});
}

// The load-balancing loss on the device (cuda::moe_aux_finish) against its
// CPU spec, MoeAux::finish (model/moe_aux.h), on two micro-batches' counts
// and sums: the same fp64 operations in the same order, so dprob, the step's
// weighted loss and tokens are equal bit for bit (no tolerance).
TEST_F(CudaMoe, AuxFinishMatchesMoeAuxBitForBit) {
  rt::ModelSpec s;
  s.n_layers = 3;
  s.moe.n_experts = 6;
  const int64_t L = s.n_layers, E = s.moe.n_experts, N = 37;
  const double weight = 0.01 * 0.5;  // router_aux_loss_coef times the micro-batch's share
  const float aux_scale = 0.5f;
  auto d_tokens = upload(std::vector<int64_t>(static_cast<size_t>(L * E), 0));
  auto d_aux = upload(std::vector<double>(1, 0.0));
  DeviceBuffer d_dprob(static_cast<size_t>(E) * 4);
  double ref_aux = 0;
  std::vector<int64_t> ref_step_tokens(static_cast<size_t>(L * E), 0);
  std::vector<float> ref_dprob;
  for (int micro = 0; micro < 2; ++micro) {
    rt::MoeAux a(s);
    a.begin();
    std::vector<int64_t> tok(static_cast<size_t>(L * E));
    std::vector<double> psum(static_cast<size_t>(L * E));
    const auto pr = random_vec(L * E, 40 + micro, 0.f, 1.f);
    for (int64_t l = 0; l < L; ++l) {
      rt::MoeLayerRouting r = a.forward_routing(l);
      for (int64_t e = 0; e < E; ++e) {
        const size_t i = static_cast<size_t>(l * E + e);
        tok[i] = (l * 7 + e * 3 + micro) % 11;
        psum[i] = static_cast<double>(pr[i]) * static_cast<double>(N) / 3.0;
        r.tokens_per_expert[e] += tok[i];
        r.prob_sum[e] += psum[i];
      }
    }
    ref_aux += a.finish(N, weight) * aux_scale;
    for (size_t i = 0; i < ref_step_tokens.size(); ++i) ref_step_tokens[i] += tok[i];
    const float* dp = a.backward_routing().dprob;
    ref_dprob.assign(dp, dp + E);
    auto d_tok = upload(tok);
    auto d_psum = upload(psum);
    rt::cuda::moe_aux_finish(d_dprob.as<float>(), d_tokens->as<int64_t>(), d_aux->as<double>(), d_tok->as<int64_t>(),
                             d_psum->as<double>(), L, E, N, weight, aux_scale, nullptr);
    EXPECT_EQ(download<float>(d_dprob, E), ref_dprob) << "dprob, micro-batch " << micro;
  }
  EXPECT_EQ(download<int64_t>(*d_tokens, L * E), ref_step_tokens);
  EXPECT_EQ(download<double>(*d_aux, 1)[0], ref_aux);
}

// Qwen2-MoE's shared-expert gate: y += sigmoid(z) o and its backward.
TEST_F(CudaMoe, SharedGateMatchesCpu) {
  const int64_t N = 48, C = 64;
  const auto y0 = round_bf16(random_vec(N * C, 21)), o = round_bf16(random_vec(N * C, 22)),
             dy = round_bf16(random_vec(N * C, 23));
  const auto z = random_vec(N, 24, -3.f, 3.f);
  std::vector<float> ref_y = y0, ref_do(static_cast<size_t>(N * C)), ref_dz(static_cast<size_t>(N));
  rt::cpu::moe_shared_gate_forward(ref_y.data(), o.data(), z.data(), N, C);
  rt::cpu::moe_shared_gate_backward(ref_do.data(), ref_dz.data(), dy.data(), o.data(), z.data(), N, C);
  auto d_y = upload_bf16(y0), d_o = upload_bf16(o), d_dy = upload_bf16(dy), d_z = upload_f32(z);
  DeviceBuffer d_do(static_cast<size_t>(N * C) * 2), d_dz(static_cast<size_t>(N) * 2);
  d_do.poison();
  d_dz.poison();
  rt::cuda::moe_shared_gate_forward(d_y->as<bf16>(), d_o->as<bf16>(), d_z->as<float>(), N, C, nullptr);
  rt::cuda::moe_shared_gate_backward(d_do.as<bf16>(), d_dz.as<bf16>(), d_dy->as<bf16>(), d_o->as<bf16>(),
                                     d_z->as<float>(), N, C, nullptr);
  // one final bf16 rounding of an fp32 result: |err| <= u |ref| elementwise
  // (rel_l2 <= 4e-3 as cuda_ops_test's single roundings); dz is a dot product
  // rounded once, the same bound
  expect_close("y", download_bf16(*d_y, N * C), ref_y, 4e-3, 8e-3);
  expect_close("d_o", download_bf16(d_do, N * C), ref_do, 4e-3, 8e-3);
  expect_close("dz", download_bf16(d_dz, N), ref_dz, 4e-3, 8e-3);
}

}  // namespace

#else

TEST(CudaMoe, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
