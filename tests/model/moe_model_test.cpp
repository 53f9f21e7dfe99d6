// Mixture-of-experts models on the CPU reference: config parsing of the three
// families (fields, transformers' defaults, refusals), parameter counts, the
// weight maps, and whole-model finite differences through the router, the
// experts, OLMoE's q/k norms and the load-balancing loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/model_dir.h"
#include "cpu/cpu_ops.h"
#include "io/hf_export.h"
#include "model/model.h"
#include "model/spec.h"
#include "model/weight_map.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

using rt::Family;
using rt::ModelSpec;

std::string error_of(const std::string& text) {
  try {
    rt::spec_from_config_text(text, "m/config.json");
  } catch (const rt::Error& e) {
    return e.what();
  }
  return "NO ERROR";
}
#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// Tiny configs in the shape of the published ones (keys as the hub configs spell them).
const char* kQwen3Moe = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 12, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6, "vocab_size": 11,
  "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5,
  "rope_theta": 100.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "tie_word_embeddings": false,
  "use_sliding_window": false, "sliding_window": null})";
const char* kQwen2Moe = R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
  "hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 10, "shared_expert_intermediate_size": 14,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
  "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5,
  "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "use_sliding_window": false})";
const char* kMixtral = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 11, "num_local_experts": 4, "num_experts_per_tok": 2,
  "output_router_logits": true, "router_aux_loss_coef": 0.5, "router_jitter_noise": 0.0,
  "rope_theta": 100.0, "max_position_embeddings": 64, "sliding_window": null})";
const char* kOlmoe = R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
  "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 4, "vocab_size": 11, "num_experts": 6, "num_experts_per_tok": 3,
  "norm_topk_prob": false, "output_router_logits": true, "router_aux_loss_coef": 0.5, "clip_qkv": null,
  "rope_theta": 100.0, "max_position_embeddings": 64, "eos_token_id": null, "pad_token_id": null})";

std::string with(const char* base, const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(base);
  j[key] = nlohmann::json::parse(value);
  return j.dump();
}

TEST(MoeSpec, ParsesEachFamily) {
  ModelSpec q = rt::spec_from_config_text(kQwen3Moe, "q");
  EXPECT_EQ(q.family, Family::qwen3_moe);
  EXPECT_TRUE(q.is_moe());
  EXPECT_EQ(q.moe.n_experts, 5);
  EXPECT_EQ(q.moe.top_k, 2);
  EXPECT_EQ(q.moe.expert_intermediate, 12);  // moe_intermediate_size, not intermediate_size
  EXPECT_TRUE(q.moe.norm_topk_prob);
  EXPECT_TRUE(q.moe.aux_loss_on());
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.qk_norm_whole);
  ModelSpec q2 = rt::spec_from_config_text(kQwen2Moe, "q2");
  EXPECT_EQ(q2.family, Family::qwen2_moe);
  EXPECT_TRUE(q2.qkv_bias);  // Qwen2MoeConfig's qkv_bias defaults to true
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_EQ(q2.moe.expert_intermediate, 10);
  EXPECT_EQ(q2.moe.shared_intermediate, 14);
  EXPECT_FALSE(rt::spec_from_config_text(with(kQwen2Moe, "qkv_bias", "false"), "q2").qkv_bias);
  // per layer: attention with biases, norms, router, 5 experts, the shared expert and its gate
  const int64_t attn = 16 * 16 + 2 * 16 * 8 + 16 * 16 + 16 + 2 * 8;
  EXPECT_EQ(q2.params_per_layer(), attn + 2 * 16 + 5 * 16 + 5 * 3 * 16 * 10 + 3 * 16 * 14 + 16);
  EXPECT_EQ(q2.active_params_per_layer(), attn + 2 * 16 + 5 * 16 + 2 * 3 * 16 * 10 + 3 * 16 * 14 + 16);
  // An active window is accepted: runs are held to sequences within it.
  EXPECT_EQ(rt::spec_from_config_text(with(kMixtral, "sliding_window", "8"), "m").max_sequence(), 8);
  ModelSpec m = rt::spec_from_config_text(kMixtral, "m");
  EXPECT_EQ(m.family, Family::mixtral);
  EXPECT_EQ(m.moe.n_experts, 4);  // num_local_experts
  EXPECT_EQ(m.moe.expert_intermediate, 12);
  EXPECT_TRUE(m.moe.norm_topk_prob);  // Mixtral always renormalises
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.rms_eps, 1e-5);  // MixtralConfig's default
  ModelSpec o = rt::spec_from_config_text(kOlmoe, "o");
  EXPECT_EQ(o.family, Family::olmoe);
  EXPECT_TRUE(o.qk_norm && o.qk_norm_whole);
  EXPECT_FALSE(o.moe.norm_topk_prob);
  EXPECT_EQ(o.moe.top_k, 3);
  // defaults when the keys are absent (the config classes' values)
  nlohmann::json j = nlohmann::json::parse(kOlmoe);
  for (const char* k :
       {"num_experts", "num_experts_per_tok", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"})
    j.erase(k);
  ModelSpec od = rt::spec_from_config_text(j.dump(), "o");
  EXPECT_EQ(od.moe.n_experts, 64);
  EXPECT_EQ(od.moe.top_k, 8);
  EXPECT_EQ(od.moe.router_aux_loss_coef, 0.01);
  EXPECT_FALSE(od.moe.output_router_logits);
  EXPECT_FALSE(od.moe.aux_loss_on());
}

TEST(MoeSpec, RefusesWhatItDoesNotCompute) {
  EXPECT_HAS(error_of(with(kQwen3Moe, "decoder_sparse_step", "2")), "decoder_sparse_step 2");
  EXPECT_HAS(error_of(with(kQwen3Moe, "mlp_only_layers", "[0]")), "mlp_only_layers [0]");
  EXPECT_HAS(error_of(with(kQwen3Moe, "num_experts", "0")), "num_experts 0");
  EXPECT_HAS(error_of(with(kQwen2Moe, "decoder_sparse_step", "2")), "decoder_sparse_step 2");
  EXPECT_HAS(error_of(with(kQwen2Moe, "use_sliding_window", "true")), "use_sliding_window true");
  EXPECT_HAS(error_of(with(kQwen3Moe, "num_experts_per_tok", "6")), "num_experts_per_tok 6 must be in [1,");
  EXPECT_HAS(error_of(with(kMixtral, "router_jitter_noise", "0.1")), "router_jitter_noise 0.1");
  EXPECT_HAS(error_of(with(kMixtral, "sliding_window", "-8")), "sliding_window -8 is not a window");
  EXPECT_HAS(error_of(with(kMixtral, "num_experts", "5")), "num_experts 5 and num_local_experts 4 disagree");
  EXPECT_HAS(error_of(with(kOlmoe, "clip_qkv", "8.0")), "clip_qkv 8");
  EXPECT_HAS(error_of(with(kOlmoe, "attention_bias", "true")), "attention_bias true");
  EXPECT_HAS(error_of(with(kOlmoe, "head_dim", "2")), "OLMoE's q norm spans hidden_size");
}

TEST(MoeSpec, ConfigJsonRefusesWhatHfCannotExpress) {
  auto refused = [](const ModelSpec& s) {
    try {
      rt::spec_to_config_json(s);
    } catch (const rt::Error& e) {
      return std::string(e.what());
    }
    return std::string("NO ERROR");
  };
  ModelSpec dense = rt::spec_preset("qwen3-8b");
  dense.moe.n_experts = 4;
  dense.moe.top_k = 2;
  dense.moe.expert_intermediate = 8;
  EXPECT_HAS(refused(dense), "4 experts cannot be expressed for family qwen3");
  // An active window is accepted: runs are held to sequences within it.
  EXPECT_EQ(rt::spec_from_config_text(with(kMixtral, "sliding_window", "8"), "m").max_sequence(), 8);
  ModelSpec m = rt::spec_from_config_text(kMixtral, "m");
  m.moe.norm_topk_prob = false;
  EXPECT_HAS(refused(m), "Mixtral always renormalises");
  ModelSpec q = rt::spec_from_config_text(kQwen3Moe, "q");
  q.moe.shared_intermediate = 8;
  EXPECT_HAS(refused(q), "a shared expert cannot be expressed for family qwen3_moe");
  ModelSpec o = rt::spec_from_config_text(kOlmoe, "o");
  o.qk_norm_whole = false;
  EXPECT_HAS(refused(o), "qk_norm_whole=0");
}

TEST(MoeSpec, PresetTotalsAndActiveParameters) {
  // Published totals (model cards / safetensors metadata); active counts by
  // hand: attention + norms + router + top_k experts per layer.
  ModelSpec q = rt::spec_preset("qwen3-30b-a3b");
  EXPECT_EQ(q.params_total(), 30532122624);
  ModelSpec m = rt::spec_preset("mixtral-8x7b");
  EXPECT_EQ(m.params_total(), 46702792704);
  ModelSpec o = rt::spec_preset("olmoe-1b-7b");
  EXPECT_EQ(o.params_total(), 6919161856);  // 6.92B
  // Mixtral per layer: attention 4096*4096*2 + 2*4096*1024, norms 2*4096,
  // router 8*4096, 2 of 8 experts of 3*4096*14336.
  const int64_t mix_layer = 2 * 4096LL * 4096 + 2 * 4096LL * 1024 + 2 * 4096 + 8 * 4096 + 2 * 3 * 4096LL * 14336;
  EXPECT_EQ(m.active_params_per_layer(), mix_layer);
  EXPECT_EQ(m.params_active(), 32 * mix_layer + 2 * 32000LL * 4096 + 4096);
  EXPECT_LT(q.params_active(), q.params_total() / 8);
  ModelSpec dense = rt::spec_preset("qwen3-8b");
  EXPECT_EQ(dense.params_active(), dense.params_total());
}

TEST(MoeSpec, PlanReportsActiveParameters) {
  const rt::test::RunResult r = rt::test::run_ramtrain("plan --preset mixtral-8x7b --seq-len 1024 --json");
  EXPECT_HAS(r.output, "\"params\":46702792704");
  EXPECT_HAS(r.output, "\"active_params\":" + std::to_string(rt::spec_preset("mixtral-8x7b").params_active()));
  const rt::test::RunResult t = rt::test::run_ramtrain("plan --preset olmoe-1b-7b --seq-len 1024");
  EXPECT_HAS(t.output, "mixture of experts: 64 experts, top 8 per token");
  EXPECT_HAS(t.output, "the op scratch holds every expert's rows");  // the CUDA MoE workspace is planned
}

TEST(MoeWeightMap, NamesAndShapesPerFamily) {
  // An active window is accepted: runs are held to sequences within it.
  EXPECT_EQ(rt::spec_from_config_text(with(kMixtral, "sliding_window", "8"), "m").max_sequence(), 8);
  ModelSpec m = rt::spec_from_config_text(kMixtral, "m");
  auto l = rt::layer_weight_map(m, 1);
  // norms, q k v o (no q/k norms), router, 4 experts x 3
  ASSERT_EQ(l.size(), 2u + 4u + 1u + 12u);
  EXPECT_EQ(l[6].name, "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(l[6].shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(l[7].name, "model.layers.1.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(l[8].name, "model.layers.1.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(l[9].name, "model.layers.1.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(l[9].shape, (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(l[18].expert, 3);
  ModelSpec q = rt::spec_from_config_text(kQwen3Moe, "q");
  auto lq = rt::layer_weight_map(q, 0);
  EXPECT_EQ(lq.back().name, "model.layers.0.mlp.experts.4.down_proj.weight");
  EXPECT_EQ(lq.back().shape, (std::vector<int64_t>{16, 12}));
  auto lq2 = rt::layer_weight_map(rt::spec_from_config_text(kQwen2Moe, "q2"), 0);
  EXPECT_EQ(lq2.back().name, "model.layers.0.mlp.shared_expert_gate.weight");
  EXPECT_EQ(lq2.back().shape, (std::vector<int64_t>{1, 16}));
  EXPECT_EQ(lq2[lq2.size() - 2].name, "model.layers.0.mlp.shared_expert.down_proj.weight");
  EXPECT_EQ(lq2[lq2.size() - 2].shape, (std::vector<int64_t>{16, 14}));
  ModelSpec o = rt::spec_from_config_text(kOlmoe, "o");
  auto lo = rt::layer_weight_map(o, 0);
  bool saw_q_norm = false;
  for (const auto& e : lo)
    if (e.name == "model.layers.0.self_attn.q_norm.weight") {
      saw_q_norm = true;
      EXPECT_EQ(e.shape, (std::vector<int64_t>{16}));  // the whole projection
    }
  EXPECT_TRUE(saw_q_norm);
  int64_t n = 0;
  for (const auto& e : rt::weight_map(o)) n += e.numel();
  EXPECT_EQ(n, o.params_total());
  // a dense checkpoint offered to an MoE config: every difference by name
  std::vector<rt::FoundTensor> found;
  for (const auto& e : rt::weight_map(o))
    if (e.name.find("experts.5.") == std::string::npos) found.push_back({e.name, e.shape});
  const std::string rep = rt::weight_map_check(o, found);
  EXPECT_HAS(rep, "missing: model.layers.0.mlp.experts.5.gate_proj.weight");
}

// ---- whole model ----

struct Case {
  ModelSpec spec;
  std::unique_ptr<rt::HostState> state;
  std::vector<int32_t> ids, targets, pos;
  int64_t B = 2, T = 5;
};

Case make_case(const char* config, uint64_t seed) {
  Case c;
  c.spec = rt::spec_from_config_text(config, "test");
  c.state = std::make_unique<rt::HostState>(c.spec, true);
  c.state->init_random(seed, 0.5f);
  std::mt19937_64 g(seed + 3);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (auto& unit : c.state->units())
    for (size_t k = 0; k < unit.entries.size(); ++k)
      if (unit.entries[k].is_norm_or_bias)
        for (int64_t i = 0; i < unit.entries[k].numel(); ++i) unit.master()[unit.offsets[k] + i] += u(g);
  for (int64_t i = 0; i < c.B * c.T; ++i) {
    c.ids.push_back(static_cast<int32_t>(g() % c.spec.vocab));
    c.pos.push_back(static_cast<int32_t>(i % c.T));
  }
  for (int64_t i = 0; i < c.B * c.T; ++i) c.targets.push_back((i % c.T == c.T - 1) ? -100 : c.ids[i + 1]);
  return c;
}

// The training loss HF reports: mean CE + router_aux_loss_coef * aux (when
// output_router_logits). *tokens gets every layer's per-expert token counts.
double loss_of(Case& c, bool grads, std::vector<int64_t>* tokens = nullptr) {
  rt::CpuOps ops(c.spec);
  rt::ModelRunner<rt::CpuOps> r(ops, c.spec, c.B, c.T, 3);
  rt::ModelGrads g;
  if (grads) {
    c.state->zero_grads();
    g = c.state->grads();
  }
  int64_t nv = 0;
  const float scale = 1.0f / static_cast<float>(c.B * (c.T - 1));
  double s = r.forward_backward(c.state->weights(), grads ? &g : nullptr,
                                rt::BatchView{c.B, c.T, c.ids.data(), c.targets.data(), c.pos.data()}, scale, &nv);
  if (tokens) {
    tokens->clear();
    for (int64_t l = 0; l < c.spec.n_layers; ++l)
      tokens->insert(tokens->end(), r.moe_aux().tokens_per_expert(l),
                     r.moe_aux().tokens_per_expert(l) + c.spec.moe.n_experts);
  }
  const double aux = c.spec.moe.aux_loss_on() ? c.spec.moe.router_aux_loss_coef * r.moe_aux().aux_loss() : 0.0;
  return s / static_cast<double>(nv) + aux;
}

class MoeModelGrad : public ::testing::TestWithParam<const char*> {};

// Central differences with h = 1e-2 on weights of magnitude ~0.5, tolerance
// |fd - analytic| <= 1e-3 + 2e-2 |analytic| as in model_grad_test.cpp (fp32
// loss noise ~2e-4 over 2h, truncation ~1e-4). A perturbation that moves a
// token to another expert makes the loss jump: such samples (the per-expert
// token counts change) are skipped, and most samples must remain.
TEST_P(MoeModelGrad, FiniteDifferencesMatchBackward) {
  Case c = make_case(GetParam(), 7);
  std::vector<int64_t> tok0, tp, tm;
  double l0 = loss_of(c, true, &tok0);
  ASSERT_TRUE(std::isfinite(l0));
  int64_t used = 0;
  for (int64_t t : tok0) used += t > 0;
  EXPECT_GT(used, c.spec.moe.n_experts) << "the case should spread tokens over several experts";
  const float h = 1e-2f;
  std::mt19937_64 g(11);
  int checked = 0, skipped = 0, remeasured = 0;
  for (auto& unit : c.state->units()) {
    for (size_t k = 0; k < unit.entries.size(); ++k) {
      const auto& e = unit.entries[k];
      for (int rep = 0; rep < 3; ++rep) {
        int64_t i = static_cast<int64_t>(g() % static_cast<uint64_t>(e.numel()));
        float* p = unit.master() + unit.offsets[k] + i;
        float analytic = unit.grad.p[unit.offsets[k] + i];
        float orig = *p;
        *p = orig + h;
        double lp = loss_of(c, false, &tp);
        *p = orig - h;
        double lm = loss_of(c, false, &tm);
        *p = orig;
        if (tp != tok0 || tm != tok0) {
          ++skipped;
          continue;
        }
        double fd = (lp - lm) / (2.0 * h);
        double tol = 1e-3 + 2e-2 * std::fabs(analytic);
        if (std::fabs(fd - analytic) > tol) {
          // Two tokens trading experts keeps the counts but kinks the loss
          // within +-h: measure again with h2 = 1e-3 (fp32 noise ~1.5e-3 over
          // 2 h2, hence the wider absolute tolerance), routing unchanged.
          const float h2 = 1e-3f;
          *p = orig + h2;
          lp = loss_of(c, false, &tp);
          *p = orig - h2;
          lm = loss_of(c, false, &tm);
          *p = orig;
          fd = (lp - lm) / (2.0 * h2);
          tol = 3e-3 + 2e-2 * std::fabs(analytic);
          ++remeasured;
        }
        EXPECT_NEAR(fd, analytic, tol) << e.name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10 * std::max(skipped, 1)) << skipped << " skipped";
  EXPECT_LE(remeasured, checked / 20) << "too many samples needed the smaller step";
}

// The load-balancing loss reaches the routers (and through them the inputs of
// every layer below), but not the experts of the last layer: their output
// does not enter it.
TEST_P(MoeModelGrad, AuxLossGradientReachesTheRouter) {
  Case c = make_case(GetParam(), 9);
  std::vector<int64_t> tok0, tp, tm;
  c.spec.moe.router_aux_loss_coef = 0.0;
  loss_of(c, true, &tok0);
  std::vector<float> g0;
  for (auto& u : c.state->units()) g0.insert(g0.end(), u.grad.p, u.grad.p + u.numel);
  c.spec.moe.router_aux_loss_coef = 1.0;
  loss_of(c, true);
  double diff = 0;
  size_t at = 0;
  for (auto& u : c.state->units()) {
    for (size_t k = 0; k < u.entries.size(); ++k)
      for (int64_t i = 0; i < u.entries[k].numel(); ++i) {
        const double d = std::fabs(u.grad.p[u.offsets[k] + i] - g0[at + static_cast<size_t>(u.offsets[k] + i)]);
        if (u.entries[k].kind == rt::WeightKind::expert_down && u.entries[k].layer == c.spec.n_layers - 1) {
          EXPECT_EQ(d, 0.0) << u.entries[k].name;
        }
        if (u.entries[k].kind == rt::WeightKind::router) diff = std::max(diff, d);
      }
    at += static_cast<size_t>(u.numel);
  }
  EXPECT_GT(diff, 1e-4);
}

// Export -> load: config.json and the per-expert safetensors come back as the
// same spec and bit-identical tensors, and the model computes the same loss.
TEST_P(MoeModelGrad, ExportLoadRoundTrip) {
  Case c = make_case(GetParam(), 5);
  const double l0 = loss_of(c, false);
  rt::test::TempDir tmp;
  rt::ExportOptions opt;
  opt.dtype = rt::DType::f32;
  opt.tokenizer = "";
  rt::export_hf_dir(tmp.file("out"), *c.state, opt);
  rt::cli::LoadedModel m = rt::cli::load_model_dir(tmp.file("out"), true);
  EXPECT_EQ(m.spec.family, c.spec.family);
  EXPECT_EQ(m.spec.moe.n_experts, c.spec.moe.n_experts);
  EXPECT_EQ(m.spec.moe.top_k, c.spec.moe.top_k);
  EXPECT_EQ(m.spec.moe.expert_intermediate, c.spec.moe.expert_intermediate);
  EXPECT_EQ(m.spec.moe.norm_topk_prob, c.spec.moe.norm_topk_prob);
  EXPECT_EQ(m.spec.moe.router_aux_loss_coef, c.spec.moe.router_aux_loss_coef);
  EXPECT_EQ(m.spec.moe.output_router_logits, c.spec.moe.output_router_logits);
  EXPECT_EQ(m.spec.qk_norm_whole, c.spec.qk_norm_whole);
  for (const auto& e : rt::weight_map(c.spec)) {
    std::vector<float> a(static_cast<size_t>(e.numel())), b(a.size());
    c.state->read_master(e.name, a.data());
    m.state->read_master(e.name, b.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << e.name;
  }
  Case d = make_case(GetParam(), 5);
  d.spec = m.spec;
  d.state = std::move(m.state);
  EXPECT_EQ(loss_of(d, false), l0);
}

std::string family_of(const ::testing::TestParamInfo<const char*>& info) {
  return rt::family_name(rt::spec_from_config_text(info.param, "test").family);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeModelGrad, ::testing::Values(kQwen3Moe, kMixtral, kOlmoe, kQwen2Moe), family_of);

}  // namespace
