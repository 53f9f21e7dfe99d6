// ByteTokenizer: ids are the byte values (by definition of the format), BOS
// 256 / EOS 257 only when asked, lossless decode of every byte string
// (invalid UTF-8 included), and refusal of ids outside the vocab.
#include "data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace rt {
namespace {

TEST(ByteTokenizer, EveryByteValueRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  ByteTokenizer tok;
  std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);  // id == unsigned byte value
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(ByteTokenizer, InvalidUtf8AndRandomBytesRoundTrip) {
  ByteTokenizer tok;
  // Overlong NUL, lone continuation, truncated 3-byte sequence, 0xFE/0xFF, surrogate half.
  const char raw[] = "\xC0\x80 \x80 \xE2\x82 \xFE\xFF \xED\xA0\x80 \0 end";
  const std::string bad(raw, sizeof(raw) - 1);
  ASSERT_EQ(bad.size(), 20u);
  EXPECT_EQ(tok.decode(tok.encode(bad)), bad);
  std::mt19937_64 rng(7);
  std::string random(10000, '\0');
  for (char& c : random) c = static_cast<char>(rng() & 0xFF);
  EXPECT_EQ(tok.decode(tok.encode(random)), random);
}

TEST(ByteTokenizer, BosEosOnlyWhenAskedAndDroppedByDecode) {
  ByteTokenizer tok;
  EXPECT_EQ(ByteTokenizer::vocab_size, 258);
  EXPECT_EQ(tok.encode("hi"), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(tok.encode("hi", true), (std::vector<int32_t>{256, 'h', 'i', 257}));
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{256, 257}));
  std::vector<int32_t> ids = {256, 'a', 257, 256, 'b', 257};
  EXPECT_EQ(tok.decode(ids), "ab");
  std::vector<int32_t> appended = {1};
  tok.encode_append("x", true, appended);
  EXPECT_EQ(appended, (std::vector<int32_t>{1, 256, 'x', 257}));
}

TEST(ByteTokenizer, DecodeRefusesIdsOutsideVocab) {
  ByteTokenizer tok;
  for (int32_t bad : {258, 1000, -1}) {
    std::vector<int32_t> ids = {'a', 'b', bad};
    try {
      tok.decode(ids);
      FAIL() << "no error for id " << bad;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(m.rfind("[tokenizer]", 0), 0u) << m;
      EXPECT_NE(m.find("id " + std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("position 2"), std::string::npos) << m;
      EXPECT_NE(m.find("258"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace rt
