// Selective recompute (model/block.h AttnActs): layers that keep only their
// attention half recompute the norms and the MLP half in the backward. The
// kept values are the forward's own and the recomputed ones come from the
// same ops on the same inputs, so the loss and every gradient must be
// bit-identical to recomputing every block whole -- for every family shape
// (GQA llama, Qwen2 bias + tied, Qwen3 q/k norms, Qwen2-MoE with its shared
// expert, OLMoE's whole-projection q/k norms, OLMo2's post-norms, Granite's
// multipliers, SmolLM3's layers without RoPE), with MLP token chunks, with
// whole kept layers beside, and over two micro-batches through one runner
// (the stores are swapped with the shared set, so reuse must not leak).
// Also the planner's pure parts (model/block_memory.h): the bytes of one
// attention half, the recompute FLOPs by kept part, and plan_kept_layers.
#include <gtest/gtest.h>

#include <random>

#include "cpu/cpu_ops.h"
#include "model/block_memory.h"
#include "model/model.h"
#include "model/spec.h"
#include "state/host_state.h"

namespace {

// Tiny configs (hub keys), 3 layers so that kept, attention-kept and
// recomputed layers all occur in one model.
const char* kConfigs[] = {
    R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "rope_theta": 100.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 64})",
    R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "tie_word_embeddings": true})",
    R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
        "vocab_size": 11, "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "tie_word_embeddings": false})",
    R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 16,
        "intermediate_size": 40, "moe_intermediate_size": 10, "shared_expert_intermediate_size": 14,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "output_router_logits": true, "router_aux_loss_coef": 0.5, "rope_theta": 100.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "use_sliding_window": false})",
    R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 16, "intermediate_size": 12,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 11,
        "num_experts": 6, "num_experts_per_tok": 3, "norm_topk_prob": false, "output_router_logits": true,
        "router_aux_loss_coef": 0.5, "clip_qkv": null, "rope_theta": 100.0, "max_position_embeddings": 64,
        "eos_token_id": null, "pad_token_id": null})",
    R"({"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "rms_norm_eps": 1e-6, "rope_theta": 100.0, "max_position_embeddings": 64, "tie_word_embeddings": false,
        "eos_token_id": 1, "pad_token_id": null})",
    R"({"architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "attention_multiplier": 0.3, "embedding_multiplier": 2.0, "residual_multiplier": 0.5,
        "logits_scaling": 3.0, "rms_norm_eps": 1e-5, "rope_theta": 100.0, "max_position_embeddings": 64,
        "tie_word_embeddings": true})",
    R"({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
        "no_rope_layer_interval": 2, "rms_norm_eps": 1e-6, "rope_theta": 100.0, "max_position_embeddings": 64,
        "tie_word_embeddings": true, "use_sliding_window": false, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": null})",
    R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
        "vocab_size": 11, "query_pre_attn_scalar": 8, "sliding_window": 3, "attn_logit_softcapping": 1.5,
        "final_logit_softcapping": 2.0, "rms_norm_eps": 1e-6, "rope_theta": 100.0, "max_position_embeddings": 64,
        "hidden_activation": "gelu_pytorch_tanh"})",
    R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 4, "vocab_size": 11, "query_pre_attn_scalar": 4, "sliding_window": 3,
        "sliding_window_pattern": 2, "rope_theta": 1000.0, "rope_local_base_freq": 10.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64, "tie_word_embeddings": false})",
};

struct Result {
  double loss = 0;
  std::vector<float> grads;
};

class SelectiveRecompute : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    spec_ = rt::spec_from_config_text(kConfigs[GetParam()], "tiny/config.json");
    state_ = std::make_unique<rt::HostState>(spec_, true);
    state_->init_random(11, 0.5f);
    std::mt19937_64 g(5);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (auto& unit : state_->units())  // non-trivial norm weights and biases
      for (size_t k = 0; k < unit.entries.size(); ++k)
        if (unit.entries[k].is_norm_or_bias)
          for (int64_t i = 0; i < unit.entries[k].numel(); ++i) unit.master()[unit.offsets[k] + i] += u(g);
    for (int64_t i = 0; i < 2 * B_ * T_; ++i) {
      ids_.push_back(static_cast<int32_t>(g() % spec_.vocab));
      pos_.push_back(static_cast<int32_t>(i % T_));
    }
    for (int64_t i = 0; i < 2 * B_ * T_; ++i) targets_.push_back(i % T_ == T_ - 1 ? -100 : ids_[i + 1]);
  }

  // Two micro-batches of B x T through one runner, gradients summed.
  Result run(int64_t keep, int64_t keep_attn, int64_t chunk) {
    rt::CpuOps ops(spec_);
    rt::ModelRunner<rt::CpuOps> r(ops, spec_, B_, T_, 3, keep, chunk, keep_attn);
    EXPECT_EQ(r.kept_layers(), std::min(keep, spec_.n_layers));
    EXPECT_EQ(r.attn_kept_layers(), std::min(keep_attn, spec_.n_layers - r.kept_layers()));
    state_->zero_grads();
    rt::ModelGrads g = state_->grads();
    Result out;
    const float scale = 1.0f / static_cast<float>(2 * B_ * (T_ - 1));
    for (int64_t m = 0; m < 2; ++m) {
      int64_t nv = 0;
      const int64_t o = m * B_ * T_;
      out.loss += r.forward_backward(
          state_->weights(), &g, rt::BatchView{B_, T_, ids_.data() + o, targets_.data() + o, pos_.data() + o}, scale,
          &nv);
    }
    for (auto& u : state_->units()) out.grads.insert(out.grads.end(), u.grad.p, u.grad.p + u.numel);
    return out;
  }

  rt::ModelSpec spec_;
  std::unique_ptr<rt::HostState> state_;
  std::vector<int32_t> ids_, targets_, pos_;
  int64_t B_ = 2, T_ = 5;
};

TEST_P(SelectiveRecompute, AttentionKeptLayersAreBitIdenticalToRecompute) {
  const int64_t L = spec_.n_layers;
  for (int64_t chunk : {int64_t{0}, int64_t{3}}) {  // whole MLP and token chunks (MoE: ignored)
    const Result ref = run(0, 0, chunk);
    for (int64_t keep : {int64_t{0}, int64_t{1}})
      for (int64_t attn : {int64_t{1}, int64_t{2}, L, L + 2}) {
        const Result got = run(keep, attn, chunk);
        EXPECT_EQ(got.loss, ref.loss) << "keep " << keep << " attn " << attn << " chunk " << chunk;
        EXPECT_TRUE(got.grads == ref.grads)
            << "keep " << keep << " attn " << attn << " chunk " << chunk
            << ": gradients differ from recomputing every block";
      }
  }
}

std::string case_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"llama", "qwen2_tied", "qwen3_qknorm", "qwen2_moe",
                                       "olmoe", "olmo2_post_norms", "granite", "smollm3_no_rope",
                                       "gemma2_sandwich_window_softcap", "gemma3_local_rope"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Families, SelectiveRecompute, ::testing::Range(0, 10), case_name);

rt::ModelSpec seven_b() { return rt::spec_preset("qwen2.5-7b"); }

TEST(SelectiveRecomputePlan, AttentionHalfBytesAreItsBuffers) {
  // q, k, v, att, h (bf16) and the log-sum-exp (fp32); no q/k-norm inputs in Qwen2.5.
  const rt::ModelSpec s = seven_b();
  const rt::BlockDims dm{1, 2048, 0};
  const uint64_t N = 2048, QD = s.q_dim(), KD = s.kv_dim(), C = s.hidden;
  const uint64_t want = 2 * N * (QD + 2 * KD + QD + C) + 4 * N * s.n_heads + 2 * 2 + 4 * 2;  // + unused 1-elem bufs
  EXPECT_EQ(rt::block_attn_acts_bytes(s, dm, 2), want);
  EXPECT_LT(rt::block_attn_acts_bytes(s, dm, 2), rt::block_acts_bytes(s, dm, 2) / 4);
}

TEST(SelectiveRecomputePlan, RecomputeFlopsByKeptPart) {
  const rt::ModelSpec s = seven_b();
  const double C = s.hidden, QD = s.q_dim(), KD = s.kv_dim(), F = s.intermediate;
  const rt::BlockDims whole{1, 2048, 0}, chunked{1, 2048, 512};
  const double mlp = 4 * C * F;
  const double none = 2 * C * (QD + 2 * KD) + 2 * QD * C + 2 * QD * 2048 + mlp;
  EXPECT_DOUBLE_EQ(rt::layer_recompute_flops(s, whole, rt::KeptPart::none), none);
  EXPECT_DOUBLE_EQ(rt::layer_recompute_flops(s, whole, rt::KeptPart::attention), mlp);
  EXPECT_DOUBLE_EQ(rt::layer_recompute_flops(s, whole, rt::KeptPart::all), 0.0);
  EXPECT_DOUBLE_EQ(rt::layer_recompute_flops(s, chunked, rt::KeptPart::all), mlp);  // chunks recompute gate/up
}

TEST(SelectiveRecomputePlan, KeptLayersFillTheMemoryByFlopsPerByte) {
  const rt::ModelSpec s = seven_b();
  const int64_t L = s.n_layers;
  for (const rt::BlockDims dm : {rt::BlockDims{1, 2048, 0}, rt::BlockDims{1, 2048, 512}}) {
    const uint64_t f = rt::block_acts_bytes(s, dm, 2), a = rt::block_attn_acts_bytes(s, dm, 2);
    // nothing fits
    rt::KeptLayers k = rt::plan_kept_layers(s, dm, a - 1, 2, 1, -1, -1);
    EXPECT_EQ(k.all, 0);
    EXPECT_EQ(k.attention, 0);
    // room for 3 attention halves only: attention halves save more per byte than whole layers
    k = rt::plan_kept_layers(s, dm, 3 * a + a / 2, 2, 1, -1, -1);
    EXPECT_EQ(k.all, 0);
    EXPECT_EQ(k.attention, 3);
    // every layer's half and 2 upgrades (unchunked: a whole layer saves the MLP's gate/up too)
    k = rt::plan_kept_layers(s, dm, L * a + 2 * (f - a) + 1, 2, 1, -1, -1);
    if (dm.mlp_chunked()) {  // a whole kept layer saves nothing more than its attention half
      EXPECT_EQ(k.all, 0);
      EXPECT_EQ(k.attention, L);
    } else {
      EXPECT_EQ(k.all, 2);
      EXPECT_EQ(k.attention, L - 2);
    }
    // explicit counts are taken as given; auto fills what they leave
    k = rt::plan_kept_layers(s, dm, 2 * f + 5 * a, 2, 1, 2, -1);
    EXPECT_EQ(k.all, 2);
    EXPECT_EQ(k.attention, 5);
    k = rt::plan_kept_layers(s, dm, 0, 2, 1, 1, 4);
    EXPECT_EQ(k.all, 1);
    EXPECT_EQ(k.attention, 4);
    k = rt::plan_kept_layers(s, dm, 4 * a + f, 2, 1, -1, 4);
    EXPECT_EQ(k.attention, 4);
    EXPECT_EQ(k.all, 1);
    k = rt::plan_kept_layers(s, dm, uint64_t{1} << 50, 2, 1, 0, -1);
    EXPECT_EQ(k.all, 0);
    EXPECT_EQ(k.attention, L);
    k = rt::plan_kept_layers(s, dm, uint64_t{1} << 50, 2, 1, L + 5, L + 5);
    EXPECT_EQ(k.all, L);
    EXPECT_EQ(k.attention, 0);
  }
}

}  // namespace
