// Token files: every format round-trips and is detected; llm.c and nanoGPT
// bytes are written by hand from their published layouts (llm.c
// dev/data/data_common.py: 256 int32 header, [0] magic, [1] version,
// [2] count; nanoGPT: np.uint16 array, no header); every refusal names the
// file and says what is wrong.
#include "io/token_file.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "testutil.h"

namespace rt {
namespace {

using test::TempDir;
using test::write_bytes;

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

std::string llmc_header(uint32_t magic, uint32_t version, uint32_t count) {
  std::string h = le(magic, 4) + le(version, 4) + le(count, 4);
  h.resize(1024, '\0');
  return h;
}

using test::expect_error;

std::vector<int32_t> read_all(const TokenStream& s) {
  std::vector<int32_t> out(s.size());
  s.read(0, s.size(), out.data());
  return out;
}

TEST(TokenFile, RamtrainTwoByteRoundTripAndHeaderBytes) {
  TempDir dir;
  const std::string path = dir.file("a.tok");
  std::vector<int32_t> ids = {0, 1, 255, 256, 257, 7, 0};
  token_file_write(path, ids, 258);
  // Header by the documented layout (docs/token_format.md).
  const std::string bytes = read_text_file(path);
  ASSERT_EQ(bytes.size(), 32u + 2 * ids.size());
  EXPECT_EQ(bytes.substr(0, 8), "RTTOKENS");
  EXPECT_EQ(bytes.substr(8, 4), le(1, 4));
  EXPECT_EQ(bytes.substr(12, 4), le(2, 4));
  EXPECT_EQ(bytes.substr(16, 8), le(ids.size(), 8));
  EXPECT_EQ(bytes.substr(24, 8), le(258, 8));
  EXPECT_EQ(bytes.substr(32 + 2 * 3, 2), le(256, 2));

  TokenStream s = TokenStream::open(path);
  EXPECT_EQ(s.format(), TokenFormat::ramtrain);
  EXPECT_EQ(s.bytes_per_token(), 2u);
  EXPECT_EQ(s.vocab_size(), 258u);
  EXPECT_EQ(s.size(), ids.size());
  EXPECT_EQ(read_all(s), ids);
  EXPECT_EQ(s.at(3), 256u);
  std::vector<int32_t> mid(3);
  s.read(2, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{255, 256, 257}));
}

TEST(TokenFile, RamtrainWidthChoice) {
  TempDir dir;
  // vocab <= 65536 -> 2 bytes, even for the largest id 65535.
  token_file_write(dir.file("v65536"), std::vector<int32_t>{65535, 0}, 65536);
  EXPECT_EQ(TokenStream::open(dir.file("v65536")).bytes_per_token(), 2u);
  EXPECT_EQ(TokenStream::open(dir.file("v65536")).at(0), 65535u);
  // vocab > 65536 -> 4 bytes.
  std::vector<int32_t> big = {151935, 3, 70000};
  token_file_write(dir.file("v151936"), big, 151936);
  TokenStream s = TokenStream::open(dir.file("v151936"));
  EXPECT_EQ(s.bytes_per_token(), 4u);
  EXPECT_EQ(file_size(dir.file("v151936")), 32u + 4 * big.size());
  EXPECT_EQ(read_all(s), big);
  // Unknown vocab: width from the largest id.
  token_file_write(dir.file("u2"), std::vector<int32_t>{65535}, 0);
  token_file_write(dir.file("u4"), std::vector<int32_t>{65536}, 0);
  EXPECT_EQ(TokenStream::open(dir.file("u2")).bytes_per_token(), 2u);
  EXPECT_EQ(TokenStream::open(dir.file("u4")).bytes_per_token(), 4u);
  EXPECT_EQ(TokenStream::open(dir.file("u4")).vocab_size(), 0u);
  // Empty token list is a valid file with count 0.
  token_file_write(dir.file("none"), std::vector<int32_t>{}, 258);
  EXPECT_EQ(TokenStream::open(dir.file("none")).size(), 0u);
}

TEST(TokenFile, WriterRefusesBadIds) {
  TempDir dir;
  expect_error(
      [&] {
        token_file_write(dir.file("x"), std::vector<int32_t>{1, 258}, 258);
      },
      {"[tokens] " + dir.file("x"), "id 258", "position 1"});
  expect_error([&] { token_file_write(dir.file("x"), std::vector<int32_t>{-3}, 0); }, {"negative id -3"});
  EXPECT_FALSE(file_exists(dir.file("x")));  // nothing left behind
}

TEST(TokenFile, LlmcGpt2HandWritten) {
  TempDir dir;
  const std::string path = dir.file("fineweb_val_000000.bin");
  write_bytes(path, llmc_header(20240520, 1, 4) + le(50256, 2) + le(15496, 2) + le(11, 2) + le(0, 2));
  TokenStream s = TokenStream::open(path);
  EXPECT_EQ(s.format(), TokenFormat::llmc);
  EXPECT_EQ(s.bytes_per_token(), 2u);
  EXPECT_EQ(read_all(s), (std::vector<int32_t>{50256, 15496, 11, 0}));
}

TEST(TokenFile, LlmcLlama3HandWritten) {
  TempDir dir;
  const std::string path = dir.file("llama.bin");
  write_bytes(path, llmc_header(20240801, 7, 2) + le(128000, 4) + le(9906, 4));
  TokenStream s = TokenStream::open(path);
  EXPECT_EQ(s.format(), TokenFormat::llmc);
  EXPECT_EQ(s.bytes_per_token(), 4u);
  EXPECT_EQ(read_all(s), (std::vector<int32_t>{128000, 9906}));
}

TEST(TokenFile, LlmcRefusals) {
  TempDir dir;
  const std::string p = dir.file("x.bin");
  write_bytes(p, llmc_header(20240520, 1, 5) + le(1, 2) + le(2, 2));  // says 5, has 2
  expect_error([&] { TokenStream::open(p); }, {"[tokens] " + p + ":", "says 5 tokens", "truncated"});
  write_bytes(p, llmc_header(20240520, 1, 0).substr(0, 100));
  expect_error([&] { TokenStream::open(p); }, {"[tokens] " + p + ":", "truncated header", "100 bytes"});
  write_bytes(p, llmc_header(20240520, 2, 0));
  expect_error([&] { TokenStream::open(p); }, {"version 2", "20240520 version 1"});
}

TEST(TokenFile, NanoGptRawUint16) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  write_bytes(path, le(3, 2) + le(65535, 2) + le(258, 2));
  TokenStream s = TokenStream::open(path);
  EXPECT_EQ(s.format(), TokenFormat::nanogpt);
  EXPECT_EQ(read_all(s), (std::vector<int32_t>{3, 65535, 258}));
  EXPECT_EQ(s.vocab_size(), 0u);

  write_bytes(path, le(3, 2) + "x");
  expect_error([&] { TokenStream::open(path); }, {"[tokens] " + path + ":", "odd file size (3 bytes)"});
}

TEST(TokenFile, DetectionAndGeneralRefusals) {
  TempDir dir;
  write_bytes(dir.file("empty.bin"), "");
  expect_error([&] { TokenStream::open(dir.file("empty.bin")); }, {"[tokens] " + dir.file("empty.bin"), "empty"});
  write_bytes(dir.file("notes.dat"), "hello world");
  expect_error([&] { TokenStream::open(dir.file("notes.dat")); },
               {"[tokens] " + dir.file("notes.dat"), "not a token file"});
  expect_error([&] { TokenStream::open(dir.file("missing.bin")); },
               {"[tokens] " + dir.file("missing.bin"), "no such file"});
  expect_error([&] { TokenStream::open(dir.path()); }, {"is a directory"});

  // A ramtrain file under any name is found by its magic; a .bin is not needed.
  token_file_write(dir.file("any.name"), std::vector<int32_t>{5}, 258);
  EXPECT_TRUE(TokenStream::looks_like_token_file(dir.file("any.name")));
  EXPECT_TRUE(TokenStream::looks_like_token_file(dir.file("empty.bin")));
  EXPECT_FALSE(TokenStream::looks_like_token_file(dir.file("notes.dat")));
  EXPECT_FALSE(TokenStream::looks_like_token_file(dir.file("missing.bin")));
}

TEST(TokenFile, RamtrainRefusals) {
  TempDir dir;
  const std::string p = dir.file("a.tok");
  std::string header = std::string("RTTOKENS") + le(1, 4) + le(2, 4) + le(3, 8) + le(258, 8);
  write_bytes(p, header.substr(0, 20));
  expect_error([&] { TokenStream::open(p); }, {"[tokens] " + p + ":", "truncated header", "20 bytes"});
  write_bytes(p, "RTTOK");
  expect_error([&] { TokenStream::open(p); }, {"truncated header", "5 bytes"});
  write_bytes(p, header + le(1, 2));  // 3 promised, 1 present
  expect_error([&] { TokenStream::open(p); }, {"says 3 tokens", "truncated"});
  write_bytes(p, header + le(1, 2) + le(1, 2) + le(1, 2) + "zz");  // trailing bytes
  expect_error([&] { TokenStream::open(p); }, {"says 3 tokens", "8 bytes after the header"});
  write_bytes(p, std::string("RTTOKENS") + le(2, 4) + le(2, 4) + le(0, 8) + le(0, 8));
  expect_error([&] { TokenStream::open(p); }, {"version 2 is not supported"});
  write_bytes(p, std::string("RTTOKENS") + le(1, 4) + le(3, 4) + le(0, 8) + le(0, 8));
  expect_error([&] { TokenStream::open(p); }, {"3 bytes per token"});
}

TEST(TokenFile, ValidateIdsNamesPositionAndVocab) {
  TempDir dir;
  const std::string p = dir.file("a.tok");
  token_file_write(p, std::vector<int32_t>{1, 2, 3, 4, 5, 300, 6}, 0);
  TokenStream s = TokenStream::open(p);
  s.validate_ids(301);  // every id < 301
  expect_error([&] { s.validate_ids(258); },
               {"[tokens] " + p + ":", "token id 300", "position 5", "vocab size 258", "do not match"});
  // Large stream: the bad id sits past the first scan chunk.
  std::vector<int32_t> many(200000, 7);
  many[150001] = 999;
  token_file_write(dir.file("big.tok"), many, 0);
  expect_error([&] { TokenStream::open(dir.file("big.tok")).validate_ids(500); }, {"token id 999", "position 150001"});
}

TEST(TokenFile, FromIdsAndBounds) {
  std::vector<int32_t> ids = {4, 70000, 9};
  TokenStream s = TokenStream::from_ids(ids, "mem", 0);
  EXPECT_EQ(s.format(), TokenFormat::memory);
  EXPECT_EQ(s.bytes_per_token(), 4u);
  EXPECT_EQ(read_all(s), ids);
  TokenStream moved = std::move(s);
  EXPECT_EQ(moved.at(1), 70000u);
  expect_error([&] { moved.at(3); }, {"[tokens] mem:", "index 3 is out of range"});
  std::vector<int32_t> out(4);
  expect_error([&] { moved.read(1, 3, out.data()); }, {"out of range"});
  expect_error([&] { TokenStream::from_ids(std::vector<int32_t>{1, -2}, "mem", 0); }, {"negative id -2"});
}

TEST(TokenText, ParsesSequencesSkippingBlankLines) {
  TempDir dir;
  const std::string p = dir.file("seqs.txt");
  write_bytes(p, "1 2 3\n\n  4\t5 \r\n2147483647\n");
  TokenSequences t = token_text_read(p);
  ASSERT_EQ(t.seqs.size(), 3u);
  EXPECT_EQ(t.seqs[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(t.seqs[1], (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(t.seqs[2], (std::vector<int32_t>{2147483647}));
  EXPECT_EQ(t.lines, (std::vector<int64_t>{1, 3, 4}));
  expect_error([&] { t.validate_ids(258); },
               {"[tokens] " + p + ":4:", "id 2147483647", "item 1", "258", "do not match"});
  write_bytes(p, "1 2\n3 4 999\n");
  expect_error([&] { token_text_read(p).validate_ids(258); }, {p + ":2:", "id 999", "item 3"});
}

TEST(TokenText, Refusals) {
  TempDir dir;
  const std::string p = dir.file("seqs.txt");
  write_bytes(p, "");
  expect_error([&] { token_text_read(p); }, {"[tokens] " + p + ":", "empty"});
  write_bytes(p, "\n  \n\t\n");
  expect_error([&] { token_text_read(p); }, {"[tokens] " + p + ":", "no sequences"});
  write_bytes(p, "1 2\n3 abc 4\n");
  expect_error([&] { token_text_read(p); }, {"[tokens] " + p + ":2:", "'abc' is not a token id"});
  write_bytes(p, "1 2.5\n");
  expect_error([&] { token_text_read(p); }, {p + ":1:", "'2.5' is not a token id"});
  write_bytes(p, "1\n2\n3 -7\n");
  expect_error([&] { token_text_read(p); }, {p + ":3:", "negative id -7"});
  write_bytes(p, "2147483648\n");
  expect_error([&] { token_text_read(p); }, {p + ":1:", "too large"});
  write_bytes(p, "99999999999999999999999\n");
  expect_error([&] { token_text_read(p); }, {p + ":1:", "too large"});
  expect_error([&] { token_text_read(dir.file("missing.txt")); }, {"[tokens] " + dir.file("missing.txt")});
}

}  // namespace
}  // namespace rt
