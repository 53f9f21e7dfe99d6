// Loss masks of rendered conversations against transformers'
// apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)
// (tests/fixtures/chat_masks, written by tools/make_chat_mask_fixtures.py from
// the fixture tokenizers): the rendered text, the ids of the one-call
// tokenization, each token's byte span (HF's offsets mapping) and the mask,
// all exact. Both paths are checked: the model's template (hf_chat_examples +
// chat_example_encode) and the built-in ChatTemplate of the same layout.
#include "data/chat_example.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "data/chat_format.h"
#include "data/hf_chat_template.h"
#include "testutil.h"

namespace {

using nlohmann::ordered_json;

ordered_json load_cases() {
  std::ifstream f(rt::test::fixture_dir() + "/chat_masks/cases.json");
  EXPECT_TRUE(f.good()) << "run tools/make_chat_mask_fixtures.py";
  std::stringstream s;
  s << f.rdbuf();
  return ordered_json::parse(s.str());
}

TEST(ChatMaskGoldens, OffsetsIdsAndMasksEqualTransformers) {
  const ordered_json doc = load_cases();
  size_t n = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const auto tok = rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/" + c["tokenizer"].get<std::string>());
    const std::string text = c["text"];
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    const auto want_mask = c["assistant_masks"].get<std::vector<uint8_t>>();

    // offsets of the whole rendered text
    std::vector<rt::TokenSpan> spans;
    ASSERT_EQ(tok->encode_with_offsets(text, false, spans), want_ids);
    ASSERT_EQ(spans.size(), c["offsets"].size());
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_EQ(spans[i].begin, c["offsets"][i][0].get<size_t>()) << "token " << i;
      EXPECT_EQ(spans[i].end, c["offsets"][i][1].get<size_t>()) << "token " << i;
    }

    // the model's template: our renderer, its trained spans, one tokenizer call
    const std::string tname = c["template"];
    rt::jinja::Template tpl(doc["templates"][tname].get<std::string>(), tname);
    rt::jinja::Object specials;
    for (const auto& [k, v] : c["kwargs"].items()) specials.set(k, rt::jinja::Value::from_json(v));
    const auto examples = rt::hf_chat_examples(tpl, c["messages"], nullptr, specials);
    ASSERT_EQ(examples.size(), 1u);
    EXPECT_EQ(examples[0].text, text);
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    rt::chat_example_encode(*tok, examples[0], ids, mask);
    EXPECT_EQ(ids, want_ids);
    EXPECT_EQ(mask, want_mask);

    // the built-in format of the same layout
    const rt::ChatFormat f = tname == "chatml" ? rt::ChatFormat::chatml : rt::ChatFormat::llama3;
    rt::ChatTemplate builtin(*tok, f);
    std::vector<rt::ChatMessage> msgs;
    for (const auto& m : c["messages"])
      msgs.push_back({*rt::chat_role_parse(m["role"].get<std::string>()), m["content"].get<std::string>()});
    ids.clear();
    mask.clear();
    ASSERT_EQ(builtin.render(msgs, ids, mask), "");
    EXPECT_EQ(ids, want_ids);
    EXPECT_EQ(mask, want_mask);
    ++n;
  }
  EXPECT_GE(n, 28u);
}

// The rule on hand-made spans: overlap trains, an empty span trains strictly inside a range.
TEST(ChatMask, OverlapRule) {
  const std::vector<std::pair<size_t, size_t>> ranges = {{5, 10}, {20, 22}};
  const std::vector<rt::TokenSpan> spans = {{0, 5},   {4, 6},   {6, 10},  {10, 12}, {5, 5},  {7, 7},
                                            {10, 10}, {19, 20}, {21, 25}, {22, 30}, {25, 25}};
  const std::vector<uint8_t> want = {0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0};
  EXPECT_EQ(rt::trained_from_spans(spans, ranges), want);
  EXPECT_EQ(rt::trained_from_spans(spans, {}), std::vector<uint8_t>(spans.size(), 0));
}

}  // namespace
