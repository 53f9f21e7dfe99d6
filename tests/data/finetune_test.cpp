// Fine-tuning data: record scanning, exact piece encoding, packing and
// positions, masks from chat records, truncation counts, determinism, and
// every bad-data message. References: the fixture tokenizers' own encode of
// the literal texts (ids are integers: exact equality), window_order for the
// shuffle, and hand-counted lines/columns/offsets for the messages.
#include "data/finetune.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <numeric>

#include "core/fs.h"
#include "core/thread_pool.h"
#include "core/error.h"
#include "testutil.h"

namespace {

using rt::test::TempDir;
using rt::test::write_bytes;

std::unique_ptr<rt::Tokenizer> fixture_tokenizer(const std::string& name) {
  return rt::tokenizer_load(rt::test::fixture_dir() + "/tokenizers/" + name);
}

using rt::test::contains;
using rt::test::expect_error;

// Records as the raw bytes the encoder saw (one id per byte), with their lines.
struct RawRecord {
  std::string text;
  uint64_t line;
};
std::vector<RawRecord> raw_records(const std::vector<std::string>& files, rt::RecordOptions o,
                                   rt::RecordStats* st = nullptr) {
  std::vector<RawRecord> out;
  std::vector<uint64_t> lines;
  auto enc = [](const rt::RecordPiece& p, rt::EncodedPiece& e) {
    for (char c : p.bytes) e.ids.push_back(static_cast<uint8_t>(c));
    e.ids.push_back(-static_cast<int32_t>(p.line));  // the line rides along as a negative id
  };
  auto sink = [&](const char*, std::vector<int32_t>& ids, std::vector<uint8_t>&) {
    RawRecord r{"", 0};
    for (int32_t id : ids) {
      if (id < 0) {
        if (r.line == 0) r.line = static_cast<uint64_t>(-id);
      } else {
        r.text.push_back(static_cast<char>(id));
      }
    }
    out.push_back(r);
  };
  rt::RecordStats s = rt::records_for_each(files, o, enc, sink);
  if (st) *st = s;
  return out;
}

TEST(Records, TextBlankLinesFileAndJsonlLines) {
  TempDir d;
  write_bytes(d.file("a.txt"), "first doc\nline two\n\n \t\n\r\nsecond\r\n\n\nthird");
  rt::RecordOptions o;
  auto r = raw_records({d.file("a.txt")}, o);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].text, "first doc\nline two");
  EXPECT_EQ(r[0].line, 1u);
  EXPECT_EQ(r[1].text, "second");
  EXPECT_EQ(r[1].line, 6u);
  EXPECT_EQ(r[2].text, "third");
  EXPECT_EQ(r[2].line, 9u);
  o.text_split = rt::TextSplit::file;
  write_bytes(d.file("empty.txt"), "");
  rt::RecordStats st;
  r = raw_records({d.file("a.txt"), d.file("empty.txt")}, o, &st);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].text, rt::read_text_file(d.file("a.txt")));
  EXPECT_EQ(st.skipped["empty files"], 1u);
  write_bytes(d.file("b.jsonl"), "{\"text\": \"x\"}\r\n\n   \n{\"text\": \"y\"}");
  r = raw_records({d.file("b.jsonl")}, {});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].text, "{\"text\": \"x\"}");
  EXPECT_EQ(r[1].text, "{\"text\": \"y\"}");
  EXPECT_EQ(r[1].line, 4u);
}

// Long documents are encoded in pieces; the ids must equal one encode of the
// whole document (the claim in records.h), on the fixture stress texts.
TEST(Records, PiecesEncodeExactlyLikeTheWholeDocument) {
  TempDir d;
  std::string doc = rt::read_text_file(rt::test::shared_data_dir() + "/tinyshakespeare.txt").substr(0, 60000);
  // the tokenizer fixtures' stress texts (CJK, emoji, combining marks, whitespace runs, code, special tokens)
  for (const std::string& line : [] {
         std::vector<std::string> v;
         std::string g = rt::read_text_file(rt::test::fixture_dir() + "/tokenizers/qwen2/golden.jsonl");
         size_t b = 0;
         while (b < g.size()) {
           size_t e = g.find('\n', b);
           if (e == std::string::npos) e = g.size();
           v.push_back(g.substr(b, e - b));
           b = e + 1;
         }
         return v;
       }()) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    doc.append("\n").append(j["text"].get<std::string>()).append("\nx");
  }
  write_bytes(d.file("doc.txt"), doc);
  for (const char* name : {"qwen2", "llama3", "gpt2"}) {
    auto tok = fixture_tokenizer(name);
    rt::ExampleEncoder enc(*tok, nullptr, "", true, false);
    rt::RecordOptions o;
    o.text_split = rt::TextSplit::file;
    o.piece_bytes = 512;  // many cuts
    std::vector<int32_t> got;
    int n = 0;
    rt::records_for_each(
        {d.file("doc.txt")}, o, [&](const rt::RecordPiece& p, rt::EncodedPiece& e) { enc.encode(p, e); },
        [&](const char*, std::vector<int32_t>& ids, std::vector<uint8_t>&) {
          got = ids;
          ++n;
        });
    ASSERT_EQ(n, 1) << name;
    std::vector<int32_t> want = tok->encode(doc, true);
    if (tok->eos_id()) want.push_back(*tok->eos_id());
    EXPECT_EQ(got, want) << name;
  }
}

std::string jsonl_text(const std::string& s) { return nlohmann::json{{"text", s}}.dump() + "\n"; }

rt::FinetuneOptions fopts(int64_t T, double val = 0.0, uint64_t seed = 7) {
  rt::FinetuneOptions o;
  o.seq_len = T;
  o.val_fraction = val;
  o.seed = seed;
  o.pad_id = 0;
  return o;
}

TEST(Finetune, PackingPositionsAndOrder) {
  TempDir d;
  auto tok = fixture_tokenizer("qwen2");
  std::vector<std::string> texts;
  std::string file;
  for (int i = 0; i < 23; ++i) {
    texts.push_back(std::string(static_cast<size_t>(1 + i % 5), 'a' + static_cast<char>(i % 26)) + " and so on " +
                    std::to_string(i * 37));
    file += jsonl_text(texts.back());
  }
  write_bytes(d.file("t.jsonl"), file);
  std::vector<std::vector<int32_t>> want;  // each example: encode(text, true) + EOS
  for (auto& t : texts) {
    want.push_back(tok->encode(t, true));
    want.back().push_back(*tok->eos_id());
  }
  const int64_t T = 24;
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  rt::FinetuneDataset ds({d.file("t.jsonl")}, enc, fopts(T));
  EXPECT_EQ(ds.stats().examples, texts.size());
  auto rows = ds.epoch_rows(0);
  // every example once, in window_order, packed greedily
  std::vector<uint64_t> flat;
  for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  EXPECT_EQ(flat, rt::window_order(texts.size(), 7, 0));
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t used = 0;
    for (uint64_t e : rows[r]) used += static_cast<int64_t>(want[e].size()) - 1;
    EXPECT_LE(used, T);
    if (r + 1 < rows.size()) {
      EXPECT_GT(used + static_cast<int64_t>(want[rows[r + 1][0]].size()) - 1, T) << "not greedy";
    }
  }
  ASSERT_GE(rows.size(), 3u);
  rt::Batch b = ds.next_batch(static_cast<int64_t>(rows.size()));
  ASSERT_EQ(b.positions.size(), b.inputs.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> in, tg, pos;
    for (uint64_t e : rows[r]) {
      const auto& w = want[e];
      for (size_t j = 0; j + 1 < w.size(); ++j) {
        in.push_back(w[j]);
        tg.push_back(w[j + 1]);
        pos.push_back(static_cast<int32_t>(j));  // positions restart per example
      }
    }
    for (int32_t k = 0; static_cast<int64_t>(in.size()) < T; ++k) {
      in.push_back(0);
      tg.push_back(rt::ignore_target);
      pos.push_back(k);
    }
    const auto at = static_cast<std::ptrdiff_t>(r * T);
    EXPECT_EQ(std::vector<int32_t>(b.inputs.begin() + at, b.inputs.begin() + at + T), in) << "row " << r;
    EXPECT_EQ(std::vector<int32_t>(b.targets.begin() + at, b.targets.begin() + at + T), tg) << "row " << r;
    EXPECT_EQ(std::vector<int32_t>(b.positions.begin() + at, b.positions.begin() + at + T), pos) << "row " << r;
  }
  // the epoch is over: the cursor says so, and the next row is epoch 1's first
  EXPECT_EQ(ds.cursor(), (rt::DataCursor{1, 0}));
  rt::Batch b1 = ds.next_batch(1);
  auto rows1 = ds.epoch_rows(1);
  EXPECT_EQ(static_cast<int32_t>(b1.inputs[0]), want[rows1[0][0]][0]);
  // pack = no: one example per row
  auto o = fopts(T);
  o.pack = false;
  rt::FinetuneDataset one({d.file("t.jsonl")}, enc, o);
  EXPECT_EQ(one.rows_in_epoch(0), texts.size());
}

TEST(Finetune, ResumeAndThreadCountGiveTheSameBatches) {
  TempDir d;
  auto tok = fixture_tokenizer("qwen2");
  std::string file;
  for (int i = 0; i < 40; ++i) file += jsonl_text("example number " + std::to_string(i) + std::string(i % 7, '!'));
  write_bytes(d.file("t.jsonl"), file);
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  rt::set_global_threads(1);
  rt::FinetuneDataset a({d.file("t.jsonl")}, enc, fopts(16, 0.1));
  rt::set_global_threads(2);
  rt::FinetuneDataset b({d.file("t.jsonl")}, enc, fopts(16, 0.1));
  rt::set_global_threads(0);
  for (int k = 0; k < 3; ++k) a.next_batch(4);
  const rt::DataCursor c = a.cursor();
  b.set_cursor(c);
  for (int k = 0; k < 6; ++k) {  // crosses epoch boundaries
    rt::Batch x = a.next_batch(4), y = b.next_batch(4);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.positions, y.positions);
  }
  EXPECT_EQ(a.stats().val_examples, 4u);
  auto va = a.val_batches(2, 0), vb = b.val_batches(2, 0);
  ASSERT_EQ(va.size(), vb.size());
  ASSERT_FALSE(va.empty());
  EXPECT_EQ(va[0].inputs, vb[0].inputs);
  // validation batches always have B rows; padding rows carry no targets, so
  // the targets of all batches are exactly the validation tokens (text: all trained)
  uint64_t n_val_targets = 0;
  for (const rt::Batch& v : a.val_batches(3, 0)) {
    EXPECT_EQ(v.B, 3);
    for (int32_t t : v.targets) n_val_targets += t != rt::ignore_target;
  }
  EXPECT_EQ(n_val_targets, a.stats().val_tokens);
  EXPECT_THROW(b.set_cursor({0, 1000}), rt::Error);
}

TEST(Finetune, ChatMaskOnlyAssistantTokens) {
  TempDir d;
  auto tok = fixture_tokenizer("qwen2");
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::chatml);
  write_bytes(d.file("c.jsonl"),
              R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, )"
              R"({"role": "assistant", "content": "Hello."}]})"
              "\n"
              R"({"instruction": "Add", "input": "2 and 3", "output": "5"})"
              "\n");
  // reference ids and masks from literal segments
  auto build = [&](std::vector<std::pair<std::string, uint8_t>> segs) {
    std::pair<std::vector<int32_t>, std::vector<uint8_t>> r;
    for (auto& [s, m] : segs) {
      auto e = tok->encode(s, false);
      r.first.insert(r.first.end(), e.begin(), e.end());
      r.second.insert(r.second.end(), e.size(), m);
    }
    return r;
  };
  auto chat =
      build({{"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0},
             {"Hello.", 1},
             {"<|im_end|>", 1},
             {"\n", 0}});
  auto instr = build({{"<|im_start|>user\nAdd\n\n2 and 3<|im_end|>\n<|im_start|>assistant\n", 0},
                      {"5", 1},
                      {"<|im_end|>", 1},
                      {"\n", 0}});
  rt::ExampleEncoder enc(*tok, &tpl, "", false, true);
  auto o = fopts(64);
  o.pack = false;
  rt::FinetuneDataset ds({d.file("c.jsonl")}, enc, o);
  EXPECT_EQ(ds.stats().records.kinds.at("chat"), 1u);
  EXPECT_EQ(ds.stats().records.kinds.at("instruction"), 1u);
  rt::Batch b = ds.next_batch(2);
  auto rows = ds.epoch_rows(0);
  for (int r = 0; r < 2; ++r) {
    const auto& ref = rows[static_cast<size_t>(r)][0] == 0 ? chat : instr;
    for (size_t j = 0; j + 1 < ref.first.size(); ++j) {
      EXPECT_EQ(b.inputs[static_cast<size_t>(r * 64) + j], ref.first[j]);
      const int32_t want = ref.second[j + 1] ? ref.first[j + 1] : rt::ignore_target;
      EXPECT_EQ(b.targets[static_cast<size_t>(r * 64) + j], want) << "row " << r << " position " << j;
    }
  }
  // trained = the reply tokens + <|im_end|>, per example
  const uint64_t trained = static_cast<uint64_t>(std::accumulate(chat.second.begin(), chat.second.end(), 0) +
                                                 std::accumulate(instr.second.begin(), instr.second.end(), 0));
  EXPECT_EQ(ds.stats().trained_tokens, trained);
}

TEST(Finetune, TruncationPoliciesAreCounted) {
  TempDir d;
  auto tok = fixture_tokenizer("qwen2");
  const std::vector<std::string> texts = {"short", "the king and the queen and the duke of york and more",
                                          "a somewhat longer text about love and death and the king"};
  std::string file;
  std::vector<size_t> lens;
  for (auto& t : texts) {
    file += jsonl_text(t);
    lens.push_back(tok->encode(t, true).size() + 1);  // + EOS
  }
  write_bytes(d.file("t.jsonl"), file);
  const int64_t T = 8;
  ASSERT_LE(lens[0], 9u);
  ASSERT_GT(lens[1], 9u);
  ASSERT_GT(lens[2], 9u);
  rt::ExampleEncoder enc(*tok, nullptr, "", false, true);
  auto o = fopts(T);
  rt::FinetuneDataset keep({d.file("t.jsonl")}, enc, o);
  EXPECT_EQ(keep.stats().truncated, 2u);
  EXPECT_EQ(keep.stats().truncated_tokens, (lens[1] - 9) + (lens[2] - 9));
  EXPECT_EQ(keep.stats().examples, 3u);
  EXPECT_TRUE(contains(keep.stats().summary(), "truncated 2")) << keep.stats().summary();
  o.truncation = rt::Truncation::drop;
  rt::FinetuneDataset drop({d.file("t.jsonl")}, enc, o);
  EXPECT_EQ(drop.stats().dropped_too_long, 2u);
  EXPECT_EQ(drop.stats().examples, 1u);
  EXPECT_TRUE(contains(drop.stats().summary(), "dropped 2 longer")) << drop.stats().summary();
  o.truncation = rt::Truncation::split;
  rt::FinetuneDataset split({d.file("t.jsonl")}, enc, o);
  const uint64_t w1 = (lens[1] - 1 + T - 1) / T, w2 = (lens[2] - 1 + T - 1) / T;  // ceil((L-1)/T)
  EXPECT_EQ(split.stats().split, 2u);
  EXPECT_EQ(split.stats().split_windows, w1 + w2);
  EXPECT_EQ(split.stats().examples, 1 + w1 + w2);
  // every token of every text is a target exactly once
  EXPECT_EQ(split.stats().tokens, (lens[0] - 1) + (lens[1] - 1) + (lens[2] - 1));
  // a chat whose reply lies past seq_len+1 keeps no trained token: dropped, counted
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::chatml);
  std::string question;
  for (int i = 0; i < 12; ++i) question += "what of the king and the queen? ";
  write_bytes(d.file("c.jsonl"),
              R"({"messages": [{"role": "user", "content": ")" + question +
                  R"("}, )"
                  R"({"role": "assistant", "content": "yes"}]})"
                  "\n"
                  R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
                  "\n");
  rt::ExampleEncoder cenc(*tok, &tpl, "", false, true);
  rt::FinetuneDataset c({d.file("c.jsonl")}, cenc, fopts(32));
  EXPECT_EQ(c.stats().dropped_untrained, 1u);
  EXPECT_EQ(c.stats().examples, 1u);
  EXPECT_TRUE(contains(c.stats().summary(), "dropped 1 with no trained token")) << c.stats().summary();
}

// Every bad-data message: under abort the first bad record throws with
// file:line (and column where it applies); under skip each is counted.
TEST(Finetune, BadDataMessages) {
  TempDir d;
  auto tok = fixture_tokenizer("qwen2");
  rt::ChatTemplate tpl(*tok, rt::ChatFormat::chatml);
  rt::ExampleEncoder enc(*tok, &tpl, "", false, true);
  const std::string good = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";
  struct Case {
    std::string line, kind, message;
  };
  const std::vector<Case> cases = {
      {R"({"text": "unterminated)", "malformed JSON", "bad.jsonl:2:23: malformed JSON: "},
      {R"({"messages": []})", "empty conversation", "bad.jsonl:2: empty conversation"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "x"}]})", "unknown role",
       "bad.jsonl:2: message 2 has unknown role \"bot\"; the roles are system, user and assistant"},
      {"{\"text\": \"caf\xC3(\"}", "invalid UTF-8", "bad.jsonl:2:14: invalid UTF-8 (byte 0xC3 at file offset "},
      {R"({"messages": [{"role": "user", "content": "q"}]})", "no assistant message",
       "bad.jsonl:2: the conversation has no assistant message"},
      {"[1, 2]", "not a JSON object", "bad.jsonl:2: expected a JSON object, got array"},
      {R"({"foo": 1})", "missing field",
       "bad.jsonl:2: the record has no \"text\", \"messages\", \"conversations\", \"instruction\"/\"output\" or "
       "\"prompt\"/\"completion\" field (its fields: \"foo\")"},
      {R"({"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "a"}]})",
       "wrong field type", "bad.jsonl:2: message 1 \"content\" must be a string, got null"},
      {R"({"instruction": "x"})", "missing field", "bad.jsonl:2: the instruction record has no \"output\" field"},
  };
  std::string all = good + "\n";
  for (const Case& c : cases) {
    write_bytes(d.file("bad.jsonl"), good + "\n" + c.line + "\n" + good + "\n");
    SCOPED_TRACE(c.line);
    expect_error([&] { rt::FinetuneDataset ds({d.file("bad.jsonl")}, enc, fopts(32)); },
                 {d.file(c.message), "--bad-lines skip"});
    all += c.line + "\n";
  }
  // the invalid UTF-8 offset: line 2 starts after the good line and its '\n'; the bad byte is column 14
  {
    write_bytes(d.file("bad.jsonl"), good + "\n" + cases[3].line + "\n");
    expect_error([&] { rt::FinetuneDataset ds({d.file("bad.jsonl")}, enc, fopts(32)); },
                 {"file offset " + std::to_string(good.size() + 1 + 13) + ")"});
  }
  // skip: everything counted, the good records kept, empty texts counted separately
  all += R"({"text": ""})"
         "\n" +
         good + "\n";
  write_bytes(d.file("all.jsonl"), all);
  auto o = fopts(32);
  o.records.bad_records = rt::BadRecordPolicy::skip;
  o.records.max_warnings = 0;
  rt::FinetuneDataset ds({d.file("all.jsonl")}, enc, o);
  const rt::RecordStats& st = ds.stats().records;
  EXPECT_EQ(st.records, 2u);
  EXPECT_EQ(st.bad_total(), cases.size());
  EXPECT_EQ(st.bad.at("missing field"), 2u);
  EXPECT_EQ(st.bad.at("malformed JSON"), 1u);
  EXPECT_EQ(st.bad.at("invalid UTF-8"), 1u);
  EXPECT_EQ(st.skipped.at("empty texts"), 1u);
  EXPECT_TRUE(contains(st.summary(), "skipped 9 bad records")) << st.summary();
  EXPECT_TRUE(contains(st.summary(), "1 unknown role")) << st.summary();

  // text files: invalid UTF-8 names line, column and file offset
  write_bytes(d.file("bad.txt"), "line one\nline \xFF two\n");
  expect_error([&] { rt::FinetuneDataset t({d.file("bad.txt")}, enc, fopts(32)); },
               {d.file("bad.txt") + ":2:6: invalid UTF-8 (byte 0xFF at file offset 14)"});
  // a chat record without a chat format is a setup error naming the reason
  rt::ExampleEncoder nochat(*tok, nullptr, "no chat format here; pass --chat-format", false, true);
  write_bytes(d.file("c.jsonl"), good + "\n");
  expect_error([&] { rt::FinetuneDataset t({d.file("c.jsonl")}, nochat, fopts(32)); },
               {"c.jsonl:1: chat records need a chat format, but no chat format here"});
  // tokenize (text only): chat records are bad records
  rt::ExampleEncoder text_only(*tok, nullptr, "", true, false);
  rt::RecordOptions ro;
  expect_error(
      [&] {
        rt::records_for_each(
            {d.file("c.jsonl")}, ro, [&](const rt::RecordPiece& p, rt::EncodedPiece& e) { text_only.encode(p, e); },
            [](const char*, std::vector<int32_t>&, std::vector<uint8_t>&) {});
      },
      {"c.jsonl:1: a chat record, but tokenize writes plain token streams"});
  // nothing to train on
  write_bytes(d.file("e.jsonl"), "{\"text\": \"\"}\n");
  expect_error([&] { rt::FinetuneDataset t({d.file("e.jsonl")}, enc, fopts(32)); },
               {"no training example left", "1 empty texts"});
}

TEST(TokenFileWriter, StreamsAtomically) {
  TempDir d;
  const std::string path = d.file("out.tok");
  {
    rt::TokenFileWriter w(path, 803);
    w.append(std::vector<int32_t>{1, 2, 802});
    EXPECT_FALSE(rt::file_exists(path));  // nothing visible before commit
  }
  EXPECT_FALSE(rt::file_exists(path));
  EXPECT_FALSE(rt::file_exists(path + ".tmp." + std::to_string(::getpid())));  // the temporary is gone
  rt::TokenFileWriter w(path, 803);
  std::vector<int32_t> ids(300000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 803);
  w.append(ids);
  w.append(std::vector<int32_t>{7});
  EXPECT_THROW(w.append(std::vector<int32_t>{803}), rt::Error);
  w.commit();
  rt::TokenStream s = rt::TokenStream::open(path);
  EXPECT_EQ(s.size(), ids.size() + 1);
  EXPECT_EQ(s.vocab_size(), 803u);
  EXPECT_EQ(s.bytes_per_token(), 2u);
  EXPECT_EQ(s.at(299999), 299999u % 803);
  EXPECT_EQ(s.at(300000), 7u);
}

}  // namespace
