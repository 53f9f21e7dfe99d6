// Fine-tuning end to end through the ramtrain binary: a tiny Qwen2 model dir
// built here (config.json + the qwen2 tokenizer fixture, random init), a chat
// .jsonl written here, train -> loss falls -> export carries the tokenizer ->
// `sample --chat` decodes; plain text through the model's tokenizer; and
// `ramtrain tokenize` against the tokenizer's own encode.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fs.h"
#include "io/token_file.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace {

using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

using rt::test::contains;

std::string qwen2_tokenizer_dir() { return rt::test::fixture_dir() + "/tokenizers/qwen2"; }

// A 2-layer, 32-wide Qwen2 whose vocab is the fixture tokenizer's 803 ids rounded up to 808.
void make_model_dir(const std::string& dir) {
  rt::make_dirs(dir);
  write_bytes(dir + "/config.json", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 808, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 802})");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    write_bytes(dir + "/" + f, rt::read_text_file(qwen2_tokenizer_dir() + "/" + f));
}

std::string chat_line(const std::vector<std::pair<std::string, std::string>>& msgs) {
  nlohmann::json m = nlohmann::json::array();
  for (auto& [r, c] : msgs) m.push_back({{"role", r}, {"content", c}});
  return nlohmann::json{{"messages", m}}.dump() + "\n";
}

// The "loss X" of every "step N/M | loss X" line.
std::vector<double> step_losses(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("| loss ");
    if (line.rfind("step", 0) == 0 && at != std::string::npos) v.push_back(std::stod(line.substr(at + 7)));
  }
  return v;
}

TEST(FinetuneCli, ChatJsonlTrainsExportsAndSamples) {
  TempDir tmp;
  make_model_dir(tmp.file("m"));
  std::string data;
  for (int i = 0; i < 12; ++i) {
    data += chat_line({{"user", "What is the capital of France?"}, {"assistant", "Paris."}});
    data += chat_line({{"system", "You are terse."}, {"user", "Name a color."}, {"assistant", "Blue."}});
    data += chat_line({{"user", "Say hello."}, {"assistant", "Hello there, friend!"}});
    data += R"({"instruction": "Count to", "input": "three", "output": "One, two, three."})"
            "\n";
  }
  write_bytes(tmp.file("chat.jsonl"), data);
  auto r = run_ramtrain("train --model " + tmp.file("m") + " --init random --data " + tmp.file("chat.jsonl") +
                        " --steps 40 --seq-len 64 --micro-batch 4 --lr 1e-2 --warmup 2 --val-fraction 0 --threads 2"
                        " --device cpu --out " +
                        tmp.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "chat format: chatml")) << r.output;
  EXPECT_TRUE(contains(r.output, "48 records (36 chat, 12 instruction)")) << r.output;
  const std::vector<double> loss = step_losses(r.output);
  ASSERT_EQ(loss.size(), 40u) << r.output;
  // Step 1 is near ln(808) = 6.69 (random init, uniform over the vocab). The
  // replies are 4 fixed strings, each a function of its prompt, repeated 12
  // times: a model that learns them gets far below; the CPU run here reaches
  // about 1.0 by step 40, and 2.5 leaves margin for other platforms' rounding.
  EXPECT_NEAR(loss.front(), 6.69, 0.3);
  EXPECT_LT((loss[35] + loss[36] + loss[37] + loss[38] + loss[39]) / 5, 2.5) << r.output;
  // the export carries the model's tokenizer files, byte for byte
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(rt::read_text_file(tmp.file("out/final/") + f), rt::read_text_file(qwen2_tokenizer_dir() + "/" + f)) << f;
  EXPECT_FALSE(rt::file_exists(tmp.file("out/final/ramtrain_tokenizer.json")));
  auto s = run_ramtrain("sample --model " + tmp.file("out/final") +
                        " --chat --prompt 'Say hello.' --temperature 0 --max-tokens 30 --threads 2");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_GT(s.output.size(), 1u) << s.output;
  EXPECT_FALSE(contains(s.output, "<|im_")) << s.output;  // special tokens are not printed
  // without --chat: the prompt is continued as plain text
  auto plain =
      run_ramtrain("sample --model " + tmp.file("out/final") + " --prompt 'What is' --max-tokens 5 --threads 2");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "What is")) << plain.output;
}

TEST(FinetuneCli, PlainTextGoesThroughTheModelTokenizer) {
  TempDir tmp;
  make_model_dir(tmp.file("m"));
  std::string text;
  for (int i = 0; i < 30; ++i) text += "First Citizen:\nBefore we proceed any further, hear me speak.\n\n";
  write_bytes(tmp.file("t.txt"), text);
  auto r = run_ramtrain("train --model " + tmp.file("m") + " --init random --data " + tmp.file("t.txt") +
                        " --steps 2 --seq-len 32 --micro-batch 2 --threads 2 --device cpu --out " + tmp.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "30 records (30 text)")) << r.output;
  EXPECT_TRUE(contains(r.output, "27 train, 3 validation")) << r.output;  // --val-fraction 0.1 of 30
  // bad lines: abort names file:line, skip counts and goes on
  write_bytes(tmp.file("b.jsonl"), chat_line({{"user", "q"}, {"assistant", "a"}}) + "{oops\n" +
                                       chat_line({{"user", "q"}, {"assistant", "a"}}));
  const std::string common = " --model " + tmp.file("m") +
                             " --init random --steps 1 --seq-len 32 --micro-batch 1"
                             " --val-fraction 0 --threads 2 --device cpu --out " +
                             tmp.file("out2");
  r = run_ramtrain("train --data " + tmp.file("b.jsonl") + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, tmp.file("b.jsonl") + ":2:2: malformed JSON")) << r.output;
  r = run_ramtrain("train --data " + tmp.file("b.jsonl") + common + " --bad-lines skip");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: skipped bad record: " + tmp.file("b.jsonl") + ":2")) << r.output;
  EXPECT_TRUE(contains(r.output, "skipped 1 bad records (1 malformed JSON)")) << r.output;
  // a preset has no tokenizer: text data is refused with what to pass
  r = run_ramtrain("train --preset qwen2.5-0.5b --data " + tmp.file("t.txt") + " --steps 1 --out " + tmp.file("o3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--tokenizer DIR")) << r.output;
}

TEST(FinetuneCli, TokenizeMatchesTheTokenizer) {
  TempDir tmp;
  auto h = run_ramtrain("tokenize --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_TRUE(contains(h.output, "Examples:")) << h.output;
  const std::string a = "The quick brown fox.\nJumps over the lazy dog!\n", b = "第二个文件 with CJK 😀\n";
  write_bytes(tmp.file("a.txt"), a);
  write_bytes(tmp.file("b.txt"), b);
  write_bytes(tmp.file("c.jsonl"), "{\"text\": \"json text\"}\n\n{\"text\": \"more\"}\n");
  auto r = run_ramtrain("tokenize " + tmp.file("a.txt") + " " + tmp.file("b.txt") + " " + tmp.file("c.jsonl") +
                        " --tokenizer " + qwen2_tokenizer_dir() + " --out " + tmp.file("out.tok") + " --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "MB/s")) << r.output;
  auto tok = rt::tokenizer_load(qwen2_tokenizer_dir());
  std::vector<int32_t> want;
  for (const std::string& doc : {a, b, std::string("json text"), std::string("more")}) {
    auto e = tok->encode(doc, true);
    want.insert(want.end(), e.begin(), e.end());
    want.push_back(*tok->eos_id());
  }
  rt::TokenStream s = rt::TokenStream::open(tmp.file("out.tok"));
  ASSERT_EQ(s.size(), want.size());
  std::vector<int32_t> got(want.size());
  s.read(0, got.size(), got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.vocab_size(), 803u);
  EXPECT_FALSE(rt::file_exists(tmp.file("out.tok.mask")));  // text only: every token trained, no mask file
  // chat records keep their loss masks in OUT.mask beside the token file
  // (tests/data/loss_mask_file_test.cpp checks its contents)
  write_bytes(tmp.file("chat.jsonl"), chat_line({{"user", "q"}, {"assistant", "a"}}));
  r = run_ramtrain("tokenize " + tmp.file("chat.jsonl") + " --tokenizer " + qwen2_tokenizer_dir() + " --out " +
                   tmp.file("chat.tok"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(rt::file_exists(tmp.file("chat.tok.mask"))) << r.output;
}

}  // namespace
