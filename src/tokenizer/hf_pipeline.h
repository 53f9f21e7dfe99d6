// The normalizer and decoder stages of a HF tokenizer.json, as step lists
// parsed from the JSON and applied in order (hf_bpe.cpp runs them).
//   normalizers: NFC, Prepend (non-empty text only), Replace (String or Regex
//                pattern, every match), Sequence of those.
//   decoders:    ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
//                Sequence of those; they transform the list of token strings
//                as HF's decode_chain does, and the results are concatenated.
// Anything else is refused with an rt::Error naming the part and what is
// supported.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"

namespace rt {

class Normalizer {
 public:
  // n: the "normalizer" value (null: none). where: "[tokenizer FILE] ".
  void parse(const nlohmann::json& n, const std::string& where);
  bool empty() const { return steps_.empty(); }
  bool empty_or_nfc() const;  // no step but NFC (which works per character cluster, never across a '\n')
  std::string apply(std::string_view s) const;
  // apply() plus, per byte of the result, the bytes of s (offset by base) it
  // came from, as HF's NormalizedString alignments: every byte of a character
  // carries that character's span; a prepended text takes the span of the
  // first character; a replacement, the span of what it replaced; NFC, the
  // span of the run it recomposed (a run starts at each ASCII character,
  // which never composes with what precedes it).
  std::string apply_aligned(std::string_view s, size_t base, std::vector<TokenSpan>& align) const;

 private:
  struct Step {
    enum class Kind { nfc, prepend, replace } kind;
    std::string text;                   // prepend: the prefix; replace: the literal pattern
    std::string content;                // replace: the replacement
    std::unique_ptr<Pcre2Regex> regex;  // replace with a Regex pattern
  };
  std::vector<Step> steps_;
};

class Decoder {
 public:
  // d: the "decoder" value (null: none, tokens joined by spaces as HF does).
  void parse(const nlohmann::json& d, const std::string& where);
  bool null() const { return null_; }
  // Exactly one ByteLevel step (the byte-level fast path applies).
  bool only_byte_level() const { return steps_.size() == 1 && steps_[0].kind == Step::Kind::byte_level; }
  // tokens: the token strings as the file spells them. Returns UTF-8 text.
  std::string apply(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind;
    std::string text, content;          // replace: pattern (literal) and replacement
    std::unique_ptr<Pcre2Regex> regex;  // replace with a Regex pattern
    char32_t strip_char = 0;            // strip
    size_t start = 0, stop = 0;         // strip
    bool prepend_first = true;          // metaspace: prepend scheme not "never" (the first token's are dropped)
  };
  std::vector<Step> steps_;
  bool null_ = false;
};

// align for s: each byte gets the span [base + first byte, base + end) of its character.
void align_identity(std::string_view s, size_t base, std::vector<TokenSpan>& align);
// replace_all, carrying align (one entry per byte of s in, of the result out).
std::string replace_all_aligned(std::string_view s, const std::string& literal, const Pcre2Regex* regex,
                                const std::string& content, std::vector<TokenSpan>& align);

// Replaces every non-overlapping occurrence of a literal (or regex) pattern.
std::string replace_all(std::string_view s, const std::string& literal, const Pcre2Regex* regex,
                        const std::string& content);

}  // namespace rt
