// `ramtrain tokenize` of chat data, then `train --data OUT` (which reads
// OUT.mask beside it): the same losses, step by step, as training on the
// .jsonl itself (same examples, masks and order), with the model dir's own
// chat_template (the real Qwen2.5 template).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/fs.h"
#include "tokenizer/tokenizer.h"
#include "testutil.h"

namespace {

using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

std::vector<std::string> step_lines(const std::string& out) {
  std::vector<std::string> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("| loss ");
    if (line.rfind("step", 0) == 0 && at != std::string::npos) v.push_back(line.substr(at, 16));
  }
  return v;
}

TEST(TokenizeChatCli, TrainingOnTheTokenFileEqualsTrainingOnTheJsonl) {
  TempDir tmp;
  const std::string m = tmp.file("m");
  rt::make_dirs(m);
  write_bytes(m + "/config.json", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 808, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 802})");
  const std::string tok = rt::test::fixture_dir() + "/tokenizers/qwen2/";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    write_bytes(m + "/" + f, rt::read_text_file(tok + f));
  const auto tpls =
      nlohmann::json::parse(rt::read_text_file(rt::test::fixture_dir() + "/chat_templates/templates.json"));
  write_bytes(m + "/chat_template.jinja", tpls["qwen2.5"]["template"].get<std::string>());
  std::string data;
  for (int i = 0; i < 6; ++i) {
    data +=
        R"({"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]})"
        "\n";
    data += R"({"conversations": [{"from": "human", "value": "Name a color."}, {"from": "gpt", "value": "Blue."}]})"
            "\n";
  }
  write_bytes(tmp.file("chat.jsonl"), data);
  auto r = run_ramtrain("tokenize " + tmp.file("chat.jsonl") + " --tokenizer " + m + " --out " + tmp.file("chat.tok"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(rt::file_exists(tmp.file("chat.tok.mask"))) << r.output;
  const std::string common =
      " --init random --steps 4 --seq-len 64 --micro-batch 2 --lr 1e-2 --warmup 1 --val-fraction 0"
      " --threads 2 --device cpu --seed 3";
  auto a =
      run_ramtrain("train --model " + m + " --data " + tmp.file("chat.jsonl") + common + " --out " + tmp.file("a"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("chat_template from"), std::string::npos) << a.output;
  auto b = run_ramtrain("train --model " + m + " --data " + tmp.file("chat.tok") + common + " --out " + tmp.file("b"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("with loss masks"), std::string::npos) << b.output;
  const auto la = step_lines(a.output), lb = step_lines(b.output);
  ASSERT_EQ(la.size(), 4u) << a.output;
  EXPECT_EQ(la, lb) << a.output << "\n----\n" << b.output;
  // the export keeps chat_template.jinja, and sample --chat renders its prompt with it:
  // the Qwen2.5 default system turn + user turn + generation prompt
  auto s = run_ramtrain("sample --model " + tmp.file("a") +
                        "/final --chat --prompt \"Capital of France?\" --max-tokens 2"
                        " --temperature 0");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("chat template: " + tmp.file("a") + "/final/chat_template.jinja"), std::string::npos)
      << s.output;
  auto tk = rt::tokenizer_load(m);
  const size_t want = tk->encode(
                            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                            "assistant.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
                            "<|im_start|>assistant\n",
                            false)
                          .size();
  EXPECT_NE(s.output.find("(prompt " + std::to_string(want) + " tokens)"), std::string::npos) << s.output;
}

}  // namespace
