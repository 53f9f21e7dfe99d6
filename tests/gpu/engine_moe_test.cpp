// The CUDA streaming engine on mixture-of-experts models (Qwen3-MoE, Mixtral,
// OLMoE, Qwen2-MoE with its shared expert) against the CPU backend (the fp32
// reference, engine/cpu_backend.cpp) and against itself. Tiny configs in the
// hub's spelling with GPU-friendly widths (multiples of 8, head_dim 64); the
// load-balancing loss on with a large coefficient (0.5) so that its gradient
// through every router is a visible part of the result.
//  - loss, every gradient, the per-expert token counts and the aux loss of
//    two micro-batches: CUDA vs CPU. Bounds as CudaEngine.
//    GradientsMatchTheCpuReference (loss 1e-2 relative, per tensor rel_l2
//    <= 5e-2) plus what routing on bf16 activations adds: a token whose K-th
//    and (K+1)-th router probabilities are closer than the bf16 noise of its
//    logits (~2^-9 of their spread, more after a few layers) picks another
//    expert on the GPU: about 1% of the tokens per layer. Each such token
//    moves the L1 distance of the counts by 2: they may differ by 3% of the
//    routed slots (an expert index off by one is ~100%), the totals not at
//    all; the aux loss (a product of those counts and fp32 probability sums)
//    within 2%. Such a token moves an O(1) contribution from one expert's
//    gradient (and its router row's) to another's, so with a fraction f of an
//    expert's tokens changed its gradient moves by ~sqrt(f) in rel_l2: ~1-2%
//    of its tokens gives 0.1-0.14, bounded at 0.2 for the router and expert
//    tensors and the MoE's input norm (a wrong expert, weight or permutation
//    is O(1)). An expert with
//    few tokens can have a large f from one flip (measured: 0.46 for an
//    expert of the last layer): experts whose CPU and CUDA token counts
//    differ are bounded through their layer instead, all experts' tensors of
//    one kind together at 0.2 (the same sqrt(f) over the layer's slots). The other
//    tensors see a flipped token only through the MoE output, small with the
//    experts' down projections scaled by 0.1 (init_moe), and keep 5e-2. The
//    exact routing and the numerics of the MoE ops are cuda_moe_test's, on
//    inputs drawn without near-ties.
//  - the load-balancing gradient alone: the gradients with the aux loss on
//    minus those with it off, CUDA vs CPU, for the routers: rel_l2 <= 1e-1.
//    Its direct part p_e (dprob_e - sum p dprob) does not depend on a
//    token's routing, so flips barely touch it; the bf16 rounding of the
//    router's logit gradient (which also holds the cross-entropy part) adds
//    ~2^-9 of the total per element.
//  - streaming (2 slots) = resident, and kept activations = recompute, bit
//    for bit over three training steps: the MoE ops are deterministic and the
//    router-only recompute must give the backward the forward's routing.
// Skips without a CUDA device or a CUDA build.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/backend.h"
#include "model/spec.h"
#include "model/weight_map.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

bool have_gpu() { return rt::cuda_backend_available(); }

// GPU-friendly widths: hidden 256, 4 heads of 64 (2 KV heads), vocab 264 (byte data), 3 layers.
const char* kQwen3Moe = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 264,
  "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "tie_word_embeddings": false,
  "use_sliding_window": false, "sliding_window": null})";
const char* kMixtral = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 264, "num_local_experts": 4, "num_experts_per_tok": 2,
  "output_router_logits": true, "router_aux_loss_coef": 0.5, "router_jitter_noise": 0.0,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "sliding_window": null})";
// E = 6 (router width not a multiple of 8), K = 3, no renormalisation, q/k norms over the whole projection
const char* kOlmoe = R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
  "hidden_size": 256, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 4, "vocab_size": 264, "num_experts": 6, "num_experts_per_tok": 3,
  "norm_topk_prob": false, "output_router_logits": true, "router_aux_loss_coef": 0.5, "clip_qkv": null,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "eos_token_id": null,
  "pad_token_id": null})";
// gpt-oss: sinks, q/k/v/o biases, layers 0 and 2 sliding (window 16 < T = 64), YaRN, router and
// expert biases, softmax over the top-2 logits, SwiGLU clamped at 0.5 (bites at this init); no aux loss.
const char* kGptOss = R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
  "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 264, "num_local_experts": 4, "num_experts_per_tok": 2,
  "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
  "swiglu_limit": 0.5, "attention_bias": true, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
  "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
  "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}})";
const char* kQwen2Moe = R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
  "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 264,
  "num_experts": 6, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "use_sliding_window": false})";

rt::Dataset shakespeare(int64_t T, uint64_t seed) {
  rt::DatasetOptions o;
  o.seq_len = T;
  o.seed = seed;
  return rt::Dataset(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), o);
}

std::vector<rt::Batch> batches_from(rt::Dataset& d, int64_t B, int64_t k, int64_t* n_valid) {
  std::vector<rt::Batch> v;
  *n_valid = 0;
  for (int64_t i = 0; i < k; ++i) {
    v.push_back(d.next_batch(B));
    *n_valid += static_cast<int64_t>(v.back().targets.size());
  }
  return v;
}

// Tensors whose gradient a token routed to another expert changes directly.
// The MoE's input norm (mlp_norm; every layer of these configs is an MoE
// layer) is one: its gradient sum_t dxn_t * xhat_t takes dxn only from the
// experts and the router, so a flipped token's O(1) change of dxn_t enters
// it with the same weight as the other tokens' (the 0.1 on the down
// projections scales both alike): sqrt(f) as for the routed tensors.
// Measured on the H100 (2026-12-05): Mixtral 0.0503 against the 5e-2 the
// dense tensors keep.
bool is_routed(rt::WeightKind k) {
  return k == rt::WeightKind::router || k == rt::WeightKind::expert_gate || k == rt::WeightKind::expert_up ||
         k == rt::WeightKind::expert_down || k == rt::WeightKind::mlp_norm || k == rt::WeightKind::router_bias ||
         k == rt::WeightKind::expert_gate_bias || k == rt::WeightKind::expert_up_bias ||
         k == rt::WeightKind::expert_down_bias;
}

// Weights from init_random(seed, 0.05), the experts' down projections then
// scaled by 0.1: a token routed to another expert (see the header) then moves
// its residual stream by a tenth of what it would at the plain init, where
// the experts' output is as large as the residual, so that the tensors away
// from the routing keep the dense bound.
void init_moe(rt::HostState& st, uint64_t seed) {
  st.init_random(seed, 0.05f);
  for (auto& u : st.units())
    for (size_t k = 0; k < u.entries.size(); ++k)
      if (u.entries[k].kind == rt::WeightKind::expert_down) {
        float* m = u.master() + u.offsets[k];
        for (int64_t i = 0; i < u.entries[k].numel(); ++i) m[i] *= 0.1f;
      }
}

// Every unit's gradient, in unit order.
std::vector<std::vector<float>> unit_grads(const rt::HostState& st) {
  std::vector<std::vector<float>> g;
  for (auto& u : st.units()) g.emplace_back(u.grad.p, u.grad.p + u.numel);
  return g;
}

void compare_with_cpu(const char* config, const char* name, bool aux = true) {
  const int64_t B = 4, T = 64;
  const rt::ModelSpec s = rt::spec_from_config_text(config, name);
  ASSERT_TRUE(s.is_moe()) << name;
  ASSERT_EQ(s.moe.aux_loss_on(), aux) << name;
  rt::HostState st(s, true);
  init_moe(st, 5);
  rt::Dataset d = shakespeare(T, 1);
  int64_t nv = 0;
  auto batches = batches_from(d, B, 2, &nv);

  auto cpu = rt::make_cpu_backend(st);
  const double l_cpu = cpu->compute_grads(batches, nv) / nv;
  const auto g_cpu = unit_grads(st);
  const rt::EngineStats e_cpu = cpu->stats();
  rt::CudaOptions co;
  co.slots = 2;
  auto gpu = rt::make_cuda_backend(st, B, T, co);
  const double l_gpu = gpu->compute_grads(batches, nv) / nv;
  const auto g_gpu = unit_grads(st);
  const rt::EngineStats e_gpu = gpu->stats();

  std::printf("[moe engine] %s: loss cpu %.6f cuda %.6f; aux cpu %.6f cuda %.6f\n", name, l_cpu, l_gpu,
              e_cpu.moe_aux_loss, e_gpu.moe_aux_loss);
  EXPECT_NEAR(l_gpu, l_cpu, 1e-2 * l_cpu) << name;
  if (aux) {
    EXPECT_NEAR(e_gpu.moe_aux_loss, e_cpu.moe_aux_loss, 2e-2 * e_cpu.moe_aux_loss) << name;
  }
  ASSERT_EQ(e_gpu.moe_tokens_per_expert.size(), static_cast<size_t>(s.n_layers * s.moe.n_experts)) << name;
  ASSERT_EQ(e_cpu.moe_tokens_per_expert.size(), e_gpu.moe_tokens_per_expert.size()) << name;
  int64_t total_cpu = 0, total_gpu = 0, l1 = 0;
  for (size_t i = 0; i < e_cpu.moe_tokens_per_expert.size(); ++i) {
    total_cpu += e_cpu.moe_tokens_per_expert[i];
    total_gpu += e_gpu.moe_tokens_per_expert[i];
    l1 += std::llabs(e_cpu.moe_tokens_per_expert[i] - e_gpu.moe_tokens_per_expert[i]);
  }
  EXPECT_EQ(total_cpu, 2 * B * T * s.n_layers * s.moe.top_k) << name;  // every slot of both micro-batches
  EXPECT_EQ(total_gpu, total_cpu) << name;
  EXPECT_LE(static_cast<double>(l1), 0.03 * static_cast<double>(total_cpu)) << name << ": routing differs";

  double worst_dense = 0, worst_moe = 0, worst_layer = 0;
  std::string worst_dense_name, worst_moe_name, worst_layer_name;
  // per (layer, expert tensor kind): squared error and squared reference over all experts
  std::map<std::pair<int64_t, int>, std::pair<double, double>> layer_sums;
  int64_t flipped_experts = 0;
  const auto& units = st.units();
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t k = 0; k < units[u].entries.size(); ++k) {
      const rt::WeightEntry& we = units[u].entries[k];
      const float* a = g_gpu[u].data() + units[u].offsets[k];
      const float* r = g_cpu[u].data() + units[u].offsets[k];
      const double e = rt::test::rel_l2(a, r, we.numel());
      const bool routed = is_routed(we.kind);
      if (we.expert >= 0) {
        auto& [err2, ref2] = layer_sums[{we.layer, static_cast<int>(we.kind)}];
        for (int64_t i = 0; i < we.numel(); ++i) {
          err2 += (static_cast<double>(a[i]) - r[i]) * (static_cast<double>(a[i]) - r[i]);
          ref2 += static_cast<double>(r[i]) * r[i];
        }
        const size_t c = static_cast<size_t>(we.layer * s.moe.n_experts + we.expert);
        if (e_cpu.moe_tokens_per_expert[c] != e_gpu.moe_tokens_per_expert[c]) {
          // a routing flip touched this expert: with few tokens one flip moves its
          // gradient by O(1); the layer's sum over experts below bounds it instead
          if (we.kind == rt::WeightKind::expert_gate) ++flipped_experts;
          continue;
        }
      }
      EXPECT_LE(e, routed ? 0.2 : 5e-2) << name << ": " << we.name;
      double& worst = routed ? worst_moe : worst_dense;
      if (e > worst) worst = e, (routed ? worst_moe_name : worst_dense_name) = we.name;
    }
  for (const auto& [key, sums] : layer_sums) {
    const double e = std::sqrt(sums.first / std::max(sums.second, 1e-300));
    const std::string what = "layer " + std::to_string(key.first) + " " +
                             rt::weight_kind_name(static_cast<rt::WeightKind>(key.second)) + " (all experts)";
    EXPECT_LE(e, 0.2) << name << ": " << what;
    if (e > worst_layer) worst_layer = e, worst_layer_name = what;
  }
  std::printf(
      "[moe engine] %s: worst gradient rel_l2 cuda vs cpu: %.3e (%s); routed tensors of experts whose token count "
      "agrees %.3e (%s); %lld experts with a routing flip, their layer's experts together %.3e (%s)\n",
      name, worst_dense, worst_dense_name.c_str(), worst_moe, worst_moe_name.c_str(), (long long)flipped_experts,
      worst_layer, worst_layer_name.c_str());
}

// The gradients of the load-balancing loss alone (aux on minus aux off),
// CUDA vs CPU, for every router (see the header).
void compare_aux_gradient(const char* config, const char* name) {
  const int64_t B = 4, T = 64;
  const rt::ModelSpec on = rt::spec_from_config_text(config, name);
  rt::ModelSpec off = on;
  off.moe.router_aux_loss_coef = 0;
  ASSERT_TRUE(on.moe.aux_loss_on() && !off.moe.aux_loss_on());
  rt::Dataset d = shakespeare(T, 3);
  int64_t nv = 0;
  auto batches = batches_from(d, B, 2, &nv);
  auto grads = [&](const rt::ModelSpec& s, bool cuda) {
    rt::HostState st(s, true);
    init_moe(st, 9);
    rt::CudaOptions co;
    co.slots = 2;
    auto be = cuda ? rt::make_cuda_backend(st, B, T, co) : rt::make_cpu_backend(st);
    be->compute_grads(batches, nv);
    std::vector<std::vector<float>> r;  // the routers' gradients, layer by layer
    for (auto& u : st.units())
      for (size_t k = 0; k < u.entries.size(); ++k)
        if (u.entries[k].kind == rt::WeightKind::router)
          r.emplace_back(u.grad.p + u.offsets[k], u.grad.p + u.offsets[k] + u.entries[k].numel());
    return r;
  };
  const auto cpu_on = grads(on, false), cpu_off = grads(off, false), gpu_on = grads(on, true),
             gpu_off = grads(off, true);
  ASSERT_EQ(cpu_on.size(), static_cast<size_t>(on.n_layers));
  for (size_t l = 0; l < cpu_on.size(); ++l) {
    std::vector<float> dc(cpu_on[l].size()), dg(dc.size());
    for (size_t i = 0; i < dc.size(); ++i) {
      dc[i] = cpu_on[l][i] - cpu_off[l][i];
      dg[i] = gpu_on[l][i] - gpu_off[l][i];
    }
    double nrm = 0;
    for (float v : dc) nrm += static_cast<double>(v) * v;
    ASSERT_GT(nrm, 0.0) << name << ": the load-balancing loss has no router gradient on the CPU";
    const double e = rt::test::rel_l2(dg.data(), dc.data(), static_cast<int64_t>(dc.size()));
    std::printf("[moe engine] %s: layer %zu load-balancing router gradient rel_l2 cuda vs cpu %.3e\n", name, l, e);
    EXPECT_LE(e, 1e-1) << name << ": layer " << l;
  }
}

TEST(CudaEngineMoe, LoadBalancingGradientMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  compare_aux_gradient(kQwen3Moe, "qwen3_moe");
  compare_aux_gradient(kOlmoe, "olmoe");
}

TEST(CudaEngineMoe, Qwen3MoeMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build): the CPU twin is tests/model/moe_*";
  compare_with_cpu(kQwen3Moe, "qwen3_moe");
}
TEST(CudaEngineMoe, MixtralMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  compare_with_cpu(kMixtral, "mixtral");
}
TEST(CudaEngineMoe, OlmoeMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  compare_with_cpu(kOlmoe, "olmoe");
}
TEST(CudaEngineMoe, GptOssMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  compare_with_cpu(kGptOss, "gpt_oss", false);
}
TEST(CudaEngineMoe, Qwen2MoeSharedExpertMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  compare_with_cpu(kQwen2Moe, "qwen2_moe");
}

// Three steps: the loss and norm of each, then the final weights.
struct StepRun {
  std::vector<double> loss, norm;
  std::vector<float> w;
};
StepRun train_three(const rt::ModelSpec& s, const rt::CudaOptions& co, const std::vector<rt::Batch>& batches,
                    int64_t nv, int64_t B, int64_t T) {
  rt::HostState st(s, true);
  init_moe(st, 7);
  auto gpu = rt::make_cuda_backend(st, B, T, co);
  StepRun r;
  rt::OptimStep o;
  o.lr = 1e-3;
  o.clip = 1.0;
  for (int i = 0; i < 3; ++i) {
    o.t = i + 1;
    const rt::StepStats x = gpu->train_step(batches, nv, o);
    r.loss.push_back(x.loss_sum);
    r.norm.push_back(x.grad_norm);
  }
  gpu->sync();
  r.w = rt::test::all_masters(st);
  return r;
}

TEST(CudaEngineMoe, StreamingResidentAndKeptActivationsAreBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  const int64_t B = 2, T = 128;
  const rt::ModelSpec s = rt::spec_from_config_text(kQwen2Moe, "qwen2_moe");
  rt::Dataset d = shakespeare(T, 2);
  int64_t nv = 0;
  auto batches = batches_from(d, B, 2, &nv);
  auto run = [&](bool resident, int64_t keep) {
    rt::CudaOptions co;
    co.resident = resident;
    co.slots = resident ? 0 : 2;
    co.keep_activations = keep;
    return train_three(s, co, batches, nv, B, T);
  };
  const StepRun a = run(false, 0), b = run(true, 0), c = run(false, -1);
  EXPECT_EQ(a.loss, b.loss) << "streaming vs resident";
  EXPECT_EQ(a.norm, b.norm) << "streaming vs resident";
  EXPECT_TRUE(a.w == b.w) << "streaming vs resident";
  EXPECT_EQ(a.loss, c.loss) << "recompute vs kept activations";
  EXPECT_EQ(a.norm, c.norm) << "recompute vs kept activations";
  EXPECT_TRUE(a.w == c.w) << "recompute vs kept activations";
}

// The expert GEMMs grouped (RAMTRAIN_MOE_GEMM=grouped, what auto, the default,
// runs for calls this small) and looped (cuda/ops.h MoeBlas) on OLMoE, three steps, load-balancing loss on: two
// grouped runs are bit-identical (losses, norms, weights: every reduction has
// a fixed order, no atomics); looped against grouped, the losses within 1e-2
// relative and the gradient norms within 5e-2, the bounds each of them keeps
// against the CPU in compare_with_cpu (the modes differ by bf16 roundings of
// the expert outputs and input gradients, and the routing flips those move,
// as the CPU comparison's header counts).
TEST(CudaEngineMoe, GroupedExpertsAreDeterministicAndAgreeWithLooped) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  const int64_t B = 2, T = 128;
  const rt::ModelSpec s = rt::spec_from_config_text(kOlmoe, "olmoe");
  rt::Dataset d = shakespeare(T, 2);
  int64_t nv = 0;
  auto batches = batches_from(d, B, 2, &nv);
  rt::CudaOptions co;
  co.slots = 2;
  auto run = [&](const char* mode) {
    setenv("RAMTRAIN_MOE_GEMM", mode, 1);  // read when the engine's MoeBlas is made
    StepRun r = train_three(s, co, batches, nv, B, T);
    unsetenv("RAMTRAIN_MOE_GEMM");
    return r;
  };
  const StepRun g1 = run("grouped"), g2 = run("grouped"), lo = run("looped");
  EXPECT_EQ(g1.loss, g2.loss) << "two grouped runs";
  EXPECT_EQ(g1.norm, g2.norm) << "two grouped runs";
  EXPECT_TRUE(g1.w == g2.w) << "two grouped runs: weights after 3 steps differ";
  ASSERT_EQ(lo.loss.size(), g1.loss.size());
  for (size_t i = 0; i < lo.loss.size(); ++i) {
    EXPECT_NEAR(lo.loss[i], g1.loss[i], 1e-2 * std::fabs(lo.loss[i])) << "step " << i + 1 << " loss";
    EXPECT_NEAR(lo.norm[i], g1.norm[i], 5e-2 * std::fabs(lo.norm[i])) << "step " << i + 1 << " gradient norm";
  }
  EXPECT_FALSE(lo.loss == g1.loss) << "looped and grouped gave the same bits: did RAMTRAIN_MOE_GEMM reach the engine?";
}

// Layer-major micro-batches on an MoE model (load-balancing loss on): one
// routing record per micro-batch, finished after the layer-major forward, so
// losses, norms and weights equal micro-batch-major's bit for bit (as the CPU
// twin's LayerMajor.MoeWithTheLoadBalancingLossIsBitIdentical); and --grads
// fold, which needs layer-major with K > 1, runs (its first step, before any
// update, has the same loss; its weights move).
TEST(CudaEngineMoe, LayerMajorIsBitIdenticalToMicroBatchMajor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  const int64_t B = 2, T = 128;
  const rt::ModelSpec s = rt::spec_from_config_text(kQwen2Moe, "qwen2_moe");
  ASSERT_TRUE(s.moe.aux_loss_on());
  rt::Dataset d = shakespeare(T, 2);
  int64_t nv = 0;
  auto batches = batches_from(d, B, 2, &nv);
  ASSERT_EQ(batches.size(), 2u);
  // keep_attn: layer-major's attention halves kept per micro-batch (auto: all fit here; 0: every block recomputed)
  auto run = [&](const char* layer_major, const char* grads, int64_t keep_attn = -1) {
    rt::CudaOptions co;
    co.slots = 2;
    co.micro_batches = 2;
    co.layer_major = layer_major;
    co.grads = grads;
    co.keep_attention = keep_attn;
    return train_three(s, co, batches, nv, B, T);
  };
  const StepRun mb = run("off", "device"), fold = run("on", "fold");
  for (int64_t keep_attn : {int64_t{-1}, int64_t{0}, int64_t{1}}) {
    const StepRun lm = run("on", "device", keep_attn);
    EXPECT_EQ(lm.loss, mb.loss) << "attention halves kept: " << keep_attn;
    EXPECT_EQ(lm.norm, mb.norm) << "attention halves kept: " << keep_attn;
    EXPECT_TRUE(lm.w == mb.w) << "weights after 3 steps differ, attention halves kept: " << keep_attn;
  }
  ASSERT_EQ(fold.loss.size(), 3u);
  EXPECT_EQ(fold.loss[0], mb.loss[0]);
  for (double l : fold.loss) EXPECT_TRUE(std::isfinite(l));
  rt::HostState start(s, true);
  init_moe(start, 7);  // train_three's initial weights
  EXPECT_FALSE(fold.w == rt::test::all_masters(start)) << "fold: the weights did not move";
}

}  // namespace
