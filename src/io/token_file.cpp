#include "io/token_file.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"

namespace rt {
namespace {

constexpr char ramtrain_magic[8] = {'R', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t ramtrain_version = 1;
constexpr uint64_t ramtrain_header_bytes = 32;
constexpr uint32_t llmc_magic_gpt2 = 20240520;    // version 1, uint16 ids
constexpr uint32_t llmc_magic_llama3 = 20240801;  // version 7, uint32 ids
constexpr uint64_t llmc_header_bytes = 256 * 4;

uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_le64(const uint8_t* p) { return uint64_t(load_le32(p)) | uint64_t(load_le32(p + 4)) << 32; }
void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The id at index i of a little-endian array of `width`-byte ids.
inline uint32_t load_id(const uint8_t* data, uint32_t width, uint64_t i) {
  const uint8_t* p = data + i * width;
  return width == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : load_le32(p);
}

}  // namespace

const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::ramtrain:
      return "ramtrain";
    case TokenFormat::llmc:
      return "llm.c";
    case TokenFormat::nanogpt:
      return "nanoGPT";
    case TokenFormat::memory:
      return "memory";
  }
  return "?";
}

TokenStream::Look TokenStream::look(const std::string& path) {
  if (!file_exists(path)) return Look::none;
  if (ends_with(path, ".bin")) return Look::token;
  try {
    MappedFile m(path);
    if (m.size() >= 8 && std::memcmp(m.data(), ramtrain_magic, 8) == 0) return Look::token;
    if (m.size() >= 4) {
      uint32_t magic = load_le32(m.data());
      if (magic == llmc_magic_gpt2 || magic == llmc_magic_llama3) return Look::token;
    }
    if (ends_with(path, ".tok") || (m.size() >= 7 && std::memcmp(m.data(), ramtrain_magic, 7) == 0))
      return Look::damaged;
  } catch (const Error&) {
    return ends_with(path, ".tok") ? Look::damaged : Look::none;
  }
  return Look::none;
}

TokenStream TokenStream::open(const std::string& path) {
  TokenStream s;
  s.path_ = path;
  if (is_directory(path)) fail("[tokens] ", path, ": is a directory, not a token file");
  if (!file_exists(path)) fail("[tokens] ", path, ": no such file (check the path)");
  try {
    s.map_ = MappedFile(path);
  } catch (const Error& e) {
    fail("[tokens] ", path, ": ", e.what());
  }
  const uint8_t* d = s.map_.data();
  const uint64_t size = s.map_.size();
  if (size == 0) fail("[tokens] ", path, ": file is empty (0 bytes), there are no tokens to read; regenerate it");

  const bool has_rt_magic = size >= 8 && std::memcmp(d, ramtrain_magic, 8) == 0;
  const bool rt_magic_prefix = size >= 4 && size < 8 && std::memcmp(d, ramtrain_magic, size) == 0;
  const uint32_t magic32 = size >= 4 ? load_le32(d) : 0;

  if (has_rt_magic || rt_magic_prefix) {
    if (size < ramtrain_header_bytes)
      fail("[tokens] ", path, ": truncated header: a ramtrain token file starts with a ", ramtrain_header_bytes,
           "-byte header but the file has only ", size, " bytes; regenerate it");
    s.format_ = TokenFormat::ramtrain;
    uint32_t version = load_le32(d + 8);
    uint32_t width = load_le32(d + 12);
    uint64_t count = load_le64(d + 16);
    uint64_t vocab = load_le64(d + 24);
    if (version != ramtrain_version)
      fail("[tokens] ", path, ": ramtrain token format version ", version,
           " is not supported (this build reads version ", ramtrain_version,
           "); regenerate the file with this ramtrain");
    if (width != 2 && width != 4)
      fail("[tokens] ", path, ": header says ", width, " bytes per token; only 2 or 4 are valid (corrupt header?)");
    if (width == 2 && vocab > 65536)
      fail("[tokens] ", path, ": header says vocab size ", vocab,
           " but 2-byte tokens hold at most 65536 ids (corrupt header?)");
    uint64_t payload = size - ramtrain_header_bytes;
    if (count > payload / width || count * width != payload)
      fail("[tokens] ", path, ": header says ", count, " tokens of ", width, " bytes (", count * width,
           " bytes) but the file has ", payload,
           " bytes after the header: the file is truncated or corrupt; regenerate it");
    s.data_ = d + ramtrain_header_bytes;
    s.count_ = count;
    s.width_ = width;
    s.vocab_ = vocab;
  } else if (magic32 == llmc_magic_gpt2 || magic32 == llmc_magic_llama3) {
    if (size < llmc_header_bytes)
      fail("[tokens] ", path, ": truncated header: an llm.c token file starts with a ", llmc_header_bytes,
           "-byte header (256 int32) but the file has only ", size, " bytes; regenerate it");
    s.format_ = TokenFormat::llmc;
    uint32_t version = load_le32(d + 4);
    int32_t count = static_cast<int32_t>(load_le32(d + 8));
    uint32_t width = 0;
    if (magic32 == llmc_magic_gpt2 && version == 1) width = 2;
    if (magic32 == llmc_magic_llama3 && version == 7) width = 4;
    if (width == 0)
      fail(
          "[tokens] ", path, ": llm.c magic ", magic32, " with version ", version,
          " is not a layout this build reads (known: magic 20240520 version 1 = uint16 ids, magic 20240801 version 7 = "
          "uint32 ids)");
    if (count < 0) fail("[tokens] ", path, ": llm.c header says ", count, " tokens (negative: corrupt header)");
    uint64_t payload = size - llmc_header_bytes;
    if (uint64_t(count) * width != payload)
      fail("[tokens] ", path, ": llm.c header says ", count, " tokens (", uint64_t(count) * width,
           " bytes) but the file has ", payload,
           " bytes after the 1024-byte header: the file is truncated or corrupt; "
           "regenerate it");
    s.data_ = d + llmc_header_bytes;
    s.count_ = uint64_t(count);
    s.width_ = width;
  } else if (ends_with(path, ".bin")) {
    if (size % 2 != 0)
      fail("[tokens] ", path, ": odd file size (", size,
           " bytes): a headerless nanoGPT .bin holds uint16 ids (2 bytes each), so the file is truncated or not a "
           "token file");
    s.format_ = TokenFormat::nanogpt;
    s.data_ = d;
    s.count_ = size / 2;
    s.width_ = 2;
  } else {
    fail("[tokens] ", path,
         ": not a token file: it starts with neither the ramtrain (\"RTTOKENS\") nor the llm.c magic and its name does "
         "not end in .bin (headerless nanoGPT uint16); plain text is read by the text loader instead");
  }
  return s;
}

TokenStream TokenStream::from_ids(std::span<const int32_t> ids, const std::string& name, uint64_t vocab_size) {
  TokenStream s;
  s.path_ = name;
  s.format_ = TokenFormat::memory;
  s.vocab_ = vocab_size;
  int32_t max_id = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) fail("[tokens] ", name, ": negative id ", ids[i], " at position ", i);
    max_id = std::max(max_id, ids[i]);
  }
  s.width_ = max_id < 65536 ? 2 : 4;
  s.owned_.resize(ids.size() * s.width_);
  for (size_t i = 0; i < ids.size(); ++i) store_le(s.owned_.data() + i * s.width_, uint32_t(ids[i]), int(s.width_));
  s.data_ = s.owned_.data();
  s.count_ = ids.size();
  return s;
}

uint32_t TokenStream::at(uint64_t i) const {
  RT_CHECK(i < count_, "[tokens] ", path_, ": index ", i, " is out of range (", count_, " tokens)");
  return load_id(data_, width_, i);
}

void TokenStream::read(uint64_t begin, uint64_t n, int32_t* out) const {
  RT_CHECK(n <= count_ && begin <= count_ - n, "[tokens] ", path_, ": read of ", n, " tokens at ", begin,
           " is out of range (", count_, " tokens)");
  const uint8_t* p = data_ + begin * width_;
  if (width_ == 2) {
    for (uint64_t i = 0; i < n; ++i) out[i] = int32_t(uint32_t(p[2 * i]) | uint32_t(p[2 * i + 1]) << 8);
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_le32(p + 4 * i));
  }
}

void TokenStream::validate_ids(uint64_t vocab, bool header) const {
  RT_CHECK(vocab > 0, "[tokens] ", path_, ": validate_ids needs a vocab size > 0");
  if (width_ == 2 && vocab >= 65536) return;  // every uint16 id fits
  // Chunked max so the common (valid) case is one fast pass; locate only on failure.
  constexpr uint64_t chunk = uint64_t(1) << 16;
  for (uint64_t b = 0; b < count_; b += chunk) {
    uint64_t e = std::min(count_, b + chunk);
    uint32_t mx = 0;
    for (uint64_t i = b; i < e; ++i) mx = std::max(mx, load_id(data_, width_, i));
    if (mx < vocab) continue;
    for (uint64_t i = b; i < e; ++i) {
      uint32_t id = load_id(data_, width_, i);
      if (id >= vocab && header)
        fail("[tokens] ", path_, ": token id ", id, " at position ", i, " (0-based, of ", count_,
             " tokens) is >= the vocab size ", vocab, " its own header gives: the file is damaged or was written "
             "wrongly; tokenize the data again (ramtrain tokenize)");
      if (id >= vocab)
        fail("[tokens] ", path_, ": token id ", id, " at position ", i, " (0-based, of ", count_,
             " tokens) is >= the model's vocab size ", vocab,
             ": the tokenizer that produced this file and the model do not match; tokenize the data with the model's "
             "tokenizer or use the model it was made for");
    }
  }
}

void token_file_write(const std::string& path, std::span<const int32_t> tokens, uint64_t vocab_size) {
  int32_t max_id = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t id = tokens[i];
    if (id < 0) fail("[tokens] ", path, ": cannot write negative id ", id, " at position ", i);
    if (vocab_size > 0 && uint64_t(id) >= vocab_size)
      fail("[tokens] ", path, ": cannot write id ", id, " at position ", i, ": it is >= the vocab size ", vocab_size);
    max_id = std::max(max_id, id);
  }
  const uint32_t width = vocab_size > 0 ? (vocab_size <= 65536 ? 2 : 4) : (max_id < 65536 ? 2 : 4);

  uint8_t header[ramtrain_header_bytes] = {};
  std::memcpy(header, ramtrain_magic, 8);
  store_le(header + 8, ramtrain_version, 4);
  store_le(header + 12, width, 4);
  store_le(header + 16, tokens.size(), 8);
  store_le(header + 24, vocab_size, 8);

  AtomicFile f(path);
  f.write(header, sizeof(header));
  constexpr size_t chunk = size_t(1) << 18;
  std::vector<uint8_t> buf(chunk * width);
  for (size_t b = 0; b < tokens.size(); b += chunk) {
    size_t n = std::min(chunk, tokens.size() - b);
    for (size_t i = 0; i < n; ++i) store_le(buf.data() + i * width, uint32_t(tokens[b + i]), int(width));
    f.write(buf.data(), n * width);
  }
  f.commit();
}

TokenFileWriter::TokenFileWriter(const std::string& path, uint64_t vocab_size)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())), vocab_(vocab_size) {
  RT_CHECK(vocab_size > 0, "[tokens] ", path, ": the streaming writer needs the vocab size to fix the id width");
  width_ = vocab_size <= 65536 ? 2 : 4;
  const std::string dir = path_dirname(path);
  if (!dir.empty()) make_dirs(dir);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("[tokens] ", path, ": cannot create ", tmp_, ": ", std::strerror(errno));
  buf_.assign(ramtrain_header_bytes, 0);  // placeholder, rewritten by commit()
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

uint64_t TokenFileWriter::bytes() const { return ramtrain_header_bytes + count_ * width_; }

void TokenFileWriter::flush() {
  size_t off = 0;
  while (off < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("[tokens] ", path_, ": write failed: ", std::strerror(errno), " (disk full?)");
    off += static_cast<size_t>(n);
  }
  buf_.clear();
}

void TokenFileWriter::append(std::span<const int32_t> ids) {
  RT_CHECK(fd_ >= 0 && !committed_, "[tokens] ", path_, ": append after commit");
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || uint64_t(id) >= vocab_)
      fail("[tokens] ", path_, ": cannot write id ", id, " at position ", count_ + i, ": it is outside [0, ", vocab_,
           ")");
    const size_t at = buf_.size();
    buf_.resize(at + width_);
    store_le(buf_.data() + at, uint32_t(id), int(width_));
  }
  count_ += ids.size();
  if (buf_.size() >= (size_t(1) << 20)) flush();
}

void TokenFileWriter::commit() {
  RT_CHECK(fd_ >= 0 && !committed_, "[tokens] ", path_, ": commit twice");
  flush();
  uint8_t header[ramtrain_header_bytes] = {};
  std::memcpy(header, ramtrain_magic, 8);
  store_le(header + 8, ramtrain_version, 4);
  store_le(header + 12, width_, 4);
  store_le(header + 16, count_, 8);
  store_le(header + 24, vocab_, 8);
  if (::pwrite(fd_, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) || ::fsync(fd_) != 0)
    fail("[tokens] ", path_, ": writing the header failed: ", std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("[tokens] ", path_, ": close failed: ", std::strerror(errno));
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("[tokens] ", path_, ": cannot rename ", tmp_, " over it: ", std::strerror(errno));
  committed_ = true;
  fsync_dir(path_dirname(path_));
}

void TokenSequences::validate_ids(uint64_t vocab) const {
  RT_CHECK(vocab > 0, "[tokens] ", path, ": validate_ids needs a vocab size > 0");
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t j = 0; j < seqs[s].size(); ++j)
      if (uint64_t(seqs[s][j]) >= vocab)
        fail("[tokens] ", path, ":", lines[s], ": id ", seqs[s][j], " (item ", j + 1,
             " on the line) is >= the model's vocab size ", vocab,
             ": the tokenizer that produced these ids and the model do not match; tokenize with the model's tokenizer");
}

TokenSequences token_text_read(const std::string& path) {
  TokenSequences out;
  out.path = path;
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    fail("[tokens] ", path, ": ", e.what());
  }
  if (text.empty()) fail("[tokens] ", path, ": file is empty; expected one sequence of space-separated ids per line");

  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    ++line_no;
    std::string_view line(text.data() + pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = end + 1;

    std::vector<int32_t> seq;
    size_t i = 0;
    while (i < line.size()) {
      if (line[i] == ' ' || line[i] == '\t') {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
      std::string_view tok = line.substr(i, j - i);
      std::string shown(tok.substr(0, 40));
      if (tok.size() > 40) shown += "...";
      bool digits = std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; });
      bool negative = tok.size() > 1 && tok[0] == '-' &&
                      std::all_of(tok.begin() + 1, tok.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (negative) fail("[tokens] ", path, ":", line_no, ": negative id ", shown, "; token ids are >= 0");
      if (!digits)
        fail("[tokens] ", path, ":", line_no, ": '", shown,
             "' is not a token id; expected decimal ids separated by spaces, one sequence per line");
      uint64_t v = 0;
      for (char c : tok) {
        v = v * 10 + uint64_t(c - '0');
        if (v > uint64_t(std::numeric_limits<int32_t>::max()))
          fail("[tokens] ", path, ":", line_no, ": id ", shown, " is too large (more than 2147483647)");
      }
      seq.push_back(static_cast<int32_t>(v));
      i = j;
    }
    if (!seq.empty()) {
      out.seqs.push_back(std::move(seq));
      out.lines.push_back(line_no);
    }
  }
  if (out.seqs.empty())
    fail("[tokens] ", path,
         ": no sequences: every line is blank; expected one sequence of space-separated ids per line");
  return out;
}

}  // namespace rt
