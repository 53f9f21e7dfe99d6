// Gemma3ForConditionalGeneration through the ramtrain binary: train its
// language model from the gemma3_multimodal fixture (tools/make_hf_fixtures.py)
// and export; the export is a Gemma3ForConditionalGeneration again whose
// vision tower and projector are the source's bytes, whose language model is
// the trained one under the source's names, and whose config.json is the
// source's with only the dtype changed. Sources in both naming conventions
// (model/spec_multimodal.h): the fixture as transformers 5.25 saved it
// (language_model.model.*, one file, F32, tied) and a copy made here in 5.x
// names (model.language_model.*, lm_head.weight untied, sharded, the carried
// tensors in BF16). Then the errors when the source changed before `export`.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/fs.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "testutil.h"

namespace {

using rt::test::contains;
using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;
using json = nlohmann::json;

std::string fixture() { return rt::test::fixture_dir() + "/hf/gemma3_multimodal"; }

bool is_language(const std::string& n) {
  return n.rfind("language_model.", 0) == 0 || n.rfind("model.language_model.", 0) == 0 || n == "lm_head.weight";
}

// The fixture rewritten in transformers 5.x names, untied (lm_head.weight a
// copy of the embedding), sharded, the carried tensors stored as BF16.
void make_v5_source(const std::string& dir) {
  rt::make_dirs(dir);
  json cfg = json::parse(rt::read_text_file(fixture() + "/config.json"));
  cfg["tie_word_embeddings"] = false;
  cfg["text_config"]["tie_word_embeddings"] = false;
  write_bytes(dir + "/config.json", cfg.dump(2));
  rt::SafetensorsModel src = rt::SafetensorsModel::open(fixture());
  std::vector<std::vector<float>> bufs;
  std::vector<rt::TensorWrite> w;
  for (const rt::TensorInfo* t : src.all()) {
    bufs.emplace_back(static_cast<size_t>(t->numel()));
    rt::tensor_to_f32(*t, bufs.back().data());
    std::string name = t->name;
    rt::DType dt = rt::DType::f32;
    if (name.rfind("language_model.model.", 0) == 0) {
      name = "model.language_model." + name.substr(21);
    } else {
      name = "model." + name;
      dt = rt::DType::bf16;
    }
    w.push_back({name, t->shape, bufs.back().data(), dt, {}});
    if (t->name == "language_model.model.embed_tokens.weight")
      w.push_back({"lm_head.weight", t->shape, bufs.back().data(), rt::DType::f32, {}});
  }
  rt::safetensors_write_model(dir, w, 60 << 10);
  ASSERT_TRUE(rt::file_exists(dir + "/model.safetensors.index.json"));
}

void write_data(const std::string& path) {
  std::mt19937 rng(5);
  std::vector<int32_t> ids(400);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % 100);
  rt::token_file_write(path, ids, 112);
}

std::string train_args(const TempDir& tmp, const std::string& model, const std::string& out) {
  return "train --model " + model + " --device cpu --data " + tmp.file("data.bin") +
         " --seq-len 8 --micro-batch 2 --steps 2 --lr 1e-2 --warmup 0 --eval-batches 1 --save-every 2 --out " + out +
         " --export-dtype fp32";
}

// The export against its source: the same tensor names; every carried tensor
// byte-identical (dtype, shape, bytes); the language model's in F32 and
// trained (some differ from the source); config.json the source's but for dtype.
void expect_export_of(const std::string& exported, const std::string& source) {
  rt::SafetensorsModel e = rt::SafetensorsModel::open(exported), s = rt::SafetensorsModel::open(source);
  ASSERT_EQ(e.all().size(), s.all().size());
  int carried = 0, changed = 0;
  for (const rt::TensorInfo* st : s.all()) {
    const rt::TensorInfo* et = e.find(st->name);
    ASSERT_NE(et, nullptr) << "the export lacks " << st->name;
    ASSERT_EQ(et->shape, st->shape) << st->name;
    if (is_language(st->name)) {
      EXPECT_EQ(et->dtype, rt::DType::f32) << st->name;
      std::vector<float> a(static_cast<size_t>(st->numel())), b(a.size());
      rt::tensor_to_f32(*st, a.data());
      rt::tensor_to_f32(*et, b.data());
      changed += a != b;
      continue;
    }
    ++carried;
    EXPECT_EQ(et->dtype, st->dtype) << st->name;
    ASSERT_EQ(et->nbytes, st->nbytes) << st->name;
    EXPECT_EQ(std::memcmp(et->data, st->data, st->nbytes), 0) << "carried tensor " << st->name << " changed";
  }
  EXPECT_EQ(carried, 34);  // reference.json's carried_parameters
  EXPECT_GT(changed, 10) << "the language model did not train";
  json ec = json::parse(rt::read_text_file(exported + "/config.json"));
  json sc = json::parse(rt::read_text_file(source + "/config.json"));
  EXPECT_EQ(ec["torch_dtype"], "float32");
  for (const char* k : {"torch_dtype", "dtype"}) {
    ec.erase(k);
    sc.erase(k);
  }
  EXPECT_EQ(ec, sc);
}

TEST(MultimodalExport, TrainsTheLanguageModelAndCarriesTheVisionTowerInBothNamings) {
  TempDir tmp;
  write_data(tmp.file("data.bin"));
  make_v5_source(tmp.file("v5"));
  for (const std::string& src : {fixture(), tmp.file("v5")}) {
    SCOPED_TRACE(src);
    const std::string out = tmp.file(src == fixture() ? "run4" : "run5");
    auto r = run_ramtrain(train_args(tmp, src, out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output,
                         "is Gemma3ForConditionalGeneration: training its language model; carrying 34 other "
                         "tensors"))
        << r.output;
    expect_export_of(out + "/final", src);
    // `ramtrain export` of the checkpoint gives the same files
    r = run_ramtrain("export " + out + "/ckpt-00000002 --out " + tmp.file("again") + " --dtype fp32");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_export_of(tmp.file("again"), src);
    // and the export loads as a model: ramtrain loss reads its language model
    r = run_ramtrain("loss --model " + out + "/final --tokens " + fixture() + "/tokens.txt --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  // the 5.x source was untied: the export holds lm_head.weight, trained
  EXPECT_NE(rt::SafetensorsModel::open(tmp.file("run5/final")).find("lm_head.weight"), nullptr);
}

TEST(MultimodalExport, ChangedOrMissingSourceIsReported) {
  TempDir tmp;
  write_data(tmp.file("data.bin"));
  const std::string src = tmp.file("src");
  std::filesystem::copy(fixture(), src);
  auto r = run_ramtrain(train_args(tmp, src, tmp.file("run")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = tmp.file("run/ckpt-00000002");

  // the source now holds only the language model: nothing to carry
  {
    rt::SafetensorsModel m = rt::SafetensorsModel::open(src);
    std::vector<std::vector<float>> bufs;
    std::vector<rt::TensorWrite> w;
    for (const rt::TensorInfo* t : m.all())
      if (is_language(t->name)) {
        bufs.emplace_back(static_cast<size_t>(t->numel()));
        rt::tensor_to_f32(*t, bufs.back().data());
        w.push_back({t->name, t->shape, bufs.back().data(), rt::DType::f32, {}});
      }
    rt::safetensors_write(tmp.file("lm_only.safetensors"), w);
  }
  std::filesystem::rename(tmp.file("lm_only.safetensors"), src + "/model.safetensors");
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("x1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "holds only the language model's tensors, no vision tower or projector")) << r.output;
  EXPECT_FALSE(rt::file_exists(tmp.file("x1")));

  // the source's weights are gone
  std::filesystem::remove(src + "/model.safetensors");
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("x2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "its weights cannot be read")) << r.output;

  // the source's config.json describes another model
  json cfg = json::parse(rt::read_text_file(fixture() + "/config.json"));
  cfg["text_config"]["intermediate_size"] = 96;
  write_bytes(src + "/config.json", cfg.dump(2));
  std::filesystem::copy_file(fixture() + "/model.safetensors", src + "/model.safetensors");
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("x3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "its text_config does not describe the trained model")) << r.output;

  // the source directory is gone: the checkpoint says the run was multimodal, so the export refuses, names the
  // directory and the two ways on, and writes nothing; --text-only exports the language model alone
  std::filesystem::remove_all(src);
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("x4"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(a Gemma3ForConditionalGeneration) is gone")) << r.output;
  EXPECT_TRUE(contains(r.output, "--text-only")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("x4/config.json")));
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("x4") + " --text-only");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--text-only: the language model alone")) << r.output;
  EXPECT_EQ(json::parse(rt::read_text_file(tmp.file("x4/config.json")))["architectures"][0], "Gemma3ForCausalLM");
}

// A Gemma3ForConditionalGeneration config.json over weights without a language model
TEST(MultimodalExport, WeightsWithoutTheLanguageModelAreRefused) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  rt::make_dirs(dir);
  std::filesystem::copy_file(fixture() + "/config.json", dir + "/config.json");
  rt::SafetensorsModel m = rt::SafetensorsModel::open(fixture());
  std::vector<rt::TensorWrite> w;
  for (const rt::TensorInfo* t : m.all())
    if (!is_language(t->name)) {
      w.push_back({t->name, t->shape, nullptr, t->dtype, {}});
      w.back().raw = t->data;
    }
  rt::safetensors_write_model(dir, w);
  auto r = run_ramtrain("loss --model " + dir + " --tokens " + fixture() + "/tokens.txt");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output,
                       "but no tensor is named language_model.model.* (transformers 4.x) or "
                       "model.language_model.* (5.x)"))
      << r.output;
}

}  // namespace
