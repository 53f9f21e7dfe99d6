// The HF weight table against the models transformers builds, canonical order,
// and the messages of weight_map_check.
// Reference: tests/fixtures/model/hf_weight_maps.json, written by
// tools/make_weight_map_fixture.py with transformers (config as transformers
// writes it + every parameter name and shape of the model it builds).
#include "model/weight_map.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "model/spec.h"
#include "testutil.h"

namespace {

using rt::FoundTensor;
using rt::ModelSpec;
using rt::WeightKind;

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::vector<FoundTensor> found_from(const ModelSpec& s) {
  std::vector<FoundTensor> f;
  for (const auto& e : rt::weight_map(s)) f.push_back({e.name, e.shape});
  return f;
}

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(WeightMap, MatchesTransformersForEveryFamily) {
  std::string path = rt::path_join(rt::test::fixture_dir(), "model/hf_weight_maps.json");
  nlohmann::json fx = nlohmann::json::parse(rt::read_text_file(path));
  ASSERT_EQ(fx["cases"].size(), 4u);
  for (const auto& c : fx["cases"]) {
    std::string name = c["name"];
    SCOPED_TRACE(name);
    // The config as transformers 5 writes it parses (5.x dialect from the source).
    ModelSpec s = rt::spec_from_config_text(c["config"].dump(), name + "/config.json");
    EXPECT_EQ(rt::family_name(s.family), name);
    std::set<std::pair<std::string, std::vector<int64_t>>> want, got;
    std::vector<FoundTensor> found;
    for (const auto& t : c["tensors"]) {
      want.insert({t[0].get<std::string>(), t[1].get<std::vector<int64_t>>()});
      found.push_back({t[0].get<std::string>(), t[1].get<std::vector<int64_t>>()});
    }
    auto map = rt::weight_map(s);
    for (const auto& e : map) got.insert({e.name, e.shape});
    EXPECT_EQ(got.size(), map.size()) << "duplicate names";
    EXPECT_EQ(got, want);
    EXPECT_EQ(s.params_total(), c["num_params"].get<int64_t>());
    EXPECT_EQ(rt::weight_map_check(s, found), "");
  }
}

TEST(WeightMap, CanonicalOrderQwen2) {
  ModelSpec s = rt::spec_preset("qwen2.5-0.5b");  // qkv bias, tied
  auto m = rt::weight_map(s);
  ASSERT_EQ(m.size(), 1 + 24 * 12 + 1u);
  EXPECT_EQ(m.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(m.front().shape, (std::vector<int64_t>{151936, 896}));
  EXPECT_EQ(m.front().layer, -1);
  EXPECT_EQ(m.back().name, "model.norm.weight");  // no lm_head: tied
  std::vector<WeightKind> kinds;
  for (const auto& e : rt::layer_weight_map(s, 3)) {
    kinds.push_back(e.kind);
    EXPECT_EQ(e.layer, 3);
    EXPECT_EQ(e.name.rfind("model.layers.3.", 0), 0u) << e.name;
  }
  EXPECT_EQ(kinds, (std::vector<WeightKind>{WeightKind::attn_norm, WeightKind::q_proj, WeightKind::q_bias,
                                            WeightKind::k_proj, WeightKind::k_bias, WeightKind::v_proj,
                                            WeightKind::v_bias, WeightKind::o_proj, WeightKind::mlp_norm,
                                            WeightKind::gate_proj, WeightKind::up_proj, WeightKind::down_proj}));
  auto l = rt::layer_weight_map(s, 0);
  EXPECT_EQ(l[2].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(l[2].shape, std::vector<int64_t>{896});
  EXPECT_EQ(l[3].shape, (std::vector<int64_t>{128, 896}));  // 2 kv heads x 64
  EXPECT_EQ(l[7].shape, (std::vector<int64_t>{896, 896}));
  EXPECT_EQ(l[11].shape, (std::vector<int64_t>{896, 4864}));
}

TEST(WeightMap, CanonicalOrderQwen3AndLlama) {
  ModelSpec q3 = rt::spec_preset("qwen3-8b");
  std::vector<std::string> names;
  for (const auto& e : rt::layer_weight_map(q3, 0)) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                       "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                       "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
                       "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
                       "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                       "model.layers.0.mlp.down_proj.weight"}));
  auto m = rt::weight_map(rt::spec_preset("llama-3.1-8b"));
  ASSERT_EQ(m.size(), 1 + 32 * 9 + 2u);
  EXPECT_EQ(m.back().name, "lm_head.weight");
  EXPECT_EQ(m.back().kind, WeightKind::lm_head);
  EXPECT_EQ(m.back().shape, (std::vector<int64_t>{128256, 4096}));
  EXPECT_EQ(m[m.size() - 2].kind, WeightKind::final_norm);
}

TEST(WeightMap, NormsAndBiasesAreMarked) {
  const std::set<WeightKind> nb = {WeightKind::attn_norm, WeightKind::mlp_norm, WeightKind::final_norm,
                                   WeightKind::q_norm,    WeightKind::k_norm,   WeightKind::q_bias,
                                   WeightKind::k_bias,    WeightKind::v_bias};
  for (const char* p : {"qwen2.5-0.5b", "qwen3-8b", "llama-3.1-8b"})
    for (const auto& e : rt::weight_map(rt::spec_preset(p))) {
      EXPECT_EQ(e.is_norm_or_bias, nb.count(e.kind) == 1) << e.name;
      EXPECT_EQ(e.is_norm_or_bias, e.shape.size() == 1) << e.name;  // exactly the 1-D tensors
    }
}

TEST(WeightMap, NumelSumsToParamsTotalForEveryPreset) {
  for (const auto& name : rt::preset_names()) {
    ModelSpec s = rt::spec_preset(name);
    int64_t total = 0, layer0 = 0;
    for (const auto& e : rt::weight_map(s)) total += e.numel();
    for (const auto& e : rt::layer_weight_map(s, 0)) layer0 += e.numel();
    EXPECT_EQ(total, s.params_total()) << name;
    EXPECT_EQ(layer0, s.params_per_layer()) << name;
  }
}

TEST(WeightMap, LayerOutOfRange) {
  ModelSpec s = rt::spec_preset("tiny-byte");
  EXPECT_THROW(rt::layer_weight_map(s, 6), rt::Error);
  EXPECT_THROW(rt::layer_weight_map(s, -1), rt::Error);
  EXPECT_EQ(rt::layer_weight_map(s, 5).size(), 9u);
}

TEST(WeightMap, KindNames) {
  EXPECT_STREQ(rt::weight_kind_name(WeightKind::embed), "embed");
  EXPECT_STREQ(rt::weight_kind_name(WeightKind::q_bias), "q_bias");
  EXPECT_STREQ(rt::weight_kind_name(WeightKind::down_proj), "down_proj");
  EXPECT_STREQ(rt::weight_kind_name(WeightKind::lm_head), "lm_head");
}

// A Qwen2-shaped spec with hidden 512, 8 heads of 64, 2 kv heads: kv_dim 128.
ModelSpec small_qwen2() {
  ModelSpec s = rt::spec_preset("qwen2.5-0.5b");
  s.hidden = 512;
  s.intermediate = 1024;
  s.n_layers = 2;
  s.n_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 1000;
  s.bos_id = 1;
  s.eos_ids = {2};
  s.tie_embeddings = false;
  s.validate("test");
  return s;
}

TEST(WeightMapCheck, ShapeMismatchNamesTensorAndConfigFields) {
  ModelSpec s = small_qwen2();
  auto found = found_from(s);
  for (auto& t : found)
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {512, 512};
  std::string r = rt::weight_map_check(s, found);
  EXPECT_HAS(r, "0 missing, 0 unexpected, 1 with the wrong shape");
  EXPECT_HAS(r,
             "\n  model.layers.0.self_attn.k_proj.weight: expected [128, 512], found [512, 512] \u2014 check "
             "num_key_value_heads/head_dim in config.json");
  EXPECT_EQ(count_lines(r), 1);
}

TEST(WeightMapCheck, MissingAndUnexpected) {
  ModelSpec s = small_qwen2();
  auto found = found_from(s);
  // A Llama-style checkpoint loaded with a Qwen2 config: no q/k/v biases.
  std::vector<FoundTensor> kept;
  for (const auto& t : found)
    if (t.name.find("_proj.bias") == std::string::npos) kept.push_back(t);
  kept.push_back({"model.layers.1.self_attn.o_proj.bias", {512}});
  kept.push_back({"model.layers.0.self_attn.o_proj.bias", {512}});
  kept.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {32}});  // tolerated buffer
  std::string r = rt::weight_map_check(s, kept);
  EXPECT_HAS(r, "6 missing, 2 unexpected, 0 with the wrong shape");
  EXPECT_HAS(r, "\n  missing: model.layers.0.self_attn.q_proj.bias [512]");
  EXPECT_HAS(r, "\n  missing: model.layers.1.self_attn.v_proj.bias [128]");
  EXPECT_HAS(r, "\n  unexpected: model.layers.0.self_attn.o_proj.bias [512] (qwen2 has no such bias)");
  EXPECT_EQ(r.find("inv_freq"), std::string::npos);
  EXPECT_EQ(count_lines(r), 8);
  // Missing in canonical order, then unexpected sorted (layer 0 before layer 1).
  EXPECT_LT(r.find("layers.0.self_attn.q_proj.bias"), r.find("layers.0.self_attn.k_proj.bias"));
  EXPECT_LT(r.find("layers.0.self_attn.v_proj.bias"), r.find("layers.1.self_attn.q_proj.bias"));
  EXPECT_LT(r.find("layers.1.self_attn.v_proj.bias"), r.find("unexpected: model.layers.0"));
  EXPECT_LT(r.find("unexpected: model.layers.0"), r.find("unexpected: model.layers.1"));
}

TEST(WeightMapCheck, UnexpectedSortedNumerically) {
  ModelSpec s = small_qwen2();
  auto found = found_from(s);
  found.push_back({"model.layers.10.extra.weight", {1}});
  found.push_back({"model.layers.2.extra.weight", {1}});
  std::string r = rt::weight_map_check(s, found);
  EXPECT_LT(r.find("layers.2.extra"), r.find("layers.10.extra"));
}

TEST(WeightMapCheck, TiedAndUntiedLmHead) {
  ModelSpec s = small_qwen2();
  auto found = found_from(s);
  std::vector<FoundTensor> no_head(found.begin(), found.end() - 1);
  ASSERT_EQ(found.back().name, "lm_head.weight");
  // Untied spec, checkpoint without lm_head: missing, with the tie hint.
  std::string r = rt::weight_map_check(s, no_head);
  EXPECT_HAS(r, "missing: lm_head.weight [1000, 512] (if the checkpoint ties embeddings, set tie_word_embeddings true");
  // Tied spec: no lm_head is right; a copy of the right shape is tolerated; a wrong one is reported.
  s.tie_embeddings = true;
  EXPECT_EQ(rt::weight_map_check(s, no_head), "");
  EXPECT_EQ(rt::weight_map_check(s, found), "");
  found.back().shape = {999, 512};
  EXPECT_HAS(rt::weight_map_check(s, found),
             "lm_head.weight: expected [1000, 512] (tied to the embedding), found [999, 512]");
}

TEST(WeightMapCheck, DuplicatesAndCap) {
  ModelSpec s = small_qwen2();
  auto found = found_from(s);
  found.push_back(found[0]);
  EXPECT_HAS(rt::weight_map_check(s, found), "duplicated: model.embed_tokens.weight");
  // Nothing found for 100 layers: 100 * 12 + 3 missing, 40 shown.
  s.n_layers = 100;
  std::string r = rt::weight_map_check(s, {});
  EXPECT_HAS(r, "1203 missing, 0 unexpected, 0 with the wrong shape (expected 1203 tensors");
  EXPECT_HAS(r, "\n  ... and 1163 more");
  EXPECT_EQ(count_lines(r), 41);
  // A config.json asking for far more (or fewer) layers than the files hold
  // is told in one line, without listing millions of tensors.
  s.n_layers = 10000000;
  EXPECT_EQ(rt::weight_map_check(s, found_from(small_qwen2())),
            "config.json has num_hidden_layers 10000000, the weights hold 2 (model.layers.0 .. 1): fix "
            "num_hidden_layers or use the matching weights\n");
  s.n_layers = 1;
  ModelSpec wide = small_qwen2();
  wide.n_layers = 100;
  EXPECT_HAS(rt::weight_map_check(s, found_from(wide)), "num_hidden_layers 1, the weights hold 100");
}

}  // namespace
