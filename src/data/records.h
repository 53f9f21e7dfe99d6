// Records: training data before tokenization, read by scanning memory-mapped
// text and .jsonl files (never loaded whole: files larger than RAM stream
// through the page cache), encoded in parallel on the global thread pool in
// waves of fixed-size tasks, and handed to a sink in file order, so the
// result never depends on the thread count.
// What a record is:
//   text, TextSplit::blank_lines: a maximal run of non-blank lines (blank =
//     empty or only spaces, tabs and \r); its text ends before the line break
//     of its last line.
//   text, TextSplit::file: the whole file (an empty file is counted, skipped).
//   jsonl: one non-blank line (blank lines hold no data and are passed over).
//   .json (auto format): one element of the file's top-level JSON array.
// Bad data: every piece is checked for valid UTF-8 before it is encoded and
// invalid bytes are reported as "<path>:<line>:<column>: invalid UTF-8 (byte
// 0xNN at file offset N)"; encoders report their own bad records (malformed
// JSON, missing fields, unknown roles, ...) as "<path>:<line>: ..."; a JSON
// library exception that escapes an encoder is a bad record of that line too
// ("number out of range" for a number too large for a double, else "malformed
// JSON"), never an internal error. Input quoted in messages goes through
// quote_input (core/quote.h): at most ~200 bytes of it.
// BadRecordPolicy::abort throws the first bad record in file order;
// skip counts each one by kind and prints the first few to stderr;
// RecordStats::summary() lists every count. Nothing is dropped silently.
// Pieces: with piece_bytes > 0 a text record longer than that is encoded in
// pieces, each cut just after a '\n' that sits between two printable
// non-space ASCII bytes. No pre-tokenizer split of the byte-level BPE
// layouts ramtrain reads (GPT-2, Llama-3, Qwen2) crosses such a point, so
// the pieces' ids concatenated equal the ids of the whole record (a test
// checks it). SentencePiece adds a prefix space per call: keep 0 for it.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace rt {

enum class DataFormat { auto_detect, text, jsonl };
enum class TextSplit { blank_lines, file };
enum class BadRecordPolicy { abort, skip };

// Parsers for the command-line spellings; each throws "[data] ..." listing the choices.
DataFormat data_format_parse(const std::string& s);             // auto | text | jsonl
TextSplit text_split_parse(const std::string& s);               // blank-lines | file
BadRecordPolicy bad_record_policy_parse(const std::string& s);  // abort | skip
// auto: a name ending in .jsonl is jsonl, anything else is text.
bool path_is_jsonl(const std::string& path, DataFormat f);
// auto: a name ending in .json holds a JSON array of records (e.g. Alpaca
// exports); each element is one record, reported by the line it starts on.
// A .json file that is not an array is an error, never read as text.
bool path_is_json_array(const std::string& path, DataFormat f);

// Record streams: .jsonl records handed over in chunks by the caller (the
// Python module's data= from a list of dicts, a DataFrame, an Arrow table or
// a HF dataset) instead of read from a file. A stream has a path-like name,
// "<python:LABEL>", that stands where a file path would and is read as a
// .jsonl file (whatever the format option says), once, in order: each pull
// fills chunk with one or more whole lines, each ending in '\n' (one record
// per line), and returns false at the end. Its line numbers count records
// from 1. A pull may throw rt::Error (the source failed).
using RecordPull = std::function<bool(std::string& chunk)>;
std::string record_stream_add(const std::string& label, RecordPull pull);  // returns the name
void record_stream_remove(const std::string& name);
bool is_record_stream(const std::string& path);

struct RecordOptions {
  DataFormat format = DataFormat::auto_detect;
  TextSplit text_split = TextSplit::blank_lines;
  BadRecordPolicy bad_records = BadRecordPolicy::abort;
  uint64_t piece_bytes = 0;  // > 0: cut long text records (see above)
  bool progress = false;     // progress bar on stderr when it is a terminal
  std::string label = "reading";
  int max_warnings = 10;  // skipped records printed one by one; the rest only counted
};

// What an encoder gets: a whole record, or one piece of a long text record.
struct RecordPiece {
  const std::string* path = nullptr;
  std::string_view bytes;    // valid UTF-8 when the encoder sees it
  uint64_t file_offset = 0;  // of bytes[0]
  uint64_t line = 1;         // 1-based line of bytes[0]
  bool jsonl = false;
  bool first = true, last = true;  // the piece's place in its record
  std::string where() const;       // "<path>:<line>"
};

struct EncodedPiece {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // one flag per id; empty when the caller needs no mask
  const char* kind = "text";     // the record's kind, counted: "text", "chat", "instruction"
  std::string bad_kind;          // non-empty: a bad record of this class, e.g. "malformed JSON"
  std::string bad_message;       // "<path>:<line>: what is wrong"
  std::string skip_reason;       // non-empty: not bad, but nothing to use (e.g. "empty text"); counted
  void set_bad(std::string kind_name, std::string message) {
    bad_kind = std::move(kind_name);
    bad_message = std::move(message);
  }
};

struct RecordStats {
  uint64_t files = 0, bytes = 0;
  uint64_t records = 0;                     // handed to the sink
  std::map<std::string, uint64_t> kinds;    // records handed to the sink, by kind
  std::map<std::string, uint64_t> bad;      // bad records skipped, by kind
  std::map<std::string, uint64_t> skipped;  // other records skipped, by reason
  double seconds = 0;
  uint64_t bad_total() const;
  // "120 records (100 chat, 20 instruction) from 2 files (3.1 MB); skipped 3 bad records (2 malformed JSON, 1 unknown
  // role)"
  std::string summary() const;
};

using PieceEncoder = std::function<void(const RecordPiece&, EncodedPiece&)>;
// Gets each good record, its pieces' ids and masks concatenated (may be moved from).
using RecordSink = std::function<void(const char* kind, std::vector<int32_t>& ids, std::vector<uint8_t>& trained)>;

// Reads every file in order; throws "[data] <path>: ..." for missing files and,
// under BadRecordPolicy::abort, the first bad record with a hint to --bad-lines skip.
RecordStats records_for_each(const std::vector<std::string>& files, const RecordOptions& opt,
                             const PieceEncoder& encode, const RecordSink& sink);

}  // namespace rt
