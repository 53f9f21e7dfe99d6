// ramtrain eval end to end on the tiny HF fixtures. The reference is the
// `ramtrain loss` command run on the same windows written out as sequences:
// loss averages over every predicted position of every sequence, so the mean
// over the windows is the token-weighted mean eval must print. Both run the
// fp32 CPU reference on identical rows; only the batching and the order of the
// double-precision sums differ, hence the relative tolerance 1e-6 (observed
// differences are ~1e-8; a window dropped, doubled or shifted moves the mean
// of these random-token losses by far more than that).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "core/fs.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace {

using rt::test::run_ramtrain;

using rt::test::contains;

std::string hf_fixture(const std::string& name) { return rt::test::fixture_dir() + "/hf/" + name; }

nlohmann::json last_json(const std::string& out) { return nlohmann::json::parse(out.substr(out.rfind("\n{") + 1)); }

std::vector<int32_t> random_ids(size_t n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return v;
}

// The windows eval documents: o = k*T, tokens [o, min(o+T+1, N)), one line each.
std::string windows_as_lines(const std::vector<int32_t>& ids, size_t T) {
  std::string s;
  for (size_t o = 0; o + 1 < ids.size(); o += T) {
    for (size_t t = o; t < std::min(o + T + 1, ids.size()); ++t) {
      if (t > o) s += ' ';
      s += std::to_string(ids[t]);
    }
    s += "\n";
  }
  return s;
}

TEST(CliEval, MeanLossEqualsLossOverTheWindows) {
  rt::test::TempDir tmp;
  for (const char* model : {"mistral", "qwen2_bias_tied"}) {
    const std::string dir = hf_fixture(model);
    const auto cfg = nlohmann::json::parse(rt::read_text_file(dir + "/config.json"));
    const int vocab = cfg["vocab_size"].get<int>();
    // 61 tokens, T = 8: 7 full windows and a last one with 4 targets; 60 targets.
    const std::vector<int32_t> ids = random_ids(61, vocab, 7);
    rt::token_file_write(tmp.file("data.bin"), ids, static_cast<uint64_t>(vocab));
    rt::test::write_bytes(tmp.file("windows.txt"), windows_as_lines(ids, 8));
    auto ref = run_ramtrain("loss --model " + dir + " --tokens " + tmp.file("windows.txt") + " --json");
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    const auto rj = last_json(ref.output);
    EXPECT_EQ(rj["tokens"].get<int64_t>(), 60);
    for (const char* mb : {"1", "3", "8"}) {  // 3: the last batch is short and padded
      auto r = run_ramtrain("eval --model " + dir + " --data " + tmp.file("data.bin") + " --seq-len 8 --micro-batch " +
                            mb + " --device cpu --json");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto j = last_json(r.output);
      const double want = rj["loss"].get<double>();
      EXPECT_NEAR(j["loss"].get<double>(), want, 1e-6 * want) << model << " micro-batch " << mb;
      EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(want), 1e-6 * std::exp(want)) << model;
      EXPECT_EQ(j["tokens"].get<int64_t>(), 60) << model;
      EXPECT_EQ(j["rows"].get<int64_t>(), 8) << model;
    }
  }
}

// A model dir that reads text: the mistral fixture with its embedding and
// LM head widened (random rows) to the 803 ids of the llama2_json tokenizer,
// whose files go beside it.
std::string text_model_dir(const rt::test::TempDir& tmp) {
  const std::string src = hf_fixture("mistral"), dst = tmp.file("model");
  rt::make_dirs(dst);
  auto cfg = nlohmann::json::parse(rt::read_text_file(src + "/config.json"));
  const int64_t vocab = 803, C = cfg["hidden_size"].get<int64_t>();
  cfg["vocab_size"] = vocab;
  rt::test::write_bytes(dst + "/config.json", cfg.dump(1));
  const std::string tok = rt::test::fixture_dir() + "/tokenizers/llama2_json";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    rt::test::write_bytes(dst + "/" + f, rt::read_text_file(tok + "/" + f));
  auto st = rt::SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::vector<float>> bufs;
  std::vector<rt::TensorWrite> out;
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (const auto& t : st->tensors()) {
    std::vector<int64_t> shape = t.shape;
    std::vector<float> v;
    if (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight") {
      shape = {vocab, C};
      v.resize(static_cast<size_t>(vocab * C));
      for (auto& x : v) x = nd(g);
    } else {
      v.resize(static_cast<size_t>(t.numel()));
      rt::tensor_to_f32(t, v.data());
    }
    bufs.push_back(std::move(v));
    out.push_back({t.name, shape, nullptr});
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = bufs[i].data();
  rt::safetensors_write(dst + "/model.safetensors", out, {{"format", "pt"}});
  return dst;
}

TEST(CliEval, TextRecordsCountEveryTokenOnceAndChatOnlyTheReplies) {
  rt::test::TempDir tmp;
  const std::string dir = text_model_dir(tmp);
  // Text records: each is <s> + ids + </s> (data/finetune.h), cut into windows
  // [kT, kT+T+1); the longest needs several windows at T = 16.
  const std::vector<std::string> texts = {
      "First Citizen: Before we proceed any further, hear me speak.", "All: Speak, speak.",
      "First Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved. "
      "First Citizen: First, you know Caius Marcius is chief enemy to the people.",
      "ok"};
  std::string jsonl, windows;
  const auto tok = rt::tokenizer_load(dir);
  for (const auto& t : texts) {
    jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
    std::vector<int32_t> ids = tok->encode(t, true);
    ids.push_back(*tok->eos_id());
    windows += windows_as_lines(ids, 16);
  }
  rt::test::write_bytes(tmp.file("d.jsonl"), jsonl);
  rt::test::write_bytes(tmp.file("w.txt"), windows);
  auto ref = run_ramtrain("loss --model " + dir + " --tokens " + tmp.file("w.txt") + " --json");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto r = run_ramtrain("eval --model " + dir + " --data " + tmp.file("d.jsonl") +
                        " --seq-len 16 --micro-batch 2 --device cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rj = last_json(ref.output), j = last_json(r.output);
  const double want = rj["loss"].get<double>();
  EXPECT_NEAR(j["loss"].get<double>(), want, 1e-6 * want);
  EXPECT_EQ(j["tokens"].get<int64_t>(), rj["tokens"].get<int64_t>());

  // Chat records: only the reply and its end token carry loss, so a longer
  // user turn changes the context but not the count of scored tokens.
  auto chat = [&](const std::string& user) {
    const nlohmann::json rec = {
        {"messages", {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", "Speak, speak."}}}}};
    rt::test::write_bytes(tmp.file("c.jsonl"), rec.dump() + "\n");
    auto rc = run_ramtrain("eval --model " + dir + " --data " + tmp.file("c.jsonl") +
                           " --seq-len 64 --device cpu --json --chat-format chatml");
    EXPECT_EQ(rc.exit_code, 0) << rc.output;
    return last_json(rc.output)["tokens"].get<int64_t>();
  };
  const int64_t short_user = chat("hi"), long_user = chat("Before we proceed any further, hear me speak.");
  EXPECT_EQ(short_user, long_user);
  EXPECT_GT(short_user, 1);
  EXPECT_LT(short_user, 12);  // the reply's few tokens and its end token, not the prompt
}

TEST(CliEval, ByteLevelTextIsOneStreamOfWindows) {
  // A tiny-byte model trained one step; its text data is the byte stream
  // BOS bytes EOS of each file (data/dataset.h), windowed like a token file.
  rt::test::TempDir tmp;
  const std::string text = rt::read_text_file(rt::test::shared_data_dir() + "/tinyshakespeare.txt").substr(0, 700);
  rt::test::write_bytes(tmp.file("t.txt"), text);
  auto tr =
      run_ramtrain("train --preset tiny-byte --data " + tmp.file("t.txt") +
                   " --steps 1 --seq-len 32 --micro-batch 1 --val-fraction 0 --device cpu --out " + tmp.file("run"));
  ASSERT_EQ(tr.exit_code, 0) << tr.output;
  const rt::TokenStream ts = rt::load_text_documents({tmp.file("t.txt")});
  std::vector<int32_t> ids(ts.size());
  ts.read(0, ts.size(), ids.data());
  rt::test::write_bytes(tmp.file("w.txt"), windows_as_lines(ids, 48));
  const std::string model = tmp.file("run") + "/final";
  auto ref = run_ramtrain("loss --model " + model + " --tokens " + tmp.file("w.txt") + " --json");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto r = run_ramtrain("eval --model " + model + " --data " + tmp.file("t.txt") +
                        " --seq-len 48 --micro-batch 4 --device cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rj = last_json(ref.output), j = last_json(r.output);
  const double want = rj["loss"].get<double>();
  EXPECT_NEAR(j["loss"].get<double>(), want, 1e-6 * want);
  EXPECT_EQ(j["tokens"].get<int64_t>(), static_cast<int64_t>(ids.size()) - 1);
}

TEST(CliEval, PlainOutputNamesLossAndPerplexity) {
  rt::test::TempDir tmp;
  const std::string dir = hf_fixture("mistral");
  rt::token_file_write(tmp.file("d.bin"), random_ids(20, 80, 3), 80);
  auto r = run_ramtrain("eval --model " + dir + " --data=" + tmp.file("d.bin") + " --seq-len 64 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "perplexity")) << r.output;
  EXPECT_TRUE(contains(r.output, "over 19 target tokens in 1 rows")) << r.output;
  auto h = run_ramtrain("eval --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_TRUE(contains(h.output, "Examples:")) << h.output;
  EXPECT_TRUE(contains(run_ramtrain("--help").output, "eval")) << "eval missing from the command list";
}

TEST(CliEval, BadInputsGetClearErrors) {
  rt::test::TempDir tmp;
  const std::string dir = hf_fixture("mistral");  // vocab 80, max_position_embeddings 64
  rt::token_file_write(tmp.file("ok.bin"), random_ids(20, 80, 1), 0);
  struct Bad {
    std::string args, expect;
  };
  std::vector<int32_t> big = random_ids(20, 80, 2);
  big[7] = 500;
  rt::token_file_write(tmp.file("big.bin"), big, 0);
  rt::token_file_write(tmp.file("one.bin"), std::vector<int32_t>{5}, 0);
  const std::string m = "eval --model " + dir;
  for (const Bad& b : {Bad{m + " --data", "--data needs one or more paths"}, Bad{m, "--data is required"},
                       Bad{"eval --data " + tmp.file("ok.bin"), "--model is required"},
                       Bad{m + " --data " + tmp.file("nope.bin"), tmp.file("nope.bin") + ": no such file"},
                       Bad{m + " --data " + tmp.file("ok.bin") + " --seq-len 0", "--seq-len must be >= 1"},
                       Bad{m + " --data " + tmp.file("ok.bin") + " --seq-len 65", "max_position_embeddings (64)"},
                       Bad{m + " --data " + tmp.file("ok.bin") + " --micro-batch 0", "--micro-batch must be >= 1"},
                       Bad{m + " --data " + tmp.file("ok.bin") + " --device tpu", "--device must be one of auto, cpu, cuda; got 'tpu'"},
                       Bad{m + " --data " + tmp.file("big.bin"), "big.bin"},
                       Bad{m + " --data " + tmp.file("one.bin"), "no token to predict"},
                       Bad{m + " --data " + tmp.file("ok.bin") + " " + tmp.file("ok.bin"), "is a token file"}}) {
    auto r = run_ramtrain(b.args);
    EXPECT_NE(r.exit_code, 0) << b.args;
    EXPECT_TRUE(contains(r.output, b.expect)) << b.args << "\n" << r.output;
  }
  // Text with a model that has no tokenizer (and no byte vocabulary).
  rt::test::write_bytes(tmp.file("t.txt"), "hello\n");
  auto r = run_ramtrain(m + " --data " + tmp.file("t.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "needs the model's tokenizer")) << r.output;
}

}  // namespace
