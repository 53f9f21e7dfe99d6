// Loss-mask files: `ramtrain tokenize` of chat records writes OUT + OUT.mask
// whose documents are exactly the examples FinetuneDataset builds from the
// .jsonl itself (same ids, same loss flags: the two example caches are
// byte-identical), and every malformed mask file is refused with its reason.
#include "data/loss_mask_file.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "data/finetune.h"
#include "testutil.h"

namespace {

using rt::test::TempDir;
using rt::test::write_bytes;

using rt::test::contains;

TEST(LossMaskFile, TokenizedChatEqualsTrainingOnTheJsonl) {
  TempDir d;
  const std::string tok_dir = rt::test::fixture_dir() + "/tokenizers/qwen2";
  write_bytes(
      d.file("c.jsonl"),
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})"
      "\n"
      R"({"instruction": "Add", "input": "1 2", "output": "3"})"
      "\n"
      R"({"text": "plain text trains everywhere"})"
      "\n"
      R"({"prompt": "Q:", "completion": " A"})"
      "\n");
  auto r =
      rt::test::run_ramtrain("tokenize " + d.file("c.jsonl") + " --tokenizer " + tok_dir + " --out " + d.file("c.tok"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const rt::TokenStream tokens = rt::TokenStream::open(d.file("c.tok"));
  const rt::LossMaskFile mask(rt::loss_mask_path(d.file("c.tok")), tokens.size());
  rt::FinetuneOptions o;
  o.seq_len = 64;
  o.val_fraction = 0;
  const rt::FinetuneDataset from_tokens(tokens, mask, o);

  auto tok = rt::tokenizer_load(tok_dir);
  rt::ChatTemplate chatml(*tok, rt::ChatFormat::chatml);
  rt::ExampleEncoder enc(*tok, &chatml, "", false, true);
  const rt::FinetuneDataset from_jsonl({d.file("c.jsonl")}, enc, o);
  EXPECT_EQ(from_tokens.stats().examples, 4u);
  ASSERT_EQ(from_tokens.cache().size(), from_jsonl.cache().size());
  EXPECT_EQ(0, std::memcmp(from_tokens.cache().data(), from_jsonl.cache().data(), from_jsonl.cache().size()));
  EXPECT_EQ(from_tokens.stats().trained_tokens, from_jsonl.stats().trained_tokens);
  EXPECT_LT(from_tokens.stats().trained_tokens, from_tokens.stats().tokens);  // the masks are not all ones
}

TEST(LossMaskFile, RefusesMalformedFiles) {
  TempDir d;
  auto write_mask = [&](const std::string& body, uint64_t n) {
    std::string s = "RTLMASK1" + body;
    for (int k = 0; k < 8; ++k) s += char((n >> (8 * k)) & 0xff);
    write_bytes(d.file("m"), s);
  };
  auto refused = [&](uint64_t expected, const std::string& why) {
    rt::test::expect_error([&] { rt::LossMaskFile m(d.file("m"), expected); }, {why});
  };
  write_mask(std::string("\x03\x01\x00", 3), 3);
  EXPECT_NO_THROW(rt::LossMaskFile(d.file("m"), 3));
  refused(4, "has 3 flags but its token file has 4 tokens");
  write_mask(std::string("\x03\x01", 2), 3);
  refused(3, "truncated or corrupt");
  write_mask(std::string("\x01\x01\x00", 3), 3);
  refused(3, "the first token does not start a document");
  write_mask(std::string("\x03\x05\x00", 3), 3);
  refused(3, "flag byte 1 is 5");
  write_bytes(d.file("m"), "not a mask file at all");
  refused(3, "not a ramtrain loss-mask file");
}

}  // namespace
