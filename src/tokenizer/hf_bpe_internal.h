// The HF BPE tokenizer's class and the pieces its two source files share:
// hf_bpe_load.cpp reads tokenizer.json and tokenizer_config.json into it,
// hf_bpe.cpp encodes and decodes (see hf_bpe.h for what is supported).
// Private to src/tokenizer.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace rt::hf_bpe_detail {

// A number per tokenizer object, for the per-thread BPE cache (hf_bpe.cpp).
uint64_t next_instance();


using json = nlohmann::json;

inline constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> unicode table: printable bytes map to themselves, the other
// 68 to U+0100.. in byte order.
struct ByteLevelTable {
  std::string byte_to_utf8[256];
  std::unordered_map<char32_t, uint8_t> char_to_byte;
  ByteLevelTable() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      utf8_append(byte_to_utf8[b], c);
      char_to_byte[c] = static_cast<uint8_t>(b);
    }
  }
  // The raw bytes of a byte-level token string; false if a character is not
  // one of the 256 byte characters.
  bool to_bytes(std::string_view token, std::string& out) const {
    out.clear();
    for (size_t i = 0; i < token.size();) {
      const auto it = char_to_byte.find(utf8_next(token, i));
      if (it == char_to_byte.end()) return false;
      out.push_back(static_cast<char>(it->second));
    }
    return true;
  }
};

inline const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable t;
  return t;
}

struct PreTokenizeStep {
  enum class Kind { split, byte_level, metaspace } kind;
  std::unique_ptr<Pcre2Regex> regex;  // split, or byte_level with use_regex
  bool remove_matches = false;        // split: behavior Removed
  bool invert = false;                // split
  bool add_prefix_space = false;      // byte_level
  // metaspace: ' ' -> replacement; prepend it (unless already there) always,
  // never, or only to the piece that starts the input text (first); split
  // before every replacement (MergedWithNext).
  std::string replacement;
  enum class Prepend { always, never, first } prepend = Prepend::always;
  bool metaspace_split = true;
};

// A pre-token: its bytes, and when offsets are tracked the span in the
// original text of each of its bytes (else nullptr).
struct Piece {
  std::string_view text;
  const TokenSpan* align;
  Piece sub(size_t b, size_t n) const { return {text.substr(b, n), align ? align + b : nullptr}; }
};

// Bytes [b, e) of a pre-token that one BPE token covers.
using PiecePos = std::pair<uint32_t, uint32_t>;

struct Merge {
  int32_t rank;
  int32_t new_id;
};

inline std::string json_type(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : j.dump(); }

inline bool json_bool(const json& j, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  return j[key].get<bool>();
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(const std::string& json_path, const std::string& config_path);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> out;
    encode_impl(text, add_special, out, nullptr);
    return out;
  }
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special,
                                           std::vector<TokenSpan>& spans) const override {
    std::vector<int32_t> out;
    spans.clear();
    encode_impl(text, add_special, out, &spans);
    return out;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(decode_bytes_.size()); }
  std::optional<int32_t> token_to_id(std::string_view name) const override;
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::string describe() const override { return (byte_level_ ? "hf-bpe " : "hf-char-bpe ") + path_; }
  bool encodes_line_pieces_exactly() const override { return byte_level_ && normalizer_.empty_or_nfc(); }

 private:
  void parse_model(const json& m);
  void parse_normalizer(const json& n);
  void parse_pre_tokenizer(const json& p);
  void parse_added_tokens(const json& a);
  void parse_post_processor(const json& p);
  void parse_decoder(const json& d);
  void parse_config(const std::string& config_path);

  // spans: nullptr, or where each id's span goes (encode_with_offsets).
  void encode_impl(std::string_view text, bool add_special, std::vector<int32_t>& out,
                   std::vector<TokenSpan>* spans) const;
  // at_text_start: s begins at byte 0 of the text given to encode (Metaspace's "first").
  // Pieces made here (and their alignments) live in storage / align_storage.
  void pre_tokenize(Piece s, bool at_text_start, std::deque<std::string>& storage,
                    std::deque<std::vector<TokenSpan>>& align_storage, std::vector<Piece>& out) const;
  // Appends the ids of one pre-token, and when pos is given, the bytes of the piece each covers.
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>* pos) const;
  void bpe_merge(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>& pos) const;
  void initial_symbols_bytes(std::string_view piece, std::vector<int32_t>& sym, std::vector<PiecePos>& pos) const;
  void initial_symbols_chars(std::string_view piece, std::vector<int32_t>& sym, std::vector<PiecePos>& pos) const;
  void push_missing_byte(uint8_t b, uint32_t at, std::vector<int32_t>& out, std::vector<PiecePos>& pos) const;

  std::string path_, where_;
  uint64_t instance_ = next_instance();

  // model
  std::unordered_map<std::string, int32_t> vocab_;      // as the file spells tokens
  std::unordered_map<std::string, int32_t> raw_vocab_;  // keyed by raw bytes
  std::unordered_map<uint64_t, Merge> merges_;          // (left id << 32 | right id)
  int32_t byte_id_[256];
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  std::optional<int32_t> unk_id_;

  Normalizer normalizer_;
  bool byte_level_ = false;  // a ByteLevel pre-tokenizer: BPE runs on bytes, else on characters
  Decoder decoder_;
  std::vector<PreTokenizeStep> steps_;

  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_name_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;

  std::vector<int32_t> prefix_, suffix_;  // single-sequence template
  std::optional<int32_t> template_bos_, bos_, eos_;

  std::vector<std::string> decode_bytes_;  // by id; bytes that id decodes to (ByteLevel decoder)
  std::vector<std::string> id_token_;      // by id; the token as the file spells it (other decoders)
  std::vector<uint8_t> id_defined_, id_special_;
};

}  // namespace rt::hf_bpe_detail
