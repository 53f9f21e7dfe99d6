// quote_input: short input unchanged; long input cut to at most max bytes on a
// UTF-8 character boundary, with an ellipsis and the original length.
#include "core/quote.h"

#include <gtest/gtest.h>

#include "tokenizer/unicode.h"

namespace {

TEST(Quote, ShortInputIsUnchanged) {
  EXPECT_EQ(rt::quote_input("hello"), "hello");
  EXPECT_EQ(rt::quote_input(std::string(200, 'a')), std::string(200, 'a'));
  EXPECT_EQ(rt::quote_input(""), "");
}

TEST(Quote, LongInputIsCutWithItsLength) {
  const std::string s(10 << 20, 'a');
  const std::string q = rt::quote_input(s);
  EXPECT_EQ(q, std::string(200, 'a') + "... (10485760 bytes in all)");
  EXPECT_EQ(rt::quote_input("abcdef", 3), "abc... (6 bytes in all)");
}

TEST(Quote, TheCutNeverSplitsAUtf8Character) {
  // 199 ASCII bytes, then 3-byte characters: byte 200 is inside the first one.
  const std::string s = std::string(199, 'a') + "\xE2\x82\xAC\xE2\x82\xAC";
  const std::string q = rt::quote_input(s);
  EXPECT_EQ(q, std::string(199, 'a') + "... (205 bytes in all)");
  EXPECT_EQ(rt::utf8_find_invalid(q), std::string_view::npos);
  // Cut right after a whole character: kept.
  EXPECT_EQ(rt::quote_input(s, 202), std::string(199, 'a') + "\xE2\x82\xAC... (205 bytes in all)");
}

}  // namespace
