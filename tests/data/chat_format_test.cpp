// Chat rendering and loss masks per format. The expected ids are built from
// the fixture tokenizer's own encode of the literal segments of each format
// (special tokens written as text, which the tokenizer matches as added
// tokens), with the mask each segment must carry; so the reference does not
// reuse ChatTemplate's own segment code. Exact equality: ids are integers.
#include "data/chat_format.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "testutil.h"

namespace {

using rt::ChatMessage;
using rt::ChatRole;

std::unique_ptr<rt::Tokenizer> fixture_tokenizer(const std::string& name) {
  return rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/" + name);
}

struct Expected {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  const rt::Tokenizer* tok;
  void add(const std::string& literal, uint8_t mask) {
    const std::vector<int32_t> e = tok->encode(literal, false);
    ids.insert(ids.end(), e.begin(), e.end());
    trained.insert(trained.end(), e.size(), mask);
  }
  void add_id(int32_t id, uint8_t mask) {
    ids.push_back(id);
    trained.push_back(mask);
  }
};

const std::vector<ChatMessage> kConversation = {
    {ChatRole::system, "You are terse."},
    {ChatRole::user, "Hi there"},
    {ChatRole::assistant, "Hello! How can I help?"},
    {ChatRole::user, "Count: 1 2 3"},
    {ChatRole::assistant, "1, 2, 3."},
};

void check_render(const rt::ChatTemplate& tpl, const std::vector<ChatMessage>& msgs, const Expected& want) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  ASSERT_EQ(tpl.render(msgs, ids, trained), "");
  EXPECT_EQ(ids, want.ids);
  EXPECT_EQ(trained, want.trained);
}

TEST(ChatFormat, ChatMLMatchesLiteralSegments) {
  auto tok = fixture_tokenizer("qwen2");
  // the reference relies on the tokenizer matching the special tokens in text
  ASSERT_EQ(tok->encode("<|im_end|>", false), std::vector<int32_t>{802});
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::chatml);
  Expected w{{}, {}, tok.get()};
  for (const ChatMessage& m : kConversation) {
    const bool a = m.role == ChatRole::assistant;
    w.add(std::string("<|im_start|>") + rt::chat_role_name(m.role) + "\n", 0);
    w.add(m.content, a);
    w.add("<|im_end|>", a);  // the end of an assistant turn is trained
    w.add("\n", 0);
  }
  check_render(tpl, kConversation, w);
  EXPECT_EQ(tpl.end_of_turn_id(), 802);
  Expected p{{}, {}, tok.get()};
  p.add("<|im_start|>user\n", 0);
  p.add("What?", 0);
  p.add("<|im_end|>\n", 0);
  p.add("<|im_start|>assistant\n", 0);
  EXPECT_EQ(tpl.render_prompt("What?"), p.ids);
}

TEST(ChatFormat, Llama3MatchesLiteralSegments) {
  auto tok = fixture_tokenizer("llama3");
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::llama3);
  Expected w{{}, {}, tok.get()};
  w.add("<|begin_of_text|>", 0);
  for (const ChatMessage& m : kConversation) {
    const bool a = m.role == ChatRole::assistant;
    w.add(std::string("<|start_header_id|>") + rt::chat_role_name(m.role) + "<|end_header_id|>\n\n", 0);
    w.add(m.content, a);
    w.add("<|eot_id|>", a);
  }
  check_render(tpl, kConversation, w);
  EXPECT_EQ(tpl.end_of_turn_id(), *tok->token_to_id("<|eot_id|>"));
  Expected p{{}, {}, tok.get()};
  p.add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n", 0);
  p.add("What?", 0);
  p.add("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", 0);
  EXPECT_EQ(tpl.render_prompt("What?"), p.ids);
}

TEST(ChatFormat, MistralMatchesLiteralSegments) {
  auto tok = fixture_tokenizer("sp_llama2");
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::mistral);
  const int32_t bos = *tok->bos_id(), eos = *tok->eos_id();
  Expected w{{}, {}, tok.get()};
  w.add_id(bos, 0);
  w.add("[INST] You are terse.\n\nHi there [/INST]", 0);  // the system message goes before the first user turn
  w.add("Hello! How can I help?", 1);
  w.add_id(eos, 1);
  w.add("[INST] Count: 1 2 3 [/INST]", 0);
  w.add("1, 2, 3.", 1);
  w.add_id(eos, 1);
  check_render(tpl, kConversation, w);
  Expected p{{}, {}, tok.get()};
  p.add_id(bos, 0);
  p.add("[INST] What? [/INST]", 0);
  EXPECT_EQ(tpl.render_prompt("What?"), p.ids);
  // turn order is checked
  std::vector<int32_t> ids;
  std::vector<uint8_t> tr;
  const std::vector<ChatMessage> bad = {{ChatRole::user, "a"}, {ChatRole::user, "b"}};
  const std::string err = tpl.render(bad, ids, tr);
  EXPECT_NE(err.find("message 2 is a user message"), std::string::npos) << err;
  EXPECT_NE(err.find("alternating"), std::string::npos) << err;
}

TEST(ChatFormat, DetectionAndMissingTokens) {
  auto qwen = fixture_tokenizer("qwen2");
  auto llama = fixture_tokenizer("llama3");
  auto sp = fixture_tokenizer("sp_llama2");
  auto gpt2 = fixture_tokenizer("gpt2");
  std::string why;
  EXPECT_EQ(rt::chat_format_detect(*qwen, rt::Family::qwen2, &why), rt::ChatFormat::chatml);
  EXPECT_EQ(rt::chat_format_detect(*llama, rt::Family::llama, &why), rt::ChatFormat::llama3);
  EXPECT_EQ(rt::chat_format_detect(*sp, rt::Family::mistral, &why), rt::ChatFormat::mistral);
  EXPECT_FALSE(rt::chat_format_detect(*gpt2, rt::Family::qwen2, &why));
  EXPECT_NE(why.find("--chat-format"), std::string::npos) << why;
  rt::test::expect_error([&] { rt::ChatTemplate t(*gpt2, rt::ChatFormat::chatml); }, {"<|im_start|>"});
  EXPECT_EQ(rt::chat_format_parse("llama3"), rt::ChatFormat::llama3);
  EXPECT_THROW(rt::chat_format_parse("alpaca"), rt::Error);
  EXPECT_FALSE(rt::chat_role_parse("bot"));
}

}  // namespace
