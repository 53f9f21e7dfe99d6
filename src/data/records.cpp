#include "data/records.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/quote.h"
#include "core/thread_pool.h"
#include "tokenizer/unicode.h"

namespace rt {

DataFormat data_format_parse(const std::string& s) {
  if (s == "auto") return DataFormat::auto_detect;
  if (s == "text") return DataFormat::text;
  if (s == "jsonl") return DataFormat::jsonl;
  fail("[data] unknown data format '", s, "': use auto (*.jsonl is jsonl, the rest text), text or jsonl");
}

TextSplit text_split_parse(const std::string& s) {
  if (s == "blank-lines") return TextSplit::blank_lines;
  if (s == "file") return TextSplit::file;
  fail("[data] unknown text split '", s,
       "': use blank-lines (documents separated by blank lines) or file (one per file)");
}

BadRecordPolicy bad_record_policy_parse(const std::string& s) {
  if (s == "abort") return BadRecordPolicy::abort;
  if (s == "skip") return BadRecordPolicy::skip;
  fail("[data] unknown bad-lines policy '", s, "': use abort (stop at the first bad record) or skip (skip and count)");
}

namespace {

std::mutex g_streams_mutex;
std::map<std::string, RecordPull>& streams() {
  static std::map<std::string, RecordPull> m;
  return m;
}

// The pull of a registered stream (an empty function when there is none).
RecordPull stream_pull(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  auto it = streams().find(name);
  return it == streams().end() ? RecordPull() : it->second;
}

}  // namespace

std::string record_stream_add(const std::string& label, RecordPull pull) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  std::string name = cat("<python:", label, ">");
  for (int k = 2; streams().count(name); ++k) name = cat("<python:", label, "#", k, ">");
  streams()[name] = std::move(pull);
  return name;
}

void record_stream_remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  streams().erase(name);
}

bool is_record_stream(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  return streams().count(path) > 0;
}

bool path_is_json_array(const std::string& path, DataFormat f) {
  if (is_record_stream(path)) return false;
  return f == DataFormat::auto_detect && path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

bool path_is_jsonl(const std::string& path, DataFormat f) {
  if (is_record_stream(path)) return true;  // records, whatever --data-format says
  if (f != DataFormat::auto_detect) return f == DataFormat::jsonl;
  return path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
}

std::string RecordPiece::where() const { return cat(*path, ":", line); }

uint64_t RecordStats::bad_total() const {
  uint64_t n = 0;
  for (auto& [k, v] : bad) n += v;
  return n;
}

namespace {

std::string count_list(const std::map<std::string, uint64_t>& m) {
  std::string s;
  for (auto& [k, v] : m) s += cat(s.empty() ? "" : ", ", v, " ", k);
  return s;
}

}  // namespace

std::string RecordStats::summary() const {
  std::string s = cat(records, " records");
  if (!kinds.empty()) s += " (" + count_list(kinds) + ")";
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f MB", static_cast<double>(bytes) / 1e6);
  s += cat(" from ", files, files == 1 ? " file (" : " files (", mb, ")");
  if (!bad.empty()) s += cat("; skipped ", bad_total(), " bad records (", count_list(bad), ")");
  if (!skipped.empty()) s += cat("; skipped ", count_list(skipped));
  return s;
}

namespace {

bool is_blank(const uint8_t* b, const uint8_t* e) {
  for (; b < e; ++b)
    if (*b != ' ' && *b != '\t' && *b != '\r') return false;
  return true;
}

bool safe_cut_byte(uint8_t c) { return c > 0x20 && c < 0x7f; }

// Yields the pieces of every record of every file, in order. A piece points
// into a mapping that stays alive until release_retired().
class PieceScanner {
 public:
  PieceScanner(const std::vector<std::string>& files, const RecordOptions& opt, RecordStats& st)
      : files_(files), opt_(opt), st_(st) {}

  bool next(RecordPiece& p) {
    for (;;) {
      if (rec_active_) {
        emit(p);
        return true;
      }
      if (!open_) {
        if (fi_ == files_.size()) return false;
        open(fi_);
        if (!jsonl_ && opt_.text_split == TextSplit::file) {
          if (size_ == 0) {
            ++st_.skipped["empty files"];
          } else {
            begin_record(0, size_, 1);
          }
          pos_ = size_;
        }
        continue;
      }
      if (pos_ >= size_) {
        if (!(pull_ && next_chunk())) close();
        continue;
      }
      if (json_array_) {
        uint64_t b, e, line;
        if (next_json_element(b, e, line)) begin_record(b, e, line);
        continue;
      }
      if (jsonl_) {
        uint64_t e, next;
        line_end(pos_, e, next);
        uint64_t le = e;
        if (le > pos_ && data_[le - 1] == '\r') --le;
        const uint64_t start = pos_, start_line = line_;
        pos_ = next;
        ++line_;
        if (is_blank(data_ + start, data_ + le)) continue;
        begin_record(start, le, start_line);
        continue;
      }
      // text, blank-line separated documents
      uint64_t start = 0, start_line = 0, last_end = 0;
      bool in_doc = false;
      while (pos_ < size_) {
        uint64_t e, next;
        line_end(pos_, e, next);
        uint64_t le = e;
        if (le > pos_ && data_[le - 1] == '\r') --le;
        const bool blank = is_blank(data_ + pos_, data_ + le);
        if (blank && in_doc) {
          pos_ = next;
          ++line_;
          break;
        }
        if (!blank) {
          if (!in_doc) {
            in_doc = true;
            start = pos_;
            start_line = line_;
          }
          last_end = le;
        }
        pos_ = next;
        ++line_;
      }
      if (in_doc) begin_record(start, last_end, start_line);
    }
  }

  // Bytes of the input behind the last piece handed out.
  uint64_t bytes_done() const { return done_bytes_ + base_ + (open_ ? (rec_active_ ? cut_ : pos_) : 0); }
  void release_retired() {
    retired_.clear();
    retired_chunks_.clear();
  }

 private:
  // A record stream's next chunk in place of the current one (false: the stream is done).
  bool next_chunk() {
    auto chunk = std::make_shared<std::string>();
    while (chunk->empty())
      if (!pull_(*chunk)) return false;
    RT_CHECK(chunk->back() == '\n', "[data] ", files_[fi_], ": internal: a chunk of records must end with a line break");
    base_ += size_;
    if (chunk_) retired_chunks_.push_back(std::move(chunk_));
    chunk_ = std::move(chunk);
    data_ = reinterpret_cast<const uint8_t*>(chunk_->data());
    size_ = chunk_->size();
    pos_ = 0;
    st_.bytes += size_;
    return true;
  }

  void open(size_t i) {
    const std::string& path = files_[i];
    open_ = true;
    base_ = 0;
    if ((pull_ = stream_pull(path))) {  // a record stream: jsonl, in chunks
      json_array_ = false;
      jsonl_ = true;
      data_ = nullptr;
      size_ = pos_ = 0;
      line_ = 1;
      return;
    }
    if (is_directory(path)) fail("[data] ", path, ": is a directory; give files (or directories to `train --data`)");
    require_regular_file(path, "[data]");
    map_ = std::make_shared<MappedFile>(path);
    data_ = map_->data();
    size_ = map_->size();
    pos_ = 0;
    line_ = 1;
    json_array_ = path_is_json_array(path, opt_.format);
    jsonl_ = json_array_ || path_is_jsonl(path, opt_.format);
    st_.bytes += size_;
  }

  // .json: a JSON array of records; each element (which may span lines) is
  // one record, named by the line it starts on. Elements are found by bracket
  // depth outside strings; a malformed element runs to the end of the file
  // and its encoder reports it.
  void skip_json_space() {
    while (pos_ < size_ && (data_[pos_] == ' ' || data_[pos_] == '\t' || data_[pos_] == '\r' || data_[pos_] == '\n')) {
      if (data_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  bool next_json_element(uint64_t& b, uint64_t& e, uint64_t& line) {
    const std::string& path = files_[fi_];
    if (pos_ == 0) {
      if (size_ >= 3 && data_[0] == 0xEF && data_[1] == 0xBB && data_[2] == 0xBF) pos_ = 3;
      skip_json_space();
      if (pos_ >= size_ || data_[pos_] != '[')
        fail("[data] ", path, ":", line_,
             ": a .json data file must hold a JSON array of records ([{...}, {...}]); "
             "for one JSON record per line name the file .jsonl, for plain text pass --data-format text");
      ++pos_;
      in_array_ = true;
    }
    skip_json_space();
    if (pos_ < size_ && data_[pos_] == ',' && !first_element_) {
      ++pos_;
      skip_json_space();
    }
    if (pos_ >= size_ || data_[pos_] == ']') {
      if (pos_ >= size_ && in_array_) fail("[data] ", path, ":", line_, ": the JSON array is not closed with ']'");
      if (pos_ < size_) {
        ++pos_;
        skip_json_space();
        if (pos_ < size_) fail("[data] ", path, ":", line_, ": text after the end of the JSON array");
      }
      pos_ = size_;
      return false;
    }
    b = pos_;
    line = line_;
    int depth = 0;
    bool in_str = false;
    for (; pos_ < size_; ++pos_) {
      const uint8_t c = data_[pos_];
      if (c == '\n') ++line_;
      if (in_str) {
        if (c == '\\') {
          ++pos_;
        } else if (c == '"') {
          in_str = false;
        }
        continue;
      }
      if (c == '"')
        in_str = true;
      else if (c == '[' || c == '{')
        ++depth;
      else if (c == ']' || c == '}') {
        if (depth == 0) break;  // the array's own ']'
        --depth;
      } else if (c == ',' && depth == 0)
        break;
    }
    e = pos_;
    while (e > b && (data_[e - 1] == ' ' || data_[e - 1] == '\t' || data_[e - 1] == '\r' || data_[e - 1] == '\n')) --e;
    first_element_ = false;
    return true;
  }

  void close() {
    done_bytes_ += base_ + size_;
    base_ = 0;
    if (map_) retired_.push_back(std::move(map_));
    if (chunk_) retired_chunks_.push_back(std::move(chunk_));
    map_.reset();
    chunk_.reset();
    pull_ = nullptr;
    open_ = false;
    ++fi_;
  }

  void line_end(uint64_t from, uint64_t& e, uint64_t& next) const {
    const void* nl = std::memchr(data_ + from, '\n', size_ - from);
    e = nl ? static_cast<uint64_t>(static_cast<const uint8_t*>(nl) - data_) : size_;
    next = nl ? e + 1 : size_;
  }

  void begin_record(uint64_t b, uint64_t e, uint64_t line) {
    rec_active_ = true;
    rec_first_ = true;
    cut_ = b;
    rec_end_ = e;
    cut_line_ = line;
  }

  void emit(RecordPiece& p) {
    uint64_t end = rec_end_;
    if (!jsonl_ && opt_.piece_bytes > 0 && rec_end_ - cut_ > opt_.piece_bytes) {
      for (uint64_t k = cut_ + opt_.piece_bytes; k + 1 < rec_end_; ++k) {
        if (data_[k] == '\n' && safe_cut_byte(data_[k - 1]) && safe_cut_byte(data_[k + 1])) {
          end = k + 1;
          break;
        }
      }
    }
    p.path = &files_[fi_];
    p.bytes = std::string_view(reinterpret_cast<const char*>(data_ + cut_), end - cut_);
    p.file_offset = base_ + cut_;
    p.line = cut_line_;
    p.jsonl = jsonl_;
    p.first = rec_first_;
    p.last = end == rec_end_;
    rec_first_ = false;
    if (!p.last) cut_line_ += static_cast<uint64_t>(std::count(data_ + cut_, data_ + end, uint8_t('\n')));
    cut_ = end;
    if (p.last) rec_active_ = false;
  }

  const std::vector<std::string>& files_;
  const RecordOptions& opt_;
  RecordStats& st_;
  size_t fi_ = 0;
  std::shared_ptr<MappedFile> map_;
  std::vector<std::shared_ptr<MappedFile>> retired_;
  bool open_ = false;
  RecordPull pull_;                                     // a record stream's (else empty)
  std::shared_ptr<std::string> chunk_;                  // its current chunk
  std::vector<std::shared_ptr<std::string>> retired_chunks_;
  uint64_t base_ = 0;                                   // stream offset of the current chunk
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0, pos_ = 0, line_ = 1, done_bytes_ = 0;
  bool jsonl_ = false;
  bool json_array_ = false, in_array_ = false, first_element_ = true;  // .json arrays
  bool rec_active_ = false, rec_first_ = false;
  uint64_t cut_ = 0, rec_end_ = 0, cut_line_ = 1;
};

void utf8_check(const RecordPiece& p, EncodedPiece& out) {
  const size_t bad = utf8_find_invalid(p.bytes);
  if (bad == std::string_view::npos) return;
  uint64_t line = p.line;
  size_t line_start = 0;
  for (size_t i = 0; i < bad; ++i)
    if (p.bytes[i] == '\n') ++line, line_start = i + 1;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(p.bytes[bad])));
  out.set_bad("invalid UTF-8",
              cat(*p.path, ":", line, ":", bad - line_start + 1, ": invalid UTF-8 (byte ", byte, " at file offset ",
                  p.file_offset + bad, "); fix the encoding (e.g. iconv -t UTF-8)"));
}

// A JSON library error that escapes an encoder (e.g. a number too large for a
// double, which nlohmann reports as out_of_range.406 rather than a parse
// error) is the record's fault: a bad record with its file:line, which
// --bad-lines skip skips, never an internal error.
void encode_guarded(const PieceEncoder& encode, const RecordPiece& p, EncodedPiece& out) {
  try {
    encode(p, out);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow parsing '1e99999'"
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos)
      what = what.substr(what.find("] ") + 2);
    out = EncodedPiece();
    if (e.id == 406)
      out.set_bad("number out of range", cat(p.where(), ": a number is out of range: ", quote_input(what),
                                             " (JSON numbers must fit a double)"));
    else
      out.set_bad("malformed JSON", cat(p.where(), ": malformed JSON: ", quote_input(what)));
  }
}

class Progress {
 public:
  Progress(bool on, std::string label, uint64_t total)
      : on_(on && ::isatty(STDERR_FILENO)), label_(std::move(label)), total_(total), t0_(clock::now()) {}
  void update(uint64_t done, bool final = false) {
    if (!on_) return;
    const auto now = clock::now();
    if (!final && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count();
    const double frac = total_ ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 1.0;
    const int bar = static_cast<int>(frac * 30);
    std::fprintf(stderr, "\r\033[K%s [%.*s%*s] %3d%% %.1f/%.1f MB, %.2f MB/s", label_.c_str(), bar,
                 "==============================", 30 - bar, "", static_cast<int>(frac * 100),
                 static_cast<double>(done) / 1e6, static_cast<double>(total_) / 1e6,
                 s > 0 ? static_cast<double>(done) / 1e6 / s : 0.0);
    if (final) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  bool on_;
  std::string label_;
  uint64_t total_;
  clock::time_point t0_, last_;
};

}  // namespace

RecordStats records_for_each(const std::vector<std::string>& files, const RecordOptions& opt,
                             const PieceEncoder& encode, const RecordSink& sink) {
  const auto t0 = std::chrono::steady_clock::now();
  RecordStats st;
  st.files = files.size();
  uint64_t total = 0;
  for (const std::string& f : files) {
    if (is_record_stream(f)) continue;  // its size is unknown until it is read
    if (is_directory(f)) fail("[data] ", f, ": is a directory; give files (or directories to `train --data`)");
    require_regular_file(f, "[data]");
    total += file_size(f);
  }
  PieceScanner scanner(files, opt, st);
  Progress progress(opt.progress, opt.label, total);
  // Waves of pieces, split into tasks of about task_bytes: enough tasks per
  // wave to keep every thread busy, few enough to bound the memory in flight.
  constexpr uint64_t task_bytes = 64 << 10;
  const uint64_t wave_bytes = task_bytes * 16 * static_cast<uint64_t>(std::max(1, global_pool().size()));
  constexpr size_t wave_pieces_max = 1 << 16;

  std::vector<RecordPiece> wave;
  std::vector<EncodedPiece> out;
  std::vector<size_t> task_begin;
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  const char* kind = "text";
  std::string bad_kind, bad_message, skip_reason;
  int warned = 0;
  bool more = true;
  while (more) {
    wave.clear();
    uint64_t wb = 0;
    while (wb < wave_bytes && wave.size() < wave_pieces_max) {
      RecordPiece p;
      if (!scanner.next(p)) {
        more = false;
        break;
      }
      wb += p.bytes.size() + 64;  // + a per-record overhead so tiny lines still make bounded tasks
      wave.push_back(p);
    }
    if (wave.empty()) break;
    task_begin.clear();
    uint64_t tb = task_bytes;
    for (size_t i = 0; i < wave.size(); ++i) {
      if (tb >= task_bytes) {
        task_begin.push_back(i);
        tb = 0;
      }
      tb += wave[i].bytes.size() + 64;
    }
    task_begin.push_back(wave.size());
    out.clear();
    out.resize(wave.size());
    global_pool().run(static_cast<int64_t>(task_begin.size() - 1), [&](int64_t t) {
      for (size_t i = task_begin[size_t(t)]; i < task_begin[size_t(t) + 1]; ++i) {
        utf8_check(wave[i], out[i]);
        if (out[i].bad_kind.empty()) encode_guarded(encode, wave[i], out[i]);
      }
    });
    for (size_t i = 0; i < wave.size(); ++i) {
      const RecordPiece& p = wave[i];
      EncodedPiece& e = out[i];
      if (p.first) {
        ids.clear();
        trained.clear();
        kind = e.kind;
        bad_kind.clear();
        bad_message.clear();
        skip_reason.clear();
      }
      if (bad_kind.empty() && !e.bad_kind.empty()) {
        bad_kind = e.bad_kind;
        bad_message = e.bad_message;
      }
      if (skip_reason.empty() && !e.skip_reason.empty()) skip_reason = e.skip_reason;
      if (bad_kind.empty()) {
        ids.insert(ids.end(), e.ids.begin(), e.ids.end());
        trained.insert(trained.end(), e.trained.begin(), e.trained.end());
      }
      e = EncodedPiece();  // free the piece's ids early
      if (!p.last) continue;
      if (!bad_kind.empty()) {
        if (opt.bad_records == BadRecordPolicy::abort)
          fail("[data] ", bad_message, " (pass --bad-lines skip to skip bad records and count them)");
        ++st.bad[bad_kind];
        if (warned < opt.max_warnings) {
          std::fprintf(stderr, "%swarning: skipped bad record: %s\n",
                       opt.progress && ::isatty(STDERR_FILENO) ? "\r\033[K" : "", bad_message.c_str());
          if (++warned == opt.max_warnings)
            std::fprintf(stderr, "warning: further bad records are skipped and only counted\n");
        }
      } else if (!skip_reason.empty()) {
        ++st.skipped[skip_reason];
      } else {
        ++st.records;
        ++st.kinds[kind];
        sink(kind, ids, trained);
      }
    }
    scanner.release_retired();
    progress.update(scanner.bytes_done());
  }
  progress.update(total, true);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace rt
