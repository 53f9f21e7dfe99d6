// Chat rendering and loss masks per format. The expected ids are the fixture
// tokenizer's encode of the whole rendered string (special tokens written as
// text, which the tokenizer matches as added tokens), the mask derived from
// encodes of its prefixes (Expected), so the reference uses neither
// ChatTemplate's code nor token offsets. Exact equality: ids are integers.
// The HF goldens of the mask rule are in chat_mask_test.cpp.
#include "data/chat_format.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "testutil.h"

namespace {

using rt::ChatMessage;
using rt::ChatRole;

std::unique_ptr<rt::Tokenizer> fixture_tokenizer(const std::string& name) {
  return rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/" + name);
}

// The expected ids and mask of a rendered text, from the tokenizer's encode
// alone: ids = encode(text) in one call (HF's apply_chat_template); the
// trained tokens of a range [b, e) run from the first token of encode(text)
// that is not a token of encode(text[0, b)) (all of them when that is a
// prefix, else the first differing one, which straddles b) to the last one
// that holds a byte before e (likewise from encode(text[0, e))).
struct Expected {
  std::string text;
  std::vector<std::pair<size_t, size_t>> ranges;
  void add(const std::string& literal, bool trained) {
    if (trained && !literal.empty()) {
      if (!ranges.empty() && ranges.back().second == text.size())
        ranges.back().second += literal.size();
      else
        ranges.emplace_back(text.size(), text.size() + literal.size());
    }
    text += literal;
  }
  // How many leading tokens of full lie wholly before byte b (b not inside a token: +0; inside: the
  // straddling token counts as after b when after_straddle, before otherwise).
  static size_t tokens_before(const rt::Tokenizer& tok, const std::vector<int32_t>& full, const std::string& text,
                              size_t b, bool straddle_before) {
    const std::vector<int32_t> pre = tok.encode(text.substr(0, b), false);
    size_t k = 0;
    while (k < pre.size() && k < full.size() && pre[k] == full[k]) ++k;
    if (k == pre.size()) return k;
    return straddle_before ? k + 1 : k;
  }
  void check(const rt::Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<uint8_t>& trained) const {
    const std::vector<int32_t> full = tok.encode(text, false);
    EXPECT_EQ(ids, full);
    std::vector<uint8_t> want(full.size(), 0);
    for (const auto& [b, e] : ranges) {
      const size_t first = tokens_before(tok, full, text, b, false), last = tokens_before(tok, full, text, e, true);
      for (size_t k = first; k < last && k < want.size(); ++k) want[k] = 1;
    }
    EXPECT_EQ(trained, want);
  }
};

const std::vector<ChatMessage> kConversation = {
    {ChatRole::system, "You are terse."},
    {ChatRole::user, "Hi there"},
    {ChatRole::assistant, "Hello! How can I help?"},
    {ChatRole::user, "Count: 1 2 3"},
    {ChatRole::assistant, "1, 2, 3."},
    {ChatRole::user, "Newlines?"},
    {ChatRole::assistant, "\n\n\nYes "},  // "\n" of the header + these: one token in HF
    {ChatRole::user, "Ça va? 🙂"},
    {ChatRole::assistant, "Très bien — merci! 🎉"},  // byte fallback / partial UTF-8 tokens at the end
};

void check_render(const rt::Tokenizer& tok, const rt::ChatTemplate& tpl, const std::vector<ChatMessage>& msgs,
                  const Expected& want) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  ASSERT_EQ(tpl.render(msgs, ids, trained), "");
  want.check(tok, ids, trained);
}

TEST(ChatFormat, ChatMLMatchesWholeString) {
  auto tok = fixture_tokenizer("qwen2");
  // the reference relies on the tokenizer matching the special tokens in text
  ASSERT_EQ(tok->encode("<|im_end|>", false), std::vector<int32_t>{802});
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::chatml);
  Expected w;
  for (const ChatMessage& m : kConversation) {
    const bool a = m.role == ChatRole::assistant;
    w.add(std::string("<|im_start|>") + rt::chat_role_name(m.role) + "\n", false);
    w.add(m.content, a);
    w.add("<|im_end|>", a);  // the end of an assistant turn is trained
    w.add("\n", false);
  }
  check_render(*tok, tpl, kConversation, w);
  // the case: "assistant\n" + "\n\n\nYes" is tokenized as one string, not split at the boundary
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  ASSERT_EQ(tpl.render(kConversation, ids, trained), "");
  const std::vector<int32_t> joined = tok->encode("assistant\n\n\n\nYes", false);
  std::vector<int32_t> split = tok->encode("assistant\n", false);
  for (int32_t id : tok->encode("\n\n\nYes", false)) split.push_back(id);
  ASSERT_NE(joined, split);  // else the case would not tell the two apart
  EXPECT_NE(std::search(ids.begin(), ids.end(), joined.begin(), joined.end()), ids.end());
  EXPECT_EQ(tpl.end_of_turn_id(), 802);
  EXPECT_EQ(tpl.render_prompt("What?"),
            tok->encode("<|im_start|>user\nWhat?<|im_end|>\n<|im_start|>assistant\n", false));
}

TEST(ChatFormat, Llama3MatchesWholeString) {
  auto tok = fixture_tokenizer("llama3");
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::llama3);
  Expected w;
  w.add("<|begin_of_text|>", false);
  for (const ChatMessage& m : kConversation) {
    const bool a = m.role == ChatRole::assistant;
    w.add(std::string("<|start_header_id|>") + rt::chat_role_name(m.role) + "<|end_header_id|>\n\n", false);
    w.add(m.content, a);
    w.add("<|eot_id|>", a);
  }
  check_render(*tok, tpl, kConversation, w);
  EXPECT_EQ(tpl.end_of_turn_id(), *tok->token_to_id("<|eot_id|>"));
  EXPECT_EQ(tpl.render_prompt("What?"),
            tok->encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat?<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n",
                        false));
}

TEST(ChatFormat, MistralMatchesWholeString) {
  for (const char* name : {"sp_llama2", "llama2_json"}) {
    SCOPED_TRACE(name);
    auto tok = fixture_tokenizer(name);
    rt::ChatTemplate tpl(*tok, rt::ChatFormat::mistral);
    Expected w;
    w.add("<s>", false);
    w.add("[INST] You are terse.\n\nHi there [/INST]", false);  // the system message goes before the first user turn
    w.add("Hello! How can I help?</s>", true);
    w.add("[INST] Count: 1 2 3 [/INST]", false);
    w.add("1, 2, 3.</s>", true);
    w.add("[INST] Newlines? [/INST]", false);
    w.add("\n\n\nYes </s>", true);
    w.add("[INST] Ça va? 🙂 [/INST]", false);
    w.add("Très bien — merci! 🎉</s>", true);
    check_render(*tok, tpl, kConversation, w);
    EXPECT_EQ(tpl.render_prompt("What?"), tok->encode("<s>[INST] What? [/INST]", false));
    // turn order is checked
    std::vector<int32_t> ids;
    std::vector<uint8_t> tr;
    const std::vector<ChatMessage> bad = {{ChatRole::user, "a"}, {ChatRole::user, "b"}};
    const std::string err = tpl.render(bad, ids, tr);
    EXPECT_NE(err.find("message 2 is a user message"), std::string::npos) << err;
    EXPECT_NE(err.find("alternating"), std::string::npos) << err;
  }
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
