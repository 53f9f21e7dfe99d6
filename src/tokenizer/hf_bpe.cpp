// BPE from HF tokenizer.json; see hf_bpe.h for what is supported.
// Encode pipeline, as HF runs it:
//   raw text -> split on added tokens (normalized=false) -> normalize the rest
//   -> split on added tokens (normalized=true) -> pre-tokenize (Split / Digits
//   steps, ByteLevel) -> BPE per pre-token -> template tokens.
// Byte-level layouts: the vocabulary is also keyed by raw bytes (each token's
// byte-level characters mapped back through GPT-2's byte<->unicode table), so
// BPE runs on the input bytes directly and never builds the mapped strings.
// Character-level layouts (no ByteLevel step, e.g. Llama-2's): BPE starts
// from the characters of the pre-token as the vocab spells them.
#include "tokenizer/hf_bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace rt {
namespace {

using json = nlohmann::json;

constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

const ByteLevelTable& byte_level_table() {
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

std::string json_type(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : j.dump(); }

bool json_bool(const json& j, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  return j[key].get<bool>();
}

std::atomic<uint64_t> g_next_instance{1};

// Per-thread BPE result cache: pre-token bytes -> ids, for one tokenizer at a
// time (owner), bounded; switching tokenizers or filling up clears it.
struct BpeCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> map;  // -> (offset, count) in pool
  std::vector<int32_t> pool;
  std::vector<PiecePos> pos_pool;  // parallel to pool
};
thread_local BpeCache tl_bpe_cache;
constexpr size_t kCacheMaxPieceBytes = 64, kCacheMaxEntries = 1 << 17;

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
  uint64_t instance_ = g_next_instance.fetch_add(1);

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

HfBpeTokenizer::HfBpeTokenizer(const std::string& json_path, const std::string& config_path)
    : path_(json_path), where_("[tokenizer " + json_path + "] ") {
  json j;
  try {
    j = json::parse(read_text_file(json_path));
  } catch (const json::exception& e) {
    fail(where_, "not valid JSON: ", e.what());
  }
  RT_CHECK(j.is_object() && j.contains("model"), where_, "no \"model\" object: not a HF tokenizer.json");
  try {
    parse_model(j["model"]);
    parse_normalizer(j.value("normalizer", json()));
    parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    parse_added_tokens(j.value("added_tokens", json::array()));
    parse_post_processor(j.value("post_processor", json()));
    parse_decoder(j.value("decoder", json()));
  } catch (const json::exception& e) {
    fail(where_, "unexpected JSON layout: ", e.what());
  }
  parse_config(config_path);
}

void HfBpeTokenizer::parse_model(const json& m) {
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : (m.contains("merges") ? "BPE" : "?");
  RT_CHECK(type == "BPE", where_, "model type \"", type,
           "\" is not supported; supported: BPE (GPT-2, Llama-2, Llama-3, Qwen2, DeepSeek layouts), "
           "or put a SentencePiece tokenizer.model in the directory instead");
  RT_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0, where_,
           "BPE dropout is set; ramtrain tokenizes deterministically: set \"dropout\" to null");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    RT_CHECK(!m.contains(k) || m[k].is_null() || m[k].get<std::string>().empty(), where_, "model.", k,
             " is not supported (byte-level BPE files leave it null)");
  ignore_merges_ = json_bool(m, "ignore_merges", false);
  byte_fallback_ = json_bool(m, "byte_fallback", false);
  fuse_unk_ = json_bool(m, "fuse_unk", false);

  const auto& table = byte_level_table();
  int32_t max_id = -1;
  std::string raw;
  for (const auto& [tok, idj] : m.at("vocab").items()) {
    const auto id = idj.get<int32_t>();
    RT_CHECK(id >= 0, where_, "vocab entry \"", tok, "\" has negative id ", id);
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
    if (table.to_bytes(tok, raw)) raw_vocab_[raw] = id;
  }
  decode_bytes_.resize(static_cast<size_t>(max_id + 1));
  id_defined_.assign(decode_bytes_.size(), 0);
  id_special_.assign(decode_bytes_.size(), 0);
  id_token_.resize(decode_bytes_.size());
  for (const auto& [tok, id] : vocab_) {
    id_token_[id] = tok;
    id_defined_[id] = 1;
    decode_bytes_[id] = table.to_bytes(tok, raw) ? raw : tok;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(table.byte_to_utf8[b]);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const auto u = m["unk_token"].get<std::string>();
    const auto it = vocab_.find(u);
    RT_CHECK(it != vocab_.end(), where_, "unk_token \"", u, "\" is not in the vocab");
    unk_id_ = it->second;
  }

  const json& merges = m.at("merges");
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& e : merges) {
    std::string a, b;
    if (e.is_string()) {
      const auto s = e.get<std::string>();
      const size_t sp = s.find(' ');
      RT_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where_, "merge ", rank, " \"", s,
               "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      RT_CHECK(e.is_array() && e.size() == 2, where_, "merge ", rank, " is neither \"a b\" nor [a, b]: ", e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    RT_CHECK(ia != vocab_.end() && ib != vocab_.end(), where_, "merge ", rank, " (", a, ", ", b,
             ") uses a token missing from the vocab");
    RT_CHECK(ic != vocab_.end(), where_, "merge ", rank, " produces \"", a + b, "\", which is not in the vocab");
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.emplace(key, Merge{rank, ic->second});  // the first (lowest-rank) entry wins
    ++rank;
  }
}

void HfBpeTokenizer::parse_normalizer(const json& n) { normalizer_.parse(n, where_); }

void HfBpeTokenizer::parse_pre_tokenizer(const json& p) {
  if (p.is_null()) return;  // the whole normalized text is one word (Llama-2's tokenizer.json)
  const std::string type = p.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) parse_pre_tokenizer(s);
    return;
  }
  RT_CHECK(steps_.empty() || steps_.back().kind != PreTokenizeStep::Kind::byte_level, where_, "pre-tokenizer ",
           json_type(p), " after ByteLevel is not supported (ByteLevel must come last)");
  PreTokenizeStep st;
  if (type == "ByteLevel") {
    st.kind = PreTokenizeStep::Kind::byte_level;
    st.add_prefix_space = json_bool(p, "add_prefix_space", true);
    if (json_bool(p, "use_regex", true)) st.regex = std::make_unique<Pcre2Regex>(kGpt2Regex, false, where_);
  } else if (type == "Digits") {  // HF splits on char::is_numeric (Nd, Nl, No = \p{N}): each digit, or each run
    st.kind = PreTokenizeStep::Kind::split;
    st.regex =
        std::make_unique<Pcre2Regex>(json_bool(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", false, where_);
  } else if (type == "Metaspace") {
    st.kind = PreTokenizeStep::Kind::metaspace;
    st.replacement = p.at("replacement").get<std::string>();
    size_t k = 0;
    RT_CHECK(!st.replacement.empty() && utf8_find_invalid(st.replacement) == std::string::npos &&
                 (utf8_next(st.replacement, k), k == st.replacement.size()),
             where_, "Metaspace replacement must be one character");
    std::string scheme = p.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = json_bool(p, "add_prefix_space", true) ? "always" : "never";  // older files
    RT_CHECK(scheme == "always" || scheme == "never" || scheme == "first", where_, "Metaspace prepend_scheme \"",
             scheme, "\" is not one of always, never, first");
    st.prepend = scheme == "always"  ? PreTokenizeStep::Prepend::always
                 : scheme == "never" ? PreTokenizeStep::Prepend::never
                                     : PreTokenizeStep::Prepend::first;
    st.metaspace_split = json_bool(p, "split", true);
  } else if (type == "Split") {
    st.kind = PreTokenizeStep::Kind::split;
    const json& pat = p.at("pattern");
    if (pat.contains("Regex"))
      st.regex = std::make_unique<Pcre2Regex>(pat["Regex"].get<std::string>(), false, where_);
    else
      st.regex = std::make_unique<Pcre2Regex>(pat.at("String").get<std::string>(), true, where_);
    const std::string behavior = p.at("behavior").get<std::string>();
    RT_CHECK(behavior == "Isolated" || behavior == "Removed", where_, "Split behavior \"", behavior,
             "\" is not supported; supported: Isolated, Removed");
    st.remove_matches = behavior == "Removed";
    st.invert = json_bool(p, "invert", false);
  } else {
    fail(where_, "pre_tokenizer ", json_type(p),
         " is not supported; supported: ByteLevel, Split (Isolated/Removed), Digits, Metaspace, Sequence of those "
         "(ByteLevel last)");
  }
  byte_level_ |= st.kind == PreTokenizeStep::Kind::byte_level;
  steps_.push_back(std::move(st));
}

void HfBpeTokenizer::parse_added_tokens(const json& a) {
  added_.reserve(a.size());  // stable addresses for the matchers
  for (const auto& t : a) {
    AddedToken tok{t.at("content").get<std::string>(), t.at("id").get<int32_t>(),     json_bool(t, "special", false),
                   json_bool(t, "single_word", false), json_bool(t, "lstrip", false), json_bool(t, "rstrip", false),
                   json_bool(t, "normalized", true)};
    RT_CHECK(tok.id >= 0, where_, "added token \"", tok.content, "\" has negative id");
    added_by_name_[tok.content] = tok.id;
    if (static_cast<size_t>(tok.id) >= decode_bytes_.size()) {
      decode_bytes_.resize(tok.id + 1);
      id_defined_.resize(tok.id + 1, 0);
      id_special_.resize(tok.id + 1, 0);
      id_token_.resize(tok.id + 1);
    }
    std::string raw;
    decode_bytes_[tok.id] = byte_level_table().to_bytes(tok.content, raw) ? raw : tok.content;
    id_token_[tok.id] = tok.content;
    id_defined_[tok.id] = 1;
    id_special_[tok.id] = tok.special;
    // HF matches a normalized token in the normalized text as the normalizer spells it.
    if (tok.normalized) tok.content = normalizer_.apply(tok.content);
    added_.push_back(std::move(tok));
  }
  for (const auto& t : added_) (t.normalized ? normalized_matcher_ : raw_matcher_).add(&t);
}

void HfBpeTokenizer::parse_post_processor(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& s : p.at("processors")) parse_post_processor(s);
    return;
  }
  RT_CHECK(type == "TemplateProcessing", where_, "post_processor ", json_type(p),
           " is not supported; supported: null, ByteLevel, TemplateProcessing, Sequence of those");
  RT_CHECK(prefix_.empty() && suffix_.empty(), where_, "more than one TemplateProcessing post-processor");
  bool seen_sequence = false;
  for (const auto& item : p.at("single")) {
    if (item.contains("Sequence")) {
      RT_CHECK(!seen_sequence, where_, "the single template holds the sequence twice");
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& st = p.at("special_tokens");
    RT_CHECK(st.contains(name), where_, "template token \"", name, "\" missing from special_tokens");
    for (const auto& id : st[name].at("ids")) (seen_sequence ? suffix_ : prefix_).push_back(id.get<int32_t>());
  }
  RT_CHECK(seen_sequence, where_, "the single template has no $A sequence");
  if (!prefix_.empty()) template_bos_ = prefix_.front();
}

void HfBpeTokenizer::parse_decoder(const json& d) { decoder_.parse(d, where_); }

void HfBpeTokenizer::parse_config(const std::string& config_path) {
  bos_ = template_bos_;
  if (config_path.empty()) return;
  const std::string where = "[tokenizer " + config_path + "] ";
  json c;
  try {
    c = json::parse(read_text_file(config_path));
  } catch (const json::exception& e) {
    fail(where, "not valid JSON: ", e.what());
  }
  auto resolve = [&](const char* key, std::optional<int32_t>& out) {
    if (!c.contains(key)) return;
    const json& v = c[key];
    if (v.is_null()) {
      out.reset();
      return;
    }
    const std::string name = v.is_object() ? v.at("content").get<std::string>() : v.get<std::string>();
    const auto id = token_to_id(name);
    RT_CHECK(id, where, key, " \"", name, "\" is not a token of ", path_);
    out = id;
  };
  try {
    resolve("bos_token", bos_);
    resolve("eos_token", eos_);
  } catch (const json::exception& e) {
    fail(where, "unexpected bos_token/eos_token layout: ", e.what());
  }
}

std::optional<int32_t> HfBpeTokenizer::token_to_id(std::string_view name) const {
  const std::string key(name);
  if (const auto it = added_by_name_.find(key); it != added_by_name_.end()) return it->second;
  if (const auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

void HfBpeTokenizer::pre_tokenize(Piece s, bool at_text_start, std::deque<std::string>& storage,
                                  std::deque<std::vector<TokenSpan>>& align_storage, std::vector<Piece>& out) const {
  std::vector<Piece> cur{s}, next;
  std::vector<std::pair<size_t, size_t>> matches;
  const char* origin = at_text_start ? s.text.data() : nullptr;  // a piece starting here starts the text
  for (const auto& st : steps_) {
    next.clear();
    for (Piece piece : cur) {
      if (st.kind == PreTokenizeStep::Kind::metaspace) {
        std::string& t = storage.emplace_back();
        const TokenSpan* align = nullptr;
        if (piece.align) {
          std::vector<TokenSpan>& a = align_storage.emplace_back(piece.align, piece.align + piece.text.size());
          t = replace_all_aligned(piece.text, " ", nullptr, st.replacement, a);
          align = a.data();
        } else {
          t = replace_all(piece.text, " ", nullptr, st.replacement);
        }
        const bool starts = t.compare(0, st.replacement.size(), st.replacement) == 0;
        if (!starts && (st.prepend == PreTokenizeStep::Prepend::always ||
                        (st.prepend == PreTokenizeStep::Prepend::first && piece.text.data() == origin))) {
          t.insert(0, st.replacement);
          if (align) {  // the prepended character belongs to the one it precedes
            std::vector<TokenSpan>& a = align_storage.back();
            const TokenSpan first = a.empty() ? TokenSpan{} : a[0];
            a.insert(a.begin(), st.replacement.size(), first);
            align = a.data();
          }
        }
        const Piece v{t, align};
        if (!st.metaspace_split) {
          next.push_back(v);
          continue;
        }
        size_t b = 0;
        for (size_t p = v.text.find(st.replacement, 1); p != std::string_view::npos;
             p = v.text.find(st.replacement, p + 1)) {
          if (p > b) next.push_back(v.sub(b, p - b));
          b = p;
        }
        if (b < v.text.size()) next.push_back(v.sub(b, v.text.size() - b));
        continue;
      }
      if (st.kind == PreTokenizeStep::Kind::byte_level && st.add_prefix_space && piece.text[0] != ' ') {
        std::string& t = storage.emplace_back();
        t.reserve(piece.text.size() + 1);
        t += ' ';
        t += piece.text;
        const TokenSpan* align = nullptr;
        if (piece.align) {  // the space belongs to the character it precedes
          std::vector<TokenSpan>& a = align_storage.emplace_back();
          a.reserve(t.size());
          a.push_back(piece.align[0]);
          a.insert(a.end(), piece.align, piece.align + piece.text.size());
          align = a.data();
        }
        piece = {t, align};
      }
      if (!st.regex) {
        next.push_back(piece);
        continue;
      }
      matches.clear();
      st.regex->find_all(piece.text, matches);
      const bool keep_matches = !(st.remove_matches && !st.invert);
      const bool keep_gaps = !(st.remove_matches && st.invert);
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        if (b > prev && keep_gaps) next.push_back(piece.sub(prev, b - prev));
        if (keep_matches) next.push_back(piece.sub(b, e - b));
        prev = e;
      }
      if (prev < piece.text.size() && keep_gaps) next.push_back(piece.sub(prev, piece.text.size() - prev));
    }
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

// A byte whose byte-level character is not in the vocab: byte fallback
// (<0xXX> of that character's UTF-8 bytes, as HF does it), else unk, else dropped.
// at: the byte's offset in the piece (the first token covers it, the others nothing).
void HfBpeTokenizer::push_missing_byte(uint8_t b, uint32_t at, std::vector<int32_t>& out,
                                       std::vector<PiecePos>& pos) const {
  const std::string& ch = byte_level_table().byte_to_utf8[b];
  if (byte_fallback_) {
    std::vector<int32_t> ids;
    for (unsigned char c : ch) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", c);
      const auto it = vocab_.find(name);
      if (it == vocab_.end()) break;
      ids.push_back(it->second);
    }
    if (ids.size() == ch.size()) {
      for (size_t k = 0; k < ids.size(); ++k) {
        out.push_back(ids[k]);
        pos.emplace_back(k == 0 ? at : at + 1, at + 1);
      }
      return;
    }
  }
  if (unk_id_) {
    if (fuse_unk_ && !out.empty() && out.back() == *unk_id_) {
      pos.back().second = at + 1;
    } else {
      out.push_back(*unk_id_);
      pos.emplace_back(at, at + 1);
    }
  }
}

void HfBpeTokenizer::initial_symbols_bytes(std::string_view piece, std::vector<int32_t>& sym,
                                           std::vector<PiecePos>& pos) const {
  for (uint32_t i = 0; i < piece.size(); ++i) {
    const auto b = static_cast<uint8_t>(piece[i]);
    if (byte_id_[b] >= 0) {
      sym.push_back(byte_id_[b]);
      pos.emplace_back(i, i + 1);
    } else {
      push_missing_byte(b, i, sym, pos);
    }
  }
}

// HF BPE::merge_word on characters: a character missing from the vocab
// becomes its UTF-8 bytes as <0xXX> tokens (byte_fallback, when all exist),
// else unk: one per character, or one per run with fuse_unk. As in HF, a
// pending unk is emitted only when the next in-vocab character or the end
// comes, so byte-fallback tokens right after an unk precede it (and so do
// their positions).
void HfBpeTokenizer::initial_symbols_chars(std::string_view piece, std::vector<int32_t>& sym,
                                           std::vector<PiecePos>& pos) const {
  bool unk_pending = false;
  PiecePos unk_pos{0, 0};
  std::string ch;
  for (size_t i = 0; i < piece.size();) {
    const auto b = static_cast<uint32_t>(i);
    utf8_next(piece, i);
    const auto e = static_cast<uint32_t>(i);
    ch.assign(piece.substr(b, e - b));
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (unk_pending) {
        sym.push_back(*unk_id_);
        pos.push_back(unk_pos);
      }
      unk_pending = false;
      sym.push_back(it->second);
      pos.emplace_back(b, e);
      continue;
    }
    if (byte_fallback_) {
      const size_t before = sym.size();
      bool all = true;
      for (uint32_t k = 0; k < ch.size(); ++k) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(ch[k]));
        const auto it = vocab_.find(name);
        if (it == vocab_.end()) {
          all = false;
          break;
        }
        sym.push_back(it->second);
        pos.emplace_back(b + k, b + k + 1);
      }
      if (all) continue;
      sym.resize(before);
      pos.resize(before);
    }
    if (unk_id_) {
      if (unk_pending && !fuse_unk_) {
        sym.push_back(*unk_id_);
        pos.push_back(unk_pos);
      }
      if (unk_pending && fuse_unk_)
        unk_pos.second = e;
      else
        unk_pos = {b, e};
      unk_pending = true;
    }
  }
  if (unk_pending) {
    sym.push_back(*unk_id_);
    pos.push_back(unk_pos);
  }
}

// Standard BPE on one pre-token: repeatedly merge the adjacent pair with the
// lowest merge rank (leftmost first on ties), via a heap over a linked list.
// Symbols missing from the vocab are replaced first (initial_symbols_*), as
// HF builds its word before merging. pos gets each output token's bytes.
void HfBpeTokenizer::bpe_merge(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>& pos) const {
  std::vector<int32_t> sym;
  std::vector<PiecePos> sp;
  sym.reserve(piece.size());
  sp.reserve(piece.size());
  if (byte_level_)
    initial_symbols_bytes(piece, sym, sp);
  else
    initial_symbols_chars(piece, sym, sp);
  const int n = static_cast<int>(sym.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(sym[0]);
    pos.push_back(sp[0]);
    return;
  }
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto lookup = [&](int a, int b) -> const Merge* {
    const auto it = merges_.find((static_cast<uint64_t>(sym[a]) << 32) | static_cast<uint32_t>(sym[b]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Cand> heap_store;
  heap_store.reserve(n);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap(std::greater<Cand>(), std::move(heap_store));
  for (int i = 0; i + 1 < n; ++i)
    if (const Merge* m = lookup(i, i + 1)) heap.push({m->rank, i});
  std::vector<uint8_t> dead(n, 0);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] < 0) continue;
    const int r = next[c.pos];
    const Merge* m = lookup(c.pos, r);
    if (!m || m->rank != c.rank) continue;  // stale: a neighbour changed
    sym[c.pos] = m->new_id;
    sp[c.pos].second = sp[r].second;
    dead[r] = 1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0)
      if (const Merge* pm = lookup(prev[c.pos], c.pos)) heap.push({pm->rank, prev[c.pos]});
    if (next[c.pos] >= 0)
      if (const Merge* nm = lookup(c.pos, next[c.pos])) heap.push({nm->rank, c.pos});
  }
  for (int i = 0; i >= 0; i = next[i]) {
    out.push_back(sym[i]);
    pos.push_back(sp[i]);
  }
}

void HfBpeTokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out, std::vector<PiecePos>* pos) const {
  if (ignore_merges_) {
    const auto& v = byte_level_ ? raw_vocab_ : vocab_;
    if (const auto it = v.find(std::string(piece)); it != v.end()) {
      out.push_back(it->second);
      if (pos) pos->emplace_back(0, static_cast<uint32_t>(piece.size()));
      return;
    }
  }
  std::vector<PiecePos> local;
  std::vector<PiecePos>& p = pos ? *pos : local;
  if (piece.size() > kCacheMaxPieceBytes) {
    bpe_merge(piece, out, p);
    return;
  }
  BpeCache& cache = tl_bpe_cache;
  if (cache.owner != instance_ || cache.map.size() >= kCacheMaxEntries) {
    cache.map.clear();
    cache.pool.clear();
    cache.pos_pool.clear();
    cache.owner = instance_;
  }
  std::string key(piece);
  if (const auto it = cache.map.find(key); it != cache.map.end()) {
    const auto [off, cnt] = it->second;
    out.insert(out.end(), cache.pool.begin() + off, cache.pool.begin() + off + cnt);
    if (pos) pos->insert(pos->end(), cache.pos_pool.begin() + off, cache.pos_pool.begin() + off + cnt);
    return;
  }
  const size_t before = out.size(), pos_before = p.size();
  bpe_merge(piece, out, p);
  const auto off = static_cast<uint32_t>(cache.pool.size());
  cache.pool.insert(cache.pool.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
  cache.pos_pool.insert(cache.pos_pool.end(), p.begin() + static_cast<std::ptrdiff_t>(pos_before), p.end());
  cache.map.emplace(std::move(key), std::pair<uint32_t, uint32_t>{off, static_cast<uint32_t>(out.size() - before)});
}

void HfBpeTokenizer::encode_impl(std::string_view text, bool add_special, std::vector<int32_t>& out,
                                 std::vector<TokenSpan>* spans) const {
  if (const size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
    fail("[tokenizer] input text is not valid UTF-8: byte 0x", std::hex,
         static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at byte offset ", bad,
         " starts an invalid sequence; convert the data to UTF-8 first");
  out.reserve(text.size() / 3 + 8);
  // spans: template tokens are empty at the text's ends; an added token spans
  // its match (with the whitespace lstrip / rstrip took); BPE tokens map their
  // piece bytes through the piece's alignment.
  auto add_empty = [&](size_t n, size_t at) {
    if (spans) spans->insert(spans->end(), n, TokenSpan{at, at});
  };
  if (add_special) {
    out.insert(out.end(), prefix_.begin(), prefix_.end());
    add_empty(prefix_.size(), 0);
  }

  std::vector<Segment> raw_segs, segs;
  raw_matcher_.split(text, raw_segs);
  std::deque<std::string> storage;  // normalized text and prefixed pieces live here for this call
  std::deque<std::vector<TokenSpan>> align_storage;  // their alignments (spans only)
  std::vector<Piece> pieces;
  std::vector<PiecePos> pos;
  for (const Segment& rs : raw_segs) {
    const auto rs_begin = static_cast<size_t>(rs.text.data() - text.data());
    if (rs.added_id >= 0) {
      out.push_back(rs.added_id);
      if (spans) spans->push_back({rs_begin, rs_begin + rs.text.size()});
      continue;
    }
    std::string_view norm = rs.text;
    const TokenSpan* norm_align = nullptr;
    if (spans) {
      std::vector<TokenSpan>& a = align_storage.emplace_back();
      if (normalizer_.empty()) {
        align_identity(rs.text, rs_begin, a);
      } else {
        storage.push_back(normalizer_.apply_aligned(rs.text, rs_begin, a));
        norm = storage.back();
      }
      norm_align = a.data();
    } else if (!normalizer_.empty()) {
      storage.push_back(normalizer_.apply(rs.text));
      norm = storage.back();
    }
    segs.clear();
    normalized_matcher_.split(norm, segs);
    for (const Segment& s : segs) {
      const Piece seg{s.text, norm_align ? norm_align + (s.text.data() - norm.data()) : nullptr};
      if (s.added_id >= 0) {
        out.push_back(s.added_id);
        if (spans) spans->push_back({seg.align[0].begin, seg.align[s.text.size() - 1].end});
        continue;
      }
      pieces.clear();
      pre_tokenize(seg, rs.text.data() == text.data() && s.text.data() == norm.data(), storage, align_storage, pieces);
      for (const Piece& p : pieces) {
        if (!spans) {
          bpe_piece(p.text, out, nullptr);
          continue;
        }
        pos.clear();
        bpe_piece(p.text, out, &pos);
        for (const auto& [b, e] : pos) {
          if (b < e) {
            spans->push_back({p.align[b].begin, p.align[e - 1].end});
          } else {  // a byte-fallback token after the first of one byte: empty, where that byte ends
            const size_t at = p.align[b - 1].end;
            spans->push_back({at, at});
          }
        }
      }
    }
  }
  if (add_special) {
    out.insert(out.end(), suffix_.begin(), suffix_.end());
    add_empty(suffix_.size(), text.size());
  }
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  auto kept = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < decode_bytes_.size() && id_defined_[id] &&
           !(skip_special && id_special_[id]);
  };
  if (decoder_.only_byte_level()) {  // fast path: per-token bytes precomputed
    std::string bytes;
    for (const int32_t id : ids)
      if (kept(id)) bytes += decode_bytes_[id];
    return utf8_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids)
    if (kept(id)) tokens.push_back(id_token_[id]);
  return decoder_.apply(std::move(tokens));
}

}  // namespace

std::unique_ptr<Tokenizer> hf_bpe_tokenizer_load(const std::string& json_path, const std::string& config_path) {
  return std::make_unique<HfBpeTokenizer>(json_path, config_path);
}

}  // namespace rt
