// Record formats and the model's own chat template in ExampleEncoder:
//   - a chat record rendered by the Qwen2.5 or Llama-3.1 template (tools,
//     tool_calls, tool role) gives exactly the ids of encoding transformers'
//     rendering of the same conversation (the golden text in
//     tests/fixtures/chat_templates), trained only on the assistant turns;
//   - ShareGPT records encode like the equivalent messages record;
//   - prompt/completion trains only the completion and EOS;
//   - a template that is not prefix stable (Qwen3) gives one example per turn;
//   - a template's raise_exception is a bad record naming file:line;
//   - a byte-level model's text record is BOS + its bytes + EOS, as a text
//     file's document is; its chat records are refused with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/finetune.h"
#include "data/hf_chat_template.h"
#include "testutil.h"

namespace {

using nlohmann::ordered_json;

ordered_json load_json(const std::string& name) {
  std::ifstream f(rt::test::fixture_dir() + "/chat_templates/" + name);
  std::stringstream s;
  s << f.rdbuf();
  return ordered_json::parse(s.str());
}

std::unique_ptr<rt::Tokenizer> qwen_tokenizer() {
  return rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/qwen2");
}

rt::EncodedPiece encode_line(const rt::ExampleEncoder& enc, const std::string& line) {
  static const std::string path = "data.jsonl";
  rt::RecordPiece p;
  p.path = &path;
  p.bytes = line;
  p.line = 3;
  p.jsonl = true;
  rt::EncodedPiece out;
  enc.encode(p, out);
  return out;
}

ordered_json golden(const std::string& name) {
  const ordered_json doc = load_json("cases.json");
  for (const auto& c : doc["cases"])
    if (c["name"] == name) return c;
  ADD_FAILURE() << "no golden " << name;
  return {};
}

TEST(FinetuneFormats, HfTemplateIdsEqualTheRenderedText) {
  auto tok = qwen_tokenizer();
  const ordered_json tpls = load_json("templates.json");
  const rt::jinja::Template tpl(tpls["qwen2.5"]["template"].get<std::string>(), "qwen2.5");
  rt::jinja::Object specials;
  specials.set("bos_token", rt::jinja::Value::none());
  specials.set("eos_token", rt::jinja::Value::string("<|im_end|>"));
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  enc.use_hf_template(&tpl, specials);
  for (const char* name : {"qwen2.5/tools/gen=0", "qwen2.5/multi_turn/gen=0", "qwen2.5/unicode/gen=0"}) {
    const ordered_json c = golden(name);
    ordered_json rec = {{"messages", c["messages"]}};
    if (!c["tools"].is_null()) rec["tools"] = c["tools"];
    const rt::EncodedPiece out = encode_line(enc, rec.dump());
    ASSERT_TRUE(out.bad_message.empty()) << out.bad_message;
    const std::vector<int32_t> want = tok->encode(c["expected"].get<std::string>(), false);
    EXPECT_EQ(out.ids, want) << name;
    ASSERT_EQ(out.trained.size(), out.ids.size());
    std::vector<int32_t> trained;
    for (size_t k = 0; k < out.ids.size(); ++k)
      if (out.trained[k]) trained.push_back(out.ids[k]);
    const std::string t = tok->decode(trained, false);
    for (const auto& m : c["messages"]) {
      const std::string content = m["content"];
      if (content.empty()) continue;
      if (m["role"] == "assistant")
        EXPECT_NE(t.find(content.substr(0, 10)), std::string::npos) << name << ": " << t;
      else
        EXPECT_EQ(t.find(content), std::string::npos) << name << ": " << m["role"] << " trained: " << t;
    }
  }
}

// The same on the Llama-3.1 goldens (its template has a fixed date, no
// clock) with the Llama-3 layout fixture tokenizer, whose pre-tokenizer splits
// digits and newlines differently from Qwen2's.
TEST(FinetuneFormats, HfTemplateIdsEqualTheRenderedTextLlama3) {
  auto tok = rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/llama3");
  const ordered_json tpls = load_json("templates.json");
  const rt::jinja::Template tpl(tpls["llama3.1"]["template"].get<std::string>(), "llama3.1");
  rt::jinja::Object specials;
  specials.set("bos_token", rt::jinja::Value::string("<|begin_of_text|>"));
  specials.set("eos_token", rt::jinja::Value::string("<|eot_id|>"));
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  enc.use_hf_template(&tpl, specials);
  for (const char* name : {"llama3.1/multi_turn/gen=0", "llama3.1/system_user_assistant/gen=0",
                           "llama3.1/unicode/gen=0", "llama3.1/tools/gen=0"}) {
    const ordered_json c = golden(name);
    ordered_json rec = {{"messages", c["messages"]}};
    if (!c["tools"].is_null()) rec["tools"] = c["tools"];
    const rt::EncodedPiece out = encode_line(enc, rec.dump());
    ASSERT_TRUE(out.bad_message.empty()) << out.bad_message;
    EXPECT_EQ(out.ids, tok->encode(c["expected"].get<std::string>(), false)) << name;
    size_t trained = 0;
    for (uint8_t f : out.trained) trained += f & 1;
    EXPECT_GT(trained, 0u) << name;
    EXPECT_LT(trained, out.ids.size()) << name;
  }
}

TEST(FinetuneFormats, ShareGptEqualsMessagesAndPromptCompletionMasks) {
  auto tok = qwen_tokenizer();
  rt::ChatTemplate chatml(*tok, rt::ChatFormat::chatml);
  rt::ExampleEncoder enc(*tok, &chatml, "", false, true);
  const auto a =
      encode_line(enc, R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},)"
                       R"( {"from": "gpt", "value": "A"}]})");
  const auto b =
      encode_line(enc, R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},)"
                       R"( {"role": "assistant", "content": "A"}]})");
  ASSERT_TRUE(a.bad_message.empty()) << a.bad_message;
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.trained, b.trained);
  const auto bad = encode_line(enc, R"({"conversations": [{"from": "narrator", "value": "x"}]})");
  EXPECT_NE(bad.bad_message.find("data.jsonl:3: message 1 has unknown \"from\": \"narrator\""), std::string::npos)
      << bad.bad_message;

  const auto pc = encode_line(enc, R"({"prompt": "The capital of France is", "completion": " Paris."})");
  ASSERT_TRUE(pc.bad_message.empty()) << pc.bad_message;
  std::vector<int32_t> want = tok->encode("The capital of France is", true);
  const size_t n_prompt = want.size() - (tok->eos_id() && !want.empty() && want.back() == *tok->eos_id() ? 1 : 0);
  const std::vector<int32_t> completion = tok->encode(" Paris.", false);
  ASSERT_GE(pc.ids.size(), n_prompt + completion.size());
  for (size_t k = 0; k < pc.ids.size(); ++k) EXPECT_EQ(pc.trained[k], k >= n_prompt ? 1 : 0) << k;
  if (tok->eos_id()) {
    EXPECT_EQ(pc.ids.back(), *tok->eos_id());
  }
  // prompt + completion is one tokenizer call: the prompt's trailing space and
  // the completion's first letters are one token (" P" with this small
  // vocabulary), which holds completion bytes and so is trained (data/chat_example.h)
  const auto st = encode_line(enc, R"({"prompt": "Answer: ", "completion": "Paris."})");
  ASSERT_TRUE(st.bad_message.empty()) << st.bad_message;
  std::vector<int32_t> whole = tok->encode("Answer: Paris.", true);
  const std::vector<int32_t> head = tok->encode("Answer:", true), paris = tok->encode(" Paris", false);
  const int32_t first[1] = {paris[0]};
  const std::string straddle = tok->decode(first, false);
  ASSERT_TRUE(straddle.size() > 1 && straddle[0] == ' ') << straddle;  // else the case would not straddle
  if (tok->eos_id() && (whole.empty() || whole.back() != *tok->eos_id())) whole.push_back(*tok->eos_id());
  EXPECT_EQ(st.ids, whole);
  for (size_t k = 0; k < st.ids.size(); ++k) EXPECT_EQ(st.trained[k], k >= head.size() ? 1 : 0) << k;
  EXPECT_EQ(st.ids[head.size()], paris[0]);
}

TEST(FinetuneFormats, Qwen3MultiTurnIsOneExamplePerTurnAndRaisesAreBadRecords) {
  rt::test::TempDir d;
  auto tok = qwen_tokenizer();
  const ordered_json tpls = load_json("templates.json");
  const rt::jinja::Template qwen3(tpls["qwen3"]["template"].get<std::string>(), "qwen3");
  rt::jinja::Object specials;
  specials.set("eos_token", rt::jinja::Value::string("<|im_end|>"));
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  enc.use_hf_template(&qwen3, specials);
  rt::test::write_bytes(d.file("c.jsonl"),
                        R"({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},)"
                        R"( {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]})"
                        "\n");
  rt::FinetuneOptions o;
  o.seq_len = 256;
  o.val_fraction = 0;
  const rt::FinetuneDataset ds({d.file("c.jsonl")}, enc, o);
  EXPECT_EQ(ds.stats().records.records, 1u);
  EXPECT_EQ(ds.stats().examples, 2u);

  const rt::jinja::Template gemma(tpls["gemma2"]["template"].get<std::string>(), "gemma2");
  rt::ExampleEncoder genc(*tok, nullptr, "", false, true);
  genc.use_hf_template(&gemma, specials);
  const auto bad =
      encode_line(genc, R"({"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]})");
  EXPECT_NE(bad.bad_message.find("data.jsonl:3: [template] gemma2:1:"), std::string::npos) << bad.bad_message;
  EXPECT_NE(bad.bad_message.find("System role not supported"), std::string::npos) << bad.bad_message;
}

// Alpaca .json arrays: each element one record, named by its first line; a
// .json that is not an array is refused, never read as text.
TEST(FinetuneFormats, JsonArrayFiles) {
  rt::test::TempDir d;
  auto tok = qwen_tokenizer();
  rt::ChatTemplate chatml(*tok, rt::ChatFormat::chatml);
  rt::ExampleEncoder enc(*tok, &chatml, "", false, true);
  rt::FinetuneOptions o;
  o.seq_len = 128;
  o.val_fraction = 0;
  rt::test::write_bytes(d.file("a.json"),
                        "[\n  {\"instruction\": \"Add\", \"input\": \"1, 2\",\n   \"output\": \"3\"},\n"
                        "  {\"instruction\": \"Say [hi]\", \"output\": \"hi, \\\"you\\\"\"}\n]\n");
  const rt::FinetuneDataset ds({d.file("a.json")}, enc, o);
  EXPECT_EQ(ds.stats().records.records, 2u);
  EXPECT_EQ(ds.stats().records.kinds.at("instruction"), 2u);
  // the same records as .jsonl give the same tokens
  rt::test::write_bytes(d.file("a.jsonl"),
                        "{\"instruction\": \"Add\", \"input\": \"1, 2\", \"output\": \"3\"}\n"
                        "{\"instruction\": \"Say [hi]\", \"output\": \"hi, \\\"you\\\"\"}\n");
  const rt::FinetuneDataset dl({d.file("a.jsonl")}, enc, o);
  ASSERT_EQ(ds.cache().size(), dl.cache().size());
  EXPECT_EQ(0, std::memcmp(ds.cache().data(), dl.cache().data(), ds.cache().size()));
  // a bad element names the line it starts on
  rt::test::write_bytes(d.file("b.json"),
                        "[\n {\"instruction\": \"x\", \"output\": \"y\"},\n\n {\"instruction\": \"x\"}\n]");
  rt::test::expect_error([&] { rt::FinetuneDataset b({d.file("b.json")}, enc, o); },
                         {d.file("b.json") + ":4: the instruction record has no \"output\""});
  rt::test::write_bytes(d.file("c.json"), "{\"text\": \"not an array\"}\n");
  rt::test::expect_error([&] { rt::FinetuneDataset c({d.file("c.json")}, enc, o); },
                         {d.file("c.json") + ":1: a .json data file must hold a JSON array"});
}

TEST(FinetuneFormats, ByteModelTextRecordsAreTheTextPathsIds) {
  const rt::ByteVocabTokenizer tok;
  const std::string reason = "a byte-level model has no chat format";
  rt::ExampleEncoder enc(tok, nullptr, reason, false, true);
  const std::string text = "h\xc3\xa9llo,\n\"world\"\n";  // UTF-8 and JSON escapes
  const rt::EncodedPiece out = encode_line(enc, ordered_json({{"text", text}}).dump());
  ASSERT_TRUE(out.bad_message.empty()) << out.bad_message;
  // the text-file path's document: ByteTokenizer::encode(text, add_bos_eos = true)
  EXPECT_EQ(out.ids, rt::ByteTokenizer().encode(text, true));
  ASSERT_EQ(out.trained.size(), out.ids.size());
  for (size_t k = 1; k < out.ids.size(); ++k) EXPECT_TRUE(out.trained[k]) << k;
  try {
    encode_line(enc, R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})");
    ADD_FAILURE() << "a chat record was encoded without a chat format";
  } catch (const rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.jsonl"), std::string::npos) << e.what();
  }
}

}  // namespace

