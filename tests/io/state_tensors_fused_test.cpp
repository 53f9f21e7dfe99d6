// Fused HF tensors (Phi3's qkv_proj and gate_up_proj): split into q/k/v and
// gate/up on load and written fused again on export, bit for bit; the
// exported config reads back to the same spec.
#include <gtest/gtest.h>

#include <cstring>

#include "cli/model_dir.h"
#include "io/hf_export.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "testutil.h"

namespace {

class FusedRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(FusedRoundTrip, ExportWritesTheCheckpointBackBitForBit) {
  const std::string dir = rt::test::fixture_dir() + "/hf/" + GetParam();
  rt::cli::LoadedModel m = rt::cli::load_model_dir(dir, false);
  // the split: q_proj is the first q_dim rows of qkv_proj, v_proj the last kv_dim
  auto src = rt::SafetensorsFile::open(dir + "/model.safetensors");
  const rt::TensorInfo* qkv = src->find("model.layers.1.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ(qkv->dtype, rt::DType::f32);
  const float* fused = reinterpret_cast<const float*>(qkv->data);
  const int64_t d = m.spec.hidden, q = m.spec.q_dim(), kv = m.spec.kv_dim();
  const float* qw = m.state->master_view("model.layers.1.self_attn.q_proj.weight");
  const float* vw = m.state->master_view("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(std::memcmp(qw, fused, static_cast<size_t>(q * d) * 4), 0);
  EXPECT_EQ(std::memcmp(vw, fused + (q + kv) * d, static_cast<size_t>(kv * d) * 4), 0);
  const float* up = m.state->master_view("model.layers.0.mlp.up_proj.weight");
  const rt::TensorInfo* gu = src->find("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(std::memcmp(up, reinterpret_cast<const float*>(gu->data) + m.spec.intermediate * d,
                        static_cast<size_t>(m.spec.intermediate * d) * 4),
            0);

  rt::test::TempDir tmp;
  rt::ExportOptions eo;
  eo.dtype = rt::DType::f32;
  eo.tokenizer = "";
  rt::export_hf_dir(tmp.file("hf"), *m.state, eo);
  auto out = rt::SafetensorsFile::open(tmp.file("hf/model.safetensors"));
  ASSERT_EQ(out->tensors().size(), src->tensors().size());
  for (const rt::TensorInfo& t : src->tensors()) {
    const rt::TensorInfo* o = out->find(t.name);
    ASSERT_NE(o, nullptr) << "the export lacks " << t.name;
    EXPECT_EQ(o->shape, t.shape) << t.name;
    ASSERT_EQ(o->nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(o->data, t.data, t.nbytes), 0) << t.name << " differs";
  }
  const rt::ModelSpec back = rt::spec_from_config_file(tmp.file("hf"));
  EXPECT_EQ(back.rope.scaling, m.spec.rope.scaling);
  EXPECT_EQ(back.rope.partial_rotary_factor, m.spec.rope.partial_rotary_factor);
  EXPECT_EQ(back.rope.short_factor, m.spec.rope.short_factor);
  EXPECT_EQ(back.rope.long_factor, m.spec.rope.long_factor);
  EXPECT_EQ(back.rope.attention_factor, m.spec.rope.attention_factor);
  EXPECT_EQ(back.rope.original_max_positions, m.spec.rope.original_max_positions);
  EXPECT_EQ(back.sliding_window, m.spec.sliding_window);
  EXPECT_EQ(back.tie_embeddings, m.spec.tie_embeddings);
  // and the export loads again
  rt::cli::LoadedModel again = rt::cli::load_model_dir(tmp.file("hf"), false);
  EXPECT_EQ(std::memcmp(again.state->master_view("model.layers.1.self_attn.k_proj.weight"),
                        m.state->master_view("model.layers.1.self_attn.k_proj.weight"),
                        static_cast<size_t>(kv * d) * 4),
            0);
}

INSTANTIATE_TEST_SUITE_P(Phi3, FusedRoundTrip, ::testing::Values("phi3_longrope_short", "phi4mini_partial_tied"));

}  // namespace
