// Added tokens (special tokens and tokens added to a vocabulary) found inside
// text before the tokenizer proper runs, as HF does it for tokenizer.json
// (tokenizers' AddedVocabulary) and for SentencePiece models (transformers
// splits the text on its added tokens first, then encodes the pieces).
// Matching is leftmost-longest over literal strings; single_word matches
// touching a word character are dropped; lstrip / rstrip widen a match over
// neighbouring whitespace (the whitespace disappears from the text).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rt {

class Pcre2Regex;

struct AddedToken {
  std::string content;  // as matched against the text (normalized when normalized is set)
  int32_t id;
  bool special, single_word, lstrip, rstrip, normalized;
};

// A piece of text on its way through the pipeline: either an added token
// already resolved to an id, or text still to be tokenized.
struct Segment {
  std::string_view text;
  int32_t added_id;  // -1 when text
};

// Which characters lstrip/rstrip eat.
enum class StripSpace { rust, python };  // Rust char::is_whitespace (tokenizers) / Python str.isspace (transformers)

// Leftmost-longest matcher over a small set of literal strings. The tokens
// must outlive the matcher (it keeps pointers).
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(StripSpace space = StripSpace::rust);
  ~AddedTokenMatcher();
  AddedTokenMatcher(AddedTokenMatcher&&) noexcept;
  AddedTokenMatcher& operator=(AddedTokenMatcher&&) noexcept;

  void add(const AddedToken* t);
  bool empty() const { return count_ == 0; }
  // Splits s into text and added-token segments (views into s), appended to out.
  void split(std::string_view s, std::vector<Segment>& out) const;

 private:
  const AddedToken* longest_at(std::string_view s, size_t i) const;
  bool word_char_at(std::string_view s, size_t i) const;
  bool is_space(char32_t c) const;

  StripSpace space_;
  size_t count_ = 0;
  std::vector<const AddedToken*> by_first_[256];
  std::unique_ptr<Pcre2Regex> word_regex_;  // only when a token is single_word
};

}  // namespace rt
