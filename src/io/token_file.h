// Token files: read-only token streams over mmap'ed files (never copied, so
// multi-GB files cost no RAM up front), the ramtrain binary writer, and the
// text-ids format used by `ramtrain loss --tokens FILE`.
// Formats (docs/token_format.md has the byte layouts):
//   ramtrain  "RTTOKENS" header (32 bytes) + uint16/uint32 little-endian ids
//   llm.c     256 x int32 header: magic 20240520 version 1 (uint16 ids) or
//             magic 20240801 version 7 (uint32 ids); header[2] = count
//   nanoGPT   a *.bin file with neither magic: raw uint16 ids, no header
// Detection is by magic first, then by the .bin extension. Every failure is an
// rt::Error starting "[tokens] <path>: " that says what is wrong and how to fix it.
// Ids are checked against a model's vocab only by validate_ids (a linear scan);
// at()/read() trust the file.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/fs.h"

namespace rt {

enum class TokenFormat { ramtrain, llmc, nanogpt, memory };
const char* token_format_name(TokenFormat f);  // "ramtrain", "llm.c", "nanoGPT", "memory"

class TokenStream {
 public:
  TokenStream() = default;
  // Maps a token file and detects its format; throws "[tokens] <path>: ...".
  static TokenStream open(const std::string& path);
  // A stream that owns its ids (e.g. byte-tokenized text). name stands in for
  // the path in messages; vocab_size 0 = unknown. Negative ids throw.
  static TokenStream from_ids(std::span<const int32_t> ids, const std::string& name, uint64_t vocab_size);
  // True when path starts with the ramtrain or llm.c magic, or ends in ".bin".
  static bool looks_like_token_file(const std::string& path) { return look(path) == Look::token; }
  // What a path looks like, from its name and first bytes (one mapping):
  // token: a token file as above; damaged: not one but meant to be (named
  // *.tok, or starting "RTTOKEN" with another eighth byte), which text readers
  // refuse instead of reading binary ids as text; none: anything else.
  enum class Look { none, token, damaged };
  static Look look(const std::string& path);

  uint64_t size() const { return count_; }
  uint32_t at(uint64_t i) const;  // bounds-checked
  // out[0..n) = ids [begin, begin + n) as int32 (ids above INT32_MAX wrap;
  // validate_ids against the model vocab first). Throws when out of range.
  void read(uint64_t begin, uint64_t n, int32_t* out) const;
  // Refuses any id >= vocab, naming the file, the position and the vocab size.
  // header: vocab is the file's own header's (a failure means a damaged file).
  void validate_ids(uint64_t vocab, bool header = false) const;

  TokenFormat format() const { return format_; }
  uint32_t bytes_per_token() const { return width_; }
  uint64_t vocab_size() const { return vocab_; }  // from the header; 0 = unknown
  const std::string& path() const { return path_; }

 private:
  MappedFile map_;
  std::vector<uint8_t> owned_;  // little-endian ids for from_ids streams
  const uint8_t* data_ = nullptr;
  uint64_t count_ = 0;
  uint32_t width_ = 2;
  uint64_t vocab_ = 0;
  TokenFormat format_ = TokenFormat::memory;
  std::string path_;
};

// Writes the ramtrain binary format atomically. vocab_size > 0: every id must
// be < vocab_size and tokens take 2 bytes when vocab_size <= 65536, else 4.
// vocab_size 0 (unknown): 2 bytes when every id is < 65536. Negative ids throw.
void token_file_write(const std::string& path, std::span<const int32_t> tokens, uint64_t vocab_size);

// Streams ids into a ramtrain token file whose size is not known up front.
// The file is written whole or not at all: ids go to "<path>.tmp.<pid>" behind
// a placeholder header; commit() writes the real header (with the count),
// fsyncs, renames over path and fsyncs the directory. A writer destroyed
// before commit() removes its temporary. vocab_size > 0 fixes the width
// (2 bytes when <= 65536, else 4); ids < 0 or >= vocab_size throw.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, uint64_t vocab_size);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const int32_t> ids);
  void commit();
  uint64_t count() const { return count_; }
  uint64_t bytes() const;  // header + ids

 private:
  void flush();
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t vocab_ = 0, count_ = 0;
  uint32_t width_ = 2;
  std::vector<uint8_t> buf_;
  bool committed_ = false;
};

// Text ids: one sequence per line of decimal ids separated by spaces or tabs;
// blank lines are skipped; "\r\n" endings are accepted.
struct TokenSequences {
  std::string path;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> lines;  // 1-based line number of each sequence
  // Refuses any id >= vocab, naming the file, line, position in the line and vocab.
  void validate_ids(uint64_t vocab) const;
};
// Throws "[tokens] <path>:<line>: ..." for non-numeric, negative or > INT32_MAX
// ids, and a plain "[tokens] <path>: ..." for an empty file or no sequences.
TokenSequences token_text_read(const std::string& path);

}  // namespace rt
