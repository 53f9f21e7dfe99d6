// HF parity of the MoE families: each fixture in tests/fixtures/moe/ was made
// by tools/make_moe_fixtures.py with transformers (fp32, eager attention,
// output_router_logits on). Load it through the real loader (config.json ->
// ModelSpec, hub-named safetensors -> HostState), run forward + backward on
// the CPU reference and compare the logits, the training loss (mean CE +
// router_aux_loss_coef x load-balancing loss), the per-expert token counts
// (the stats hook) and every parameter gradient. Skips while the fixtures
// have not been generated (they need torch; the coordinator makes them).
//
// Tolerances as tests/model/hf_parity_test.cpp (fp32 against fp32, only the
// summation order differs): relative L2 error <= 1e-5 per tensor and for the
// logits, loss relative error <= 1e-5, aux loss relative error <= 1e-5 (ours
// sums in double, torch in fp32 over 64 rows). The routing must be identical
// (the script refuses fixtures whose top-k has a near-tie, gap <= 1e-4).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/model_dir.h"
#include "core/fs.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "io/token_file.h"
#include "model/model.h"
#include "testutil.h"

namespace {

class MoeParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeParity, LossLogitsRoutingAndEveryGradientMatchTransformers) {
  const std::string dir = rt::test::fixture_dir() + "/moe/" + GetParam();
  if (!rt::file_exists(dir + "/reference.json"))
    GTEST_SKIP() << "fixture " << dir << " missing: run tools/make_moe_fixtures.py (needs torch + transformers)";
  auto ref = nlohmann::json::parse(rt::read_text_file(dir + "/reference.json"));
  rt::cli::LoadedModel m = rt::cli::load_model_dir(dir, true);
  ASSERT_TRUE(m.spec.is_moe());
  ASSERT_TRUE(m.spec.moe.aux_loss_on()) << "the fixture's config should have output_router_logits true";
  ASSERT_EQ(m.spec.moe.router_aux_loss_coef, ref["router_aux_loss_coef"].get<double>());
  rt::TokenSequences seqs = rt::token_text_read(dir + "/tokens.txt");
  seqs.validate_ids(static_cast<uint64_t>(m.spec.vocab));
  const int64_t B = static_cast<int64_t>(seqs.seqs.size()), T = static_cast<int64_t>(seqs.seqs[0].size());
  ASSERT_EQ(B, ref["batch"].get<int64_t>());
  ASSERT_EQ(T, ref["seq_len"].get<int64_t>());
  std::vector<int32_t> ids, targets, pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(seqs.seqs[b][t]);
      targets.push_back(t + 1 < T ? seqs.seqs[b][t + 1] : -100);
      pos.push_back(static_cast<int32_t>(t));
    }
  rt::CpuOps ops(m.spec);
  rt::ModelRunner<rt::CpuOps> runner(ops, m.spec, B, T, 7);
  rt::ModelGrads g = m.state->grads();
  rt::ModelWeightsT<float> w = m.state->weights();
  int64_t nv = 0;
  const int64_t n_pred = ref["n_predicted"].get<int64_t>();
  double sum = runner.forward_backward(w, &g, rt::BatchView{B, T, ids.data(), targets.data(), pos.data()},
                                       1.0f / static_cast<float>(n_pred), &nv);
  ASSERT_EQ(nv, n_pred);
  const double ce = sum / static_cast<double>(nv), aux = runner.moe_aux().aux_loss();
  const double loss = ce + m.spec.moe.router_aux_loss_coef * aux, ref_loss = ref["loss"].get<double>();
  EXPECT_GT(std::fabs(ref["ce_loss"].get<double>() - std::log(static_cast<double>(m.spec.vocab))), 0.5)
      << "fixture loss too close to ln(vocab)";
  const double aux_rel = std::fabs(aux - ref["aux_loss"].get<double>()) / ref["aux_loss"].get<double>();
  EXPECT_LE(aux_rel, 1e-5) << "aux " << aux << " vs " << ref["aux_loss"].get<double>();
  const double loss_rel = std::fabs(loss - ref_loss) / std::fabs(ref_loss);
  EXPECT_LE(loss_rel, 1e-5) << "loss " << loss << " vs transformers " << ref_loss;
  // the stats hook: tokens per expert per layer
  const auto& tok = ref["tokens_per_expert"];
  ASSERT_EQ(static_cast<int64_t>(tok.size()), m.spec.n_layers);
  for (int64_t l = 0; l < m.spec.n_layers; ++l)
    for (int64_t e = 0; e < m.spec.moe.n_experts; ++e)
      EXPECT_EQ(runner.moe_aux().tokens_per_expert(l)[e], tok[l][e].get<int64_t>()) << "layer " << l << " expert " << e;

  auto refs = rt::SafetensorsFile::open(dir + "/reference.safetensors");
  {
    const float* hf = runner.forward_hidden(w, ids.data(), pos.data());
    std::vector<float> logits(static_cast<size_t>(B * T * m.spec.vocab));
    rt::cpu::linear_forward(logits.data(), hf, w.lm_head, nullptr, B * T, m.spec.hidden, m.spec.vocab);
    const rt::TensorInfo* lt = refs->find("logits");
    ASSERT_NE(lt, nullptr);
    ASSERT_EQ(lt->numel(), static_cast<int64_t>(logits.size()));
    std::vector<float> r(logits.size());
    rt::tensor_to_f32(*lt, r.data());
    double e = rt::test::rel_l2(logits.data(), r.data(), static_cast<int64_t>(r.size()));
    EXPECT_LE(e, 1e-5) << "logits rel_l2";
    std::printf("[moe parity] %s logits rel_l2 %.3g\n", GetParam().c_str(), e);
  }
  double worst = 0;
  std::string worst_name;
  int n_grads = 0;
  for (const auto& t : rt::grad_tensors(*m.state)) {
    const rt::TensorInfo* rg = refs->find("grad." + t.name);
    ASSERT_NE(rg, nullptr) << "reference has no gradient for " << t.name;
    ASSERT_EQ(rg->shape, t.shape) << t.name;
    std::vector<float> r(static_cast<size_t>(rg->numel()));
    rt::tensor_to_f32(*rg, r.data());
    double e = rt::test::rel_l2(t.data, r.data(), rg->numel());
    EXPECT_LE(e, rt::test::hf_grad_rel_bound(t.name)) << "gradient of " << t.name << " rel_l2";
    if (e > worst) worst = e, worst_name = t.name;
    ++n_grads;
  }
  int n_ref_grads = 0;
  for (const auto& t : refs->tensors()) n_ref_grads += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(n_ref_grads, n_grads);
  std::printf(
      "[moe parity] %s loss %.7f vs %.7f (rel %.3g), aux %.7f (rel %.3g); %d gradients, worst rel_l2 %.3g (%s)\n",
      GetParam().c_str(), loss, ref_loss, loss_rel, aux, aux_rel, n_grads, worst, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeParity, ::testing::Values("qwen3_moe", "qwen2_moe", "mixtral", "olmoe"));

}  // namespace
