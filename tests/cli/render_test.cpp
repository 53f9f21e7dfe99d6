// `ramtrain render`: examples printed with the trained runs in [[ ]] (--plain),
// from the model dir's chat_template, from --chat-format, and the errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "testutil.h"

namespace {

using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A model dir with the qwen2 fixture tokenizer and the real Qwen2.5 template.
std::string make_model_dir(const TempDir& d) {
  const std::string tok = rt::test::fixture_dir() + "/tokenizers/qwen2/";
  write_bytes(d.file("tokenizer.json"), read_all(tok + "tokenizer.json"));
  write_bytes(d.file("tokenizer_config.json"), read_all(tok + "tokenizer_config.json"));
  const auto tpls = nlohmann::json::parse(read_all(rt::test::fixture_dir() + "/chat_templates/templates.json"));
  write_bytes(d.file("chat_template.jinja"), tpls["qwen2.5"]["template"].get<std::string>());
  return d.path();
}

TEST(RenderCli, MarksTrainedTokens) {
  TempDir d;
  const std::string dir = make_model_dir(d);
  write_bytes(d.file("d.jsonl"),
              R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there!"}]})"
              "\n");
  auto r = run_ramtrain("render " + d.file("d.jsonl") + " --model " + dir + " --plain");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the template's default system turn, untrained; only the reply and its end of turn trained
  EXPECT_NE(r.output.find("<|im_start|>system\nYou are Qwen"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<|im_start|>assistant\n[[Hello there!<|im_end|>]]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[[Hi"), std::string::npos) << r.output;

  r = run_ramtrain("render " + d.file("d.jsonl") + " --model " + dir + " --plain --chat-format chatml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("You are Qwen"), std::string::npos) << r.output;  // the built-in format has no default system
  EXPECT_NE(r.output.find("[[Hello there!<|im_end|>]]"), std::string::npos) << r.output;

  write_bytes(d.file("bad.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n");
  r = run_ramtrain("render " + d.file("bad.jsonl") + " --model " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("bad.jsonl:1: the conversation has no assistant message"), std::string::npos) << r.output;

  write_bytes(d.file("chat_template.jinja"), "{% for m in messages %}{{ m.content }\n{% endfor %}");
  r = run_ramtrain("render " + d.file("d.jsonl") + " --model " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("chat_template.jinja:1:"), std::string::npos) << r.output;
}

}  // namespace
