// GptOssForCausalLM (model/spec_gptoss.cpp): both config dialects and their
// defaults, the config writer, the weight map's fused expert tensors
// (layout as weight_map.h states it), and the hub checkpoints' MXFP4 expert
// tensors dequantized at load against values derived from the format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/model_dir.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "model/spec.h"
#include "model/weight_map.h"
#include "testutil.h"

namespace {

using rt::Family;
using rt::ModelSpec;
using rt::RopeScaling;

// gpt-oss-20b's config.json as the hub holds it (transformers 4.55 dialect), shrunk to 4 layers.
const char* kHub4x = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
  "full_attention"], "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
  "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
  "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 201088
})";

TEST(SpecGptOss, HubConfigReadsAsTransformersMeansIt) {
  const ModelSpec s = rt::spec_from_config_text(kHub4x, "hub");
  EXPECT_EQ(s.family, Family::gpt_oss);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_TRUE(s.qkv_bias && s.o_bias && s.attn_sinks);
  EXPECT_EQ(s.layer_window(0), 128);
  EXPECT_EQ(s.layer_window(1), 0);
  EXPECT_EQ(s.layer_window(2), 128);
  EXPECT_EQ(s.rope.scaling, RopeScaling::yarn);
  EXPECT_EQ(s.rope.theta, 150000.0);
  EXPECT_EQ(s.rope.factor, 32.0);
  EXPECT_FALSE(s.rope.truncate);
  EXPECT_EQ(s.rope.original_max_positions, 4096);
  EXPECT_DOUBLE_EQ(s.rope.attention_factor, 0.1 * std::log(32.0) + 1.0);  // transformers' yarn_get_mscale
  EXPECT_EQ(s.moe.n_experts, 32);
  EXPECT_EQ(s.moe.top_k, 4);
  EXPECT_EQ(s.moe.expert_intermediate, 2880);
  EXPECT_TRUE(s.moe.router_bias && s.moe.topk_softmax && s.moe.expert_bias);
  EXPECT_EQ(s.moe.glu_limit, 7.0);
  EXPECT_EQ(s.moe.glu_alpha, 1.702);  // 4.x hard-codes it
  EXPECT_FALSE(s.moe.aux_loss_on());
  EXPECT_EQ(s.max_sequence(), 131072);  // windows are real windows: sequences may exceed them
}

TEST(SpecGptOss, DefaultsOfAnEmptyConfigAreGptOssConfigs) {
  const ModelSpec s = rt::spec_from_config_text(
      R"({"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
          "num_attention_heads": 16, "vocab_size": 100})",
      "min");
  EXPECT_EQ(s.n_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.rope.scaling, RopeScaling::yarn);
  EXPECT_EQ(s.rope.theta, 150000.0);
  EXPECT_FALSE(s.rope.truncate);
  ASSERT_EQ(s.local_layers.size(), 3u);
  EXPECT_EQ(s.local_layers[0], 1);  // (i + 1) % 2: even layers slide
  EXPECT_EQ(s.local_layers[1], 0);
  EXPECT_EQ(s.local_layers[2], 1);
  EXPECT_EQ(s.local_window, 128);
  EXPECT_EQ(s.moe.n_experts, 128);
  EXPECT_EQ(s.moe.top_k, 4);
  EXPECT_EQ(s.rms_eps, 1e-5);
}

TEST(SpecGptOss, RefusesTheLoadBalancingLoss) {
  std::string t = kHub4x;
  t.replace(t.find("\"output_router_logits\": false"), 29, "\"output_router_logits\": true");
  EXPECT_THROW(
      {
        try {
          rt::spec_from_config_text(t, "aux");
        } catch (const rt::Error& e) {
          EXPECT_NE(std::string(e.what()).find("output_router_logits"), std::string::npos) << e.what();
          throw;
        }
      },
      rt::Error);
}

// A RoPE scaling gpt-oss does not have (llama3 here; found by fuzz/config_json_fuzz) is refused when read: an
// accepted config must write back (spec_to_config_json takes yarn or default only).
TEST(SpecGptOss, RefusesARopeScalingOtherThanYarn) {
  const std::string t = R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 48,
    "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 104, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5,
    "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 32, "rope_theta": 10000.0}})";
  rt::test::expect_error([&] { rt::spec_from_config_text(t, "llama3"); },
                         {"llama3", "a RoPE scaling other than yarn or default"});
}

TEST(SpecGptOss, WrittenConfigReadsBackTheSame) {
  const ModelSpec a = rt::spec_preset("gpt-oss-20b");
  const std::string text = rt::spec_to_config_json(a);
  const ModelSpec b = rt::spec_from_config_text(text, "written");
  EXPECT_EQ(b.family, Family::gpt_oss);
  EXPECT_EQ(b.params_total(), a.params_total());
  EXPECT_EQ(b.local_layers, a.local_layers);
  EXPECT_EQ(b.local_window, a.local_window);
  EXPECT_EQ(b.rope.factor, a.rope.factor);
  EXPECT_EQ(b.rope.attention_factor, a.rope.attention_factor);
  EXPECT_EQ(b.rope.truncate, a.rope.truncate);
  EXPECT_EQ(b.moe.glu_limit, a.moe.glu_limit);
  EXPECT_EQ(b.moe.glu_alpha, a.moe.glu_alpha);
  EXPECT_EQ(b.moe.top_k, a.moe.top_k);
  EXPECT_EQ(rt::spec_to_config_json(b), text);
}

// The presets against the hub's parameter counts (the model cards: 20.9B and 116.8B in total,
// 3.6B and 5.1B active; the counts below are those of the released bf16/MXFP4 tensors' shapes).
TEST(SpecGptOss, PresetSizes) {
  const ModelSpec s20 = rt::spec_preset("gpt-oss-20b"), s120 = rt::spec_preset("gpt-oss-120b");
  EXPECT_NEAR(static_cast<double>(s20.params_total()) / 1e9, 20.91, 0.01);
  EXPECT_NEAR(static_cast<double>(s120.params_total()) / 1e9, 116.83, 0.01);
  EXPECT_NEAR(static_cast<double>(s20.params_active()) / 1e9, 4.19, 0.02);  // embedding and head counted too
  EXPECT_NEAR(static_cast<double>(s120.params_active()) / 1e9, 5.70, 0.02);
}

// weight_map.h's layout of the fused expert tensors, element by element.
TEST(WeightMapGptOss, FusedExpertLayoutAsStated) {
  ModelSpec s = rt::spec_from_config_text(
      R"({"model_type": "gpt_oss", "hidden_size": 6, "intermediate_size": 4, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "num_local_experts": 3,
          "num_experts_per_tok": 2, "vocab_size": 10})",
      "tiny");
  const int64_t E = 3, C = 6, F = 4;
  const auto fused = rt::fused_tensors(s);
  ASSERT_EQ(fused.size(), 4u);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const auto& e : rt::weight_map(s)) shape[e.name] = e.shape;
  auto shapes_of = [&](const rt::FusedTensor& f) {
    std::vector<std::vector<int64_t>> v;
    for (const auto& p : f.parts) v.push_back(shape.at(p));
    return v;
  };
  const std::string p = "model.layers.0.mlp.experts.";
  // gate_up_proj [E, C, 2F]: [e, c, 2f] = gate_e[f, c], [e, c, 2f+1] = up_e[f, c]
  const rt::FusedTensor& gu = fused[0];
  ASSERT_EQ(gu.name, p + "gate_up_proj");
  EXPECT_EQ(gu.shape, (std::vector<int64_t>{E, C, 2 * F}));
  std::vector<float> all(static_cast<size_t>(E * C * 2 * F));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  const auto sh = shapes_of(gu);
  for (int64_t e = 0; e < E; ++e)
    for (int which = 0; which < 2; ++which) {
      ASSERT_EQ(gu.parts[static_cast<size_t>(2 * e + which)],
                p + std::to_string(e) + (which ? ".up_proj.weight" : ".gate_proj.weight"));
      std::vector<float> part(static_cast<size_t>(F * C));
      rt::fused_gather(gu, sh, static_cast<size_t>(2 * e + which), all.data(), part.data());
      for (int64_t f = 0; f < F; ++f)
        for (int64_t c = 0; c < C; ++c)
          EXPECT_EQ(part[f * C + c], all[(e * C + c) * 2 * F + 2 * f + which])
              << e << " " << which << " " << f << " " << c;
      std::vector<float> back(all.size(), -1.f);
      rt::fused_scatter(gu, sh, static_cast<size_t>(2 * e + which), part.data(), back.data());
      for (int64_t f = 0; f < F; ++f)
        for (int64_t c = 0; c < C; ++c) EXPECT_EQ(back[(e * C + c) * 2 * F + 2 * f + which], part[f * C + c]);
    }
  // down_proj [E, F, C]: [e, f, c] = down_e[c, f]
  const rt::FusedTensor& dn = fused[2];
  ASSERT_EQ(dn.name, p + "down_proj");
  EXPECT_EQ(dn.shape, (std::vector<int64_t>{E, F, C}));
  const auto shd = shapes_of(dn);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<float> part(static_cast<size_t>(C * F));
    rt::fused_gather(dn, shd, static_cast<size_t>(e), all.data(), part.data());
    for (int64_t c = 0; c < C; ++c)
      for (int64_t f = 0; f < F; ++f) EXPECT_EQ(part[c * F + f], all[(e * F + f) * C + c]);
  }
  // gate_up_proj_bias [E, 2F]: [e, 2f] = gate_bias_e[f], [e, 2f+1] = up_bias_e[f]
  const rt::FusedTensor& gub = fused[1];
  ASSERT_EQ(gub.name, p + "gate_up_proj_bias");
  const auto shb = shapes_of(gub);
  std::vector<float> part(static_cast<size_t>(F));
  rt::fused_gather(gub, shb, 3, all.data(), part.data());  // expert 1's up bias
  for (int64_t f = 0; f < F; ++f) EXPECT_EQ(part[f], all[1 * 2 * F + 2 * f + 1]);
}

// e2m1 from its bits, as the OCP MX spec defines it: sign bit 3, exponent
// bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal (m * 0.5).
double e2m1(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return s ? -mag : mag;
}

void put_u32le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A one-layer gpt-oss checkpoint whose experts are MXFP4 blocks and scales,
// the rest fp32; every tensor's values random. Loaded, each expert weight
// must equal its code times its power of two, placed as transformers places
// it (W [E, R, K] transposed into gate_up_proj / down_proj, gate and up rows
// interleaved); exported, the fused tensors must hold the same values.
TEST(LoadGptOss, Mxfp4ExpertsDequantizeAtLoad) {
  const int64_t C = 64, F = 32, E = 2, H = 4, G = 2, D = 16, V = 16;
  const std::string cfg = rt::cat(R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
      "hidden_size": )",
                                  C, R"(, "intermediate_size": )", F, R"(, "num_hidden_layers": 1,
      "num_attention_heads": )",
                                  H, R"(, "num_key_value_heads": )", G, R"(, "head_dim": )", D,
                                  R"(, "num_local_experts": )", E, R"(, "num_experts_per_tok": 1, "vocab_size": )", V,
                                  R"(, "layer_types": ["full_attention"], "tie_word_embeddings": false})");
  const ModelSpec s = rt::spec_from_config_text(cfg, "mx");
  std::mt19937 rng(5);
  struct Raw {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Raw> raws;
  for (const auto& e : rt::hf_weight_map(s)) {
    const bool mx = e.name.ends_with("gate_up_proj") || e.name.ends_with("down_proj");
    if (!mx) {
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::string b(static_cast<size_t>(e.numel()) * 4, '\0');
      for (int64_t i = 0; i < e.numel(); ++i) {
        const float v = u(rng);
        std::memcpy(&b[static_cast<size_t>(i) * 4], &v, 4);
      }
      raws.push_back({e.name, "F32", e.shape, b});
      continue;
    }
    // param shape [E, K, R]: blocks [E, R, K/32, 16], scales [E, R, K/32]
    const int64_t K = e.shape[1], R = e.shape[2];
    std::string blocks(static_cast<size_t>(E * R * K / 2), '\0'), scales(static_cast<size_t>(E * R * K / 32), '\0');
    for (auto& c : blocks) c = static_cast<char>(rng() & 0xff);
    for (auto& c : scales) c = static_cast<char>(118 + rng() % 16);  // 2^-9 .. 2^6
    raws.push_back({e.name + "_blocks", "U8", {E, R, K / 32, 16}, blocks});
    raws.push_back({e.name + "_scales", "U8", {E, R, K / 32}, scales});
  }
  nlohmann::ordered_json h;
  std::string data;
  for (const auto& r : raws) {
    h[r.name] = {{"dtype", r.dtype}, {"shape", r.shape}, {"data_offsets", {data.size(), data.size() + r.bytes.size()}}};
    data += r.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file;
  put_u32le(file, header.size());
  file += header + data;
  rt::test::TempDir dir;
  rt::write_file_atomic(dir.path() + "/config.json", cfg);
  rt::write_file_atomic(dir.path() + "/model.safetensors", file);
  const rt::cli::LoadedModel m = rt::cli::load_model_dir(dir.path(), false);

  auto raw = [&](const std::string& name) -> const Raw& {
    for (const auto& r : raws)
      if (r.name == name) return r;
    ADD_FAILURE() << "no " << name;
    return raws[0];
  };
  // W[e, r, k] from the blocks and scales of `name`
  auto W = [&](const std::string& name, int64_t R, int64_t K, int64_t e, int64_t r, int64_t k) {
    const Raw& b = raw(name + "_blocks");
    const Raw& sc = raw(name + "_scales");
    const uint8_t byte =
        static_cast<uint8_t>(b.bytes[static_cast<size_t>(((e * R + r) * (K / 32) + k / 32) * 16 + (k % 32) / 2)]);
    const int code = k % 2 ? byte >> 4 : byte & 0x0f;
    const int scale = static_cast<uint8_t>(sc.bytes[static_cast<size_t>((e * R + r) * (K / 32) + k / 32)]);
    return static_cast<float>(std::ldexp(e2m1(code), scale - 127));
  };
  const std::string p = "model.layers.0.mlp.experts.";
  int64_t nonzero = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float* gate = m.state->master_view(p + std::to_string(e) + ".gate_proj.weight");
    const float* up = m.state->master_view(p + std::to_string(e) + ".up_proj.weight");
    const float* down = m.state->master_view(p + std::to_string(e) + ".down_proj.weight");
    for (int64_t f = 0; f < F; ++f)
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_EQ(gate[f * C + c], W(p + "gate_up_proj", 2 * F, C, e, 2 * f, c));
        ASSERT_EQ(up[f * C + c], W(p + "gate_up_proj", 2 * F, C, e, 2 * f + 1, c));
        ASSERT_EQ(down[c * F + f], W(p + "down_proj", C, F, e, c, f));
        nonzero += gate[f * C + c] != 0.f;
      }
  }
  EXPECT_GT(nonzero, E * F * C / 2);
  // exported fp32: gate_up_proj[e, k, r] = W[e, r, k]
  for (const auto& t : rt::master_tensors(*m.state, rt::DType::f32)) {
    if (t.name != p + "gate_up_proj") continue;
    ASSERT_EQ(t.shape, (std::vector<int64_t>{E, C, 2 * F}));
    const std::vector<float> v = rt::tensor_write_gather(t, E * C * 2 * F);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < C; ++k)
        for (int64_t r = 0; r < 2 * F; ++r) ASSERT_EQ(v[(e * C + k) * 2 * F + r], W(t.name, 2 * F, C, e, r, k));
  }
}

}  // namespace
