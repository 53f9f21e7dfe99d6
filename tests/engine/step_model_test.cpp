// The step time model (engine/step_model.h) without a GPU: its parts add up
// to the step by the stated rule, FLOPs and bytes follow the formulas of the
// header recomputed here from the spec, layer-major moves fewer weight bytes
// than micro-batch-major, and the delayed update hides more of the optimizer.
#include "engine/step_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "model/spec.h"
#include "model/weight_map.h"

namespace {

rt::ModelSpec spec() {
  rt::ModelSpec s;
  s.hidden = 256;
  s.intermediate = 512;
  s.n_layers = 6;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 1000;
  s.max_positions = 4096;
  return s;
}

rt::CardSpec card() {
  rt::CardSpec c;
  EXPECT_TRUE(rt::card_lookup("rtx4090", &c));
  return c;
}

// Relative tolerance of the checks below: the same double formulas summed in
// another order (no rounding beyond a few ulps).
constexpr double kRel = 1e-12;

TEST(StepModel, PartsAddUpToTheStep) {
  const rt::ModelSpec s = spec();
  for (bool delayed : {false, true})
    for (int64_t K : {1, 4}) {
      rt::CudaOptions o;
      o.delayed_update = delayed;
      o.micro_batches = K;
      o.grads = "device";
      const rt::DevicePlan dp = rt::fit_device_plan(s, 2, 512, o, 1ull << 34);
      const rt::StepPrediction p = rt::predict_step(s, 2, 512, dp, card(), 4.0);
      const double core = std::max(p.compute_s, p.copies_s);
      EXPECT_NEAR(p.step_s, core + p.optimizer_exposed_s, kRel * p.step_s);
      EXPECT_NEAR(p.optimizer_exposed_s, std::max(0.0, p.optimizer_s - p.overlap_s), kRel * p.step_s);
      EXPECT_NEAR(p.optimizer_s, static_cast<double>(s.params_total()) / 4e9, kRel * p.optimizer_s);
      if (delayed)
        EXPECT_NEAR(p.overlap_s, core, kRel * core);
      else
        EXPECT_LT(p.overlap_s, core);  // only the next forward
      const double tokens = static_cast<double>(K * 2 * 512);
      EXPECT_NEAR(p.tokens_per_s, tokens / p.step_s, kRel * p.tokens_per_s);
      EXPECT_NEAR(p.model_tflops, p.tokens_per_s * p.model_flops_per_token / 1e12, kRel * p.model_tflops);
      EXPECT_NEAR(p.compute_s, tokens * p.hardware_flops_per_token / (card().bf16_tflops * 1e12 * p.efficiency),
                  kRel * p.compute_s);
    }
}

TEST(StepModel, FlopsFollowTheFormula) {
  const rt::ModelSpec s = spec();
  const double L = 6, T = 512;
  const double n_layer = static_cast<double>(s.params_per_layer());
  const double model = 6 * (n_layer * L + 1000.0 * 256) + 6 * L * 4 * 64 * T;
  EXPECT_NEAR(rt::model_flops_per_token(s, 512), model, kRel * model);
  // three recomputed layers: three more block forwards (2 N_layer + 2 H D T each)
  const double hw = model + 3 * (2 * n_layer + 2 * 4 * 64 * T);
  EXPECT_NEAR(rt::hardware_flops_per_token(s, 512, 3), hw, kRel * hw);
}

// MoE: a token runs the router and its top-k experts, not all of them. A
// model of E experts of width F with top-k costs what the dense model of
// width k F costs, plus the router (E x C per layer).
TEST(StepModel, MoeFlopsCountTheActiveExperts) {
  rt::ModelSpec dense = spec();
  dense.intermediate = 2 * 48;
  rt::ModelSpec moe = spec();
  moe.architecture = "MixtralForCausalLM";
  moe.moe.n_experts = 8;
  moe.moe.top_k = 2;
  moe.moe.expert_intermediate = 48;
  ASSERT_TRUE(moe.is_moe());
  const double router = 6.0 * 6 * 8 * static_cast<double>(moe.hidden);
  for (int64_t T : {512, 4096}) {
    const double want = rt::model_flops_per_token(dense, T) + router;
    EXPECT_NEAR(rt::model_flops_per_token(moe, T), want, kRel * want) << T;
    // a recomputed MoE layer repeats the active layer's forward: 2 N_active + 2 H D T
    const double hw_want = rt::hardware_flops_per_token(dense, T, 2) + router + 2 * 2.0 * 8 * moe.hidden;
    EXPECT_NEAR(rt::hardware_flops_per_token(moe, T, 2), hw_want, kRel * hw_want) << T;
  }
}

// MoE: the routed experts' work takes longer than the same FLOPs of dense
// work (kMoeExpertShareOfDense and kMoeWeightGradCallS in step_model.cpp):
// the prediction's compute is the dense rule on the hardware FLOPs plus an
// excess that grows with the routed experts' parameters per token (top_k x 3
// x hidden x width x layers) by more than their 4/3 P_e of recompute (gate
// and up) in every backward, and a part that depends only on the count of expert weight
// gradients (3 per expert and layer call: the same for both widths here).
TEST(StepModel, MoeExpertsRunSlowerThanDenseWork) {
  auto moe_spec = [](int64_t width) {
    rt::ModelSpec m = spec();
    m.architecture = "MixtralForCausalLM";
    m.moe.n_experts = 8;
    m.moe.top_k = 2;
    m.moe.expert_intermediate = width;
    return m;
  };
  double excess[2] = {}, pes[2] = {}, rate = 0;
  int i = 0;
  for (int64_t width : {48, 96}) {
    const rt::ModelSpec m = moe_spec(width);
    ASSERT_TRUE(m.is_moe());
    rt::CudaOptions o;
    o.grads = "device";
    const rt::DevicePlan dp = rt::fit_device_plan(m, 2, 512, o, 1ull << 34);
    const rt::StepPrediction p = rt::predict_step(m, 2, 512, dp, card(), 4.0);
    const double tokens = 2 * 512;
    rate = card().bf16_tflops * 1e12 * p.efficiency;
    const double dense = tokens * p.hardware_flops_per_token / rate;
    pes[i] = 2.0 * 3 * 256 * static_cast<double>(width) * 6;  // top_k x 3 x hidden x width x layers
    EXPECT_GT(p.compute_s - dense, tokens * (4.0 / 3.0) * pes[i] / rate) << width;
    excess[i++] = p.compute_s - dense;
  }
  // per token and P_e, the widening costs more than the recompute's 4/3 FLOPs at the dense rate
  EXPECT_GT((excess[1] - excess[0]) / (pes[1] - pes[0]), (4.0 / 3.0) * 2 * 512 / rate);
}

TEST(StepModel, LayerMajorMovesTheWeightsOncePerStep) {
  const rt::ModelSpec s = spec();
  const int64_t K = 8;
  rt::CudaOptions o;
  o.micro_batches = K;
  o.grads = "host";
  o.checkpoints = "device";
  o.slots = 2;
  o.layer_major = "on";
  const rt::DevicePlan lm = rt::plan_device(s, 1, 256, o, 1ull << 34);
  o.layer_major = "off";
  const rt::DevicePlan mb = rt::plan_device(s, 1, 256, o, 1ull << 34);
  ASSERT_TRUE(lm.place.layer_major);
  ASSERT_FALSE(mb.place.layer_major);
  const rt::StepPrediction a = rt::predict_step(s, 1, 256, lm, card(), 4.0);
  const rt::StepPrediction b = rt::predict_step(s, 1, 256, mb, card(), 4.0);
  const std::vector<int64_t> n = rt::unit_numels(s);
  const double layer = static_cast<double>(n[1]), L = 6, S = 2;
  // micro-batch-major: 2 K (L - S) + S layer loads, layer-major 2 L - S (bf16);
  // host gradients leave K times against once (fp32)
  EXPECT_NEAR(b.h2d_bytes - a.h2d_bytes, 2 * layer * ((2 * K * (L - S) + S) - (2 * L - S)), 1.0);
  EXPECT_NEAR(b.d2h_bytes - a.d2h_bytes, 4 * layer * L * (K - 1), 1.0);
  EXPECT_GT(b.copies_s, a.copies_s);
  // host gradients: the optimizer is modelled as not overlapping (step_model.cpp)
  EXPECT_EQ(a.overlap_s, 0.0);
  EXPECT_EQ(a.optimizer_exposed_s, a.optimizer_s);
}

TEST(StepModel, CardsAreKnownByName) {
  rt::CardSpec c;
  for (const char* n : {"rtx3080", "rtx3090", "rtx4090", "rtx5090", "a100-40g", "h100", "h200"}) {
    ASSERT_TRUE(rt::card_lookup(n, &c)) << n;
    EXPECT_GT(c.memory_bytes, 8ull << 30) << n;
    EXPECT_GT(c.bf16_tflops, 50) << n;
    EXPECT_GT(c.pcie_gbs, 10) << n;
    EXPECT_LT(rt::card_engine_budget(c.memory_bytes), c.memory_bytes) << n;
  }
  EXPECT_FALSE(rt::card_lookup("rtx9999", &c));
}

}  // namespace

// --matmul fp8: the projections' FLOPs (6 per parameter per token, + 2 per
// recomputed layer) move to the FP8 rate, the rest stays at bf16's.
TEST(StepModel, Fp8MovesTheProjectionsToTheFp8Rate) {
  const rt::ModelSpec s = spec();
  rt::CardSpec h100;
  ASSERT_TRUE(rt::card_lookup("h100", &h100));
  EXPECT_TRUE(h100.fp8_path);
  EXPECT_GT(h100.fp8_tflops, h100.bf16_tflops);
  EXPECT_GT(h100.fp8_gain, 1.0);  // measured with the quantizers (step_model.cpp)
  rt::CudaOptions o;
  o.grads = "device";
  const rt::DevicePlan dp = rt::fit_device_plan(s, 2, 512, o, 1ull << 34);
  const rt::StepPrediction b = rt::predict_step(s, 2, 512, dp, h100, 4.0);
  const rt::StepPrediction f = rt::predict_step(s, 2, 512, dp, h100, 4.0, rt::MatmulMode::fp8);
  const int64_t recomputed = s.n_layers - dp.kept_layers;
  const double C = s.hidden, QD = s.q_dim(), KD = s.kv_dim(), F = s.intermediate;
  const double proj = (2 * C * QD + 2 * C * KD + 3 * C * F) * (6.0 * s.n_layers + 2.0 * recomputed);
  EXPECT_NEAR(f.fp8_flops_per_token, proj, kRel * proj);
  EXPECT_EQ(b.fp8_flops_per_token, 0);
  const double tokens = 2.0 * 512;
  const double want = tokens *
                      ((f.hardware_flops_per_token - proj) / (h100.bf16_tflops * 1e12) +
                       proj / (h100.bf16_tflops * h100.fp8_gain * 1e12)) /
                      f.efficiency;
  EXPECT_NEAR(f.compute_s, want, kRel * want);
  EXPECT_LT(f.compute_s, b.compute_s);
  rt::CardSpec a100;
  ASSERT_TRUE(rt::card_lookup("a100-40g", &a100));
  EXPECT_EQ(a100.fp8_tflops, 0);
  EXPECT_FALSE(a100.fp8_path);
  EXPECT_FALSE(a100.fp8_tensor_path);
  EXPECT_EQ(a100.fp8_tensor_gain, 0);

  // --fp8-scaling tensor: the same FLOPs at the fitted per-tensor gain,
  // which follows the formula of step_model.cpp (recomputed here from the
  // card's rates) and lies between 1 and the GEMM's own 1.75x
  EXPECT_TRUE(h100.fp8_tensor_path);
  const double q = 5.28e-4 * (720.0 / 839.0) * h100.gemm_peak_tflops / (0.77 * h100.memory_tbs);
  EXPECT_NEAR(h100.fp8_tensor_gain, 1.0 / (1.0 / 1.75 + q), 1e-12);
  EXPECT_GT(h100.fp8_tensor_gain, 1.0);
  EXPECT_LT(h100.fp8_tensor_gain, 1.75);
  const rt::StepPrediction t = rt::predict_step(s, 2, 512, dp, h100, 4.0, rt::MatmulMode::fp8_tensor);
  EXPECT_EQ(t.fp8_flops_per_token, f.fp8_flops_per_token);
  const double want_t = tokens *
                        ((t.hardware_flops_per_token - proj) / (h100.bf16_tflops * 1e12) +
                         proj / (h100.bf16_tflops * h100.fp8_tensor_gain * 1e12)) /
                        t.efficiency;
  EXPECT_NEAR(t.compute_s, want_t, kRel * want_t);
  rt::CardSpec ada;
  ASSERT_TRUE(rt::card_lookup("rtx4090", &ada));
  EXPECT_FALSE(ada.fp8_path);  // block scaling: Hopper only
  EXPECT_TRUE(ada.fp8_tensor_path);
  EXPECT_GT(ada.fp8_tensor_gain, 1.0);
}

// The step's rate is one calibrated share of each card's bf16 GEMM peak: the
// same share on every card, so cards differ by what their GEMMs reach, and a
// card without a measured peak keeps the H100's share of its datasheet.
TEST(StepModel, TheStepRateIsOneShareOfEachCardsGemmPeak) {
  const rt::ModelSpec s = spec();
  rt::CudaOptions o;
  o.grads = "device";
  const rt::DevicePlan dp = rt::fit_device_plan(s, 2, 512, o, 1ull << 34);
  auto share = [&](const char* name, rt::CardSpec* c) {
    EXPECT_TRUE(rt::card_lookup(name, c)) << name;
    const rt::StepPrediction p = rt::predict_step(s, 2, 512, dp, *c, 4.0);
    EXPECT_NEAR(p.gemm_peak_tflops, c->gemm_peak_tflops, kRel * c->gemm_peak_tflops) << name;
    return p.efficiency * c->bf16_tflops / p.gemm_peak_tflops;
  };
  rt::CardSpec h100, h200, r4090, r3090;
  const double ref = share("h100", &h100);
  EXPECT_TRUE(h100.gemm_peak_measured);
  EXPECT_LT(h100.gemm_peak_tflops, h100.bf16_tflops);  // Hopper's GEMMs stay below its datasheet
  EXPECT_NEAR(share("h200", &h200), ref, kRel);
  EXPECT_NEAR(share("rtx4090", &r4090), ref, kRel);
  EXPECT_TRUE(r4090.gemm_peak_measured);
  EXPECT_NEAR(share("rtx3090", &r3090), ref, kRel);
  EXPECT_FALSE(r3090.gemm_peak_measured);
  // unmeasured: the H100's share of the datasheet, so the same share of the datasheet as the H100
  EXPECT_NEAR(r3090.gemm_peak_tflops / r3090.bf16_tflops, h100.gemm_peak_tflops / h100.bf16_tflops, kRel);
}

// Muon: its Newton-Schulz shares the device with the step, so its FLOPs (5 x
// (4 m^2 n + 2 m^3) per matrix, recomputed here from the weight table) add
// to the compute at one share of the GEMM peak (with the lane jobs' other
// device time, measured as a factor), and its U in (fp32) / O out
// (bf16) to the copies; nothing else changes.
TEST(StepModel, MuonsNewtonSchulzAddsToTheComputeAndCopies) {
  const rt::ModelSpec s = spec();
  rt::CudaOptions o;
  o.grads = "host";
  const rt::DevicePlan adam = rt::fit_device_plan(s, 2, 512, o, 1ull << 34);
  rt::DevicePlan muon = adam;
  muon.options.muon = true;
  rt::CardSpec h100;
  ASSERT_TRUE(rt::card_lookup("h100", &h100));
  const rt::StepPrediction a = rt::predict_step(s, 2, 512, adam, h100, 4.0);
  const rt::StepPrediction m = rt::predict_step(s, 2, 512, muon, h100, 4.0);
  double flops = 0, bytes = 0;
  for (const rt::WeightEntry& e : rt::weight_map(s))
    if (e.shape.size() == 2 && e.name.find("embed") == std::string::npos && e.name.find("lm_head") == std::string::npos) {
      const double sm = static_cast<double>(std::min(e.shape[0], e.shape[1]));
      const double lg = static_cast<double>(std::max(e.shape[0], e.shape[1]));
      flops += 5 * (4 * sm * sm * lg + 2 * sm * sm * sm);
      bytes += 6 * sm * lg;
    }
  ASSERT_GT(flops, 0);
  EXPECT_EQ(a.ns5_s, 0);
  // the steps at 728/839 of the GEMM peak, times the lane jobs' whole device time over the steps' (1.534 / 0.762 s)
  EXPECT_NEAR(m.ns5_s, flops / (h100.gemm_peak_tflops * 1e12 * (728.0 / 839.0)) * (1.534 / 0.762), kRel * m.ns5_s);
  EXPECT_NEAR(m.compute_s, a.compute_s + m.ns5_s, kRel * m.compute_s);
  EXPECT_NEAR(m.h2d_bytes + m.d2h_bytes, a.h2d_bytes + a.d2h_bytes + bytes, kRel * m.h2d_bytes);
  EXPECT_EQ(m.hardware_flops_per_token, a.hardware_flops_per_token);
}
