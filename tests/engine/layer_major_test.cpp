// Layer-major micro-batches on the CPU backend (engine/backend.h): the CPU
// twin of the CUDA engine's layer-major schedule. With untied embeddings
// every gradient element receives the micro-batches' contributions in the
// same order as the micro-batch-major schedule, so gradients, losses, norms
// and weights are bit-identical, not merely close. MoE models too, with the
// load-balancing loss on: each micro-batch's routing is finished after the
// layer-major forward, before any backward needs it.
#include <gtest/gtest.h>

#include <cmath>

#include "data/dataset.h"
#include "engine/backend.h"
#include "model/spec.h"
#include "optim/adamw.h"
#include "testutil.h"

namespace {

rt::ModelSpec small_spec(bool tied) {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 32;
  s.intermediate = 64;
  s.n_layers = 3;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.vocab = 258;
  s.rms_eps = 1e-5;
  s.max_positions = 64;
  s.tie_embeddings = tied;
  return s;
}

rt::Dataset shakespeare(int64_t T) {
  rt::DatasetOptions o;
  o.seq_len = T;
  o.seed = 5;
  return rt::Dataset(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), o);
}

struct TwinRun {
  std::vector<double> loss, norm;
  std::vector<float> w, grads;
};

// 3 optimizer steps of K = 3 micro-batches (2 x 32 tokens) on the same data,
// clipping on (so the norm feeds the update), then one compute_grads.
// keep_attn: --keep-attention (layer-major: the last layers whose K
// micro-batches keep their attention halves; -1 there: none).
TwinRun train_twin(bool tied, bool layer_major, int64_t mlp_chunk_tokens = 0, const rt::ModelSpec* spec = nullptr,
                   std::vector<int64_t>* expert_tokens = nullptr, double* aux = nullptr, int64_t keep_attn = -1) {
  const int64_t B = 2, T = 32, K = 3;
  rt::HostState st(spec ? *spec : small_spec(tied), true);
  st.init_random(3, 0.05f);
  rt::Dataset data = shakespeare(T);
  auto be = rt::make_cpu_backend(st, false, 0, layer_major, mlp_chunk_tokens, false, keep_attn);
  TwinRun r;
  rt::OptimStep o;
  o.lr = 1e-3;
  o.clip = 0.5;
  auto step_batches = [&](int64_t* nv) {
    std::vector<rt::Batch> b;
    *nv = 0;
    for (int64_t k = 0; k < K; ++k) {
      b.push_back(data.next_batch(B));
      for (int32_t t : b.back().targets) *nv += t != rt::ignore_target;
    }
    return b;
  };
  for (int i = 0; i < 3; ++i) {
    o.t = i + 1;
    int64_t nv = 0;
    const std::vector<rt::Batch> b = step_batches(&nv);
    const rt::StepStats s = be->train_step(b, nv, o);
    r.loss.push_back(s.loss_sum);
    r.norm.push_back(s.grad_norm);
    if (expert_tokens) {
      const rt::EngineStats es = be->stats();
      expert_tokens->insert(expert_tokens->end(), es.moe_tokens_per_expert.begin(), es.moe_tokens_per_expert.end());
      *aux += es.moe_aux_loss;
    }
  }
  int64_t nv = 0;
  const std::vector<rt::Batch> b = step_batches(&nv);
  r.loss.push_back(be->compute_grads(b, nv));
  for (auto& u : st.units()) {
    r.w.insert(r.w.end(), u.master(), u.master() + u.numel);
    r.grads.insert(r.grads.end(), u.grad.p, u.grad.p + u.numel);
  }
  return r;
}

TEST(LayerMajor, CpuTwinIsBitIdenticalToMicroBatchMajor) {
  const TwinRun mb = train_twin(false, false), lm = train_twin(false, true);
  EXPECT_EQ(lm.loss, mb.loss);
  EXPECT_EQ(lm.norm, mb.norm);
  EXPECT_TRUE(lm.grads == mb.grads) << "compute_grads differs";
  EXPECT_TRUE(lm.w == mb.w) << "weights after 3 steps differ";
  // the runs are not trivially equal: the weights moved and the gradients are not zero
  double gsq = 0;
  for (float g : lm.grads) gsq += double(g) * g;
  EXPECT_GT(gsq, 0);
}

TEST(LayerMajor, TiedEmbeddingsDifferOnlyByRounding) {
  // Tied: the shared table's gradient gets the K LM-head terms before the K
  // embedding terms (micro-batch-major interleaves them), so bits may differ;
  // the sums are the same up to fp32 rounding of a few additions per element:
  // relative 1e-5 of the largest gradient is ~100 ulp, far below any real change.
  const TwinRun mb = train_twin(true, false), lm = train_twin(true, true);
  ASSERT_EQ(lm.grads.size(), mb.grads.size());
  float gmax = 0;
  for (float g : mb.grads) gmax = std::max(gmax, std::fabs(g));
  for (size_t i = 0; i < mb.grads.size(); ++i)
    ASSERT_NEAR(lm.grads[i], mb.grads[i], 1e-5f * gmax) << "gradient element " << i;
  EXPECT_NEAR(lm.loss.back(), mb.loss.back(), 1e-6 * std::fabs(mb.loss.back()));
}

TEST(LayerMajor, MlpChunksOnTheCpuBackend) {
  // MLP token chunks (16 of the 64 tokens) in both schedules: layer-major and
  // micro-batch-major stay bit-identical (the same block calls per
  // micro-batch, the recompute without output included); against the whole
  // MLP only the fp32 summation order of the MLP weight gradients over
  // tokens changes: relative 1e-5 of the largest gradient (~100 ulp; a wrong
  // chunk offset or a missed chunk changes gradients at O(1)).
  const TwinRun mb = train_twin(false, false, 16), lm = train_twin(false, true, 16);
  EXPECT_EQ(lm.loss, mb.loss);
  EXPECT_EQ(lm.norm, mb.norm);
  EXPECT_TRUE(lm.grads == mb.grads) << "compute_grads differs";
  EXPECT_TRUE(lm.w == mb.w) << "weights after 3 steps differ";
  const TwinRun whole = train_twin(false, false, 0);
  ASSERT_EQ(whole.grads.size(), mb.grads.size());
  float gmax = 0;
  for (float g : whole.grads) gmax = std::max(gmax, std::fabs(g));
  ASSERT_GT(gmax, 0);
  EXPECT_FALSE(mb.grads == whole.grads) << "the chunks changed no summation: was the chunk passed on?";
  for (size_t i = 0; i < whole.grads.size(); ++i)
    ASSERT_NEAR(mb.grads[i], whole.grads[i], 1e-5f * gmax) << "gradient element " << i;
  for (size_t i = 0; i < whole.loss.size(); ++i)
    EXPECT_NEAR(mb.loss[i], whole.loss[i], 1e-5 * std::fabs(whole.loss[i])) << "step " << i + 1;
}

// Selective recompute under layer-major: the last 2 of 3 layers keep the
// attention half of each of the 3 micro-batches, so their backward
// recomputes only the norms and the MLP; every value is the one the forward
// made, so the run is micro-batch-major's (nothing kept) bit for bit, with
// the MLP whole and in chunks of 16 tokens.
TEST(LayerMajor, KeptAttentionHalvesAreBitIdentical) {
  for (int64_t chunk : {int64_t{0}, int64_t{16}}) {
    const TwinRun mb = train_twin(false, false, chunk, nullptr, nullptr, nullptr, 0),
                  lm = train_twin(false, true, chunk, nullptr, nullptr, nullptr, 2);
    EXPECT_EQ(lm.loss, mb.loss) << "MLP chunk " << chunk;
    EXPECT_EQ(lm.norm, mb.norm) << "MLP chunk " << chunk;
    EXPECT_TRUE(lm.grads == mb.grads) << "compute_grads differs, MLP chunk " << chunk;
    EXPECT_TRUE(lm.w == mb.w) << "weights after 3 steps differ, MLP chunk " << chunk;
  }
}

// A Qwen2-MoE shape (a shared expert with its gate, top-2 of 5 experts) with
// the load-balancing loss on: layer-major keeps one routing record per
// micro-batch, so losses, norms, gradients, weights, the per-expert token
// counts and the aux loss are those of micro-batch-major, bit for bit.
TEST(LayerMajor, MoeWithTheLoadBalancingLossIsBitIdentical) {
  const rt::ModelSpec moe = rt::spec_from_config_text(
      R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
  "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 16,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 258,
  "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5,
  "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "use_sliding_window": false})",
      "layer_major_test");
  ASSERT_TRUE(moe.moe.aux_loss_on());
  std::vector<int64_t> tok_mb, tok_lm;
  double aux_mb = 0, aux_lm = 0;
  const TwinRun mb = train_twin(false, false, 0, &moe, &tok_mb, &aux_mb),
                lm = train_twin(false, true, 0, &moe, &tok_lm, &aux_lm);
  EXPECT_EQ(lm.loss, mb.loss);
  EXPECT_EQ(lm.norm, mb.norm);
  EXPECT_TRUE(lm.grads == mb.grads) << "compute_grads differs";
  EXPECT_TRUE(lm.w == mb.w) << "weights after 3 steps differ";
  EXPECT_EQ(tok_lm, tok_mb);
  EXPECT_EQ(aux_lm, aux_mb);
  // not trivially equal: each of the 3 steps routed its 3 x 64 tokens to 2 experts in each of 3 layers, and the
  // aux loss is positive (a sum of products of token shares and probabilities)
  int64_t routed = 0;
  for (int64_t t : tok_mb) routed += t;
  EXPECT_EQ(routed, 3 * 3 * 3 * 64 * 2);
  EXPECT_GT(aux_mb, 0);
  // the attention halves of all 3 layers kept (every micro-batch): the same bits, routing statistics included
  std::vector<int64_t> tok_kept;
  double aux_kept = 0;
  const TwinRun kept = train_twin(false, true, 0, &moe, &tok_kept, &aux_kept, 3);
  EXPECT_EQ(kept.loss, mb.loss);
  EXPECT_TRUE(kept.grads == mb.grads) << "compute_grads differs with the attention halves kept";
  EXPECT_TRUE(kept.w == mb.w) << "weights after 3 steps differ with the attention halves kept";
  EXPECT_EQ(tok_kept, tok_mb);
  EXPECT_EQ(aux_kept, aux_mb);
}

}  // namespace

