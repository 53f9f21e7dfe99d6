// Added-token matching; see added_tokens.h.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace rt {
namespace {

// Rust's char::is_whitespace (Unicode White_Space).
bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(StripSpace space) : space_(space) {}
AddedTokenMatcher::~AddedTokenMatcher() = default;
AddedTokenMatcher::AddedTokenMatcher(AddedTokenMatcher&&) noexcept = default;
AddedTokenMatcher& AddedTokenMatcher::operator=(AddedTokenMatcher&&) noexcept = default;

// Python's str.isspace adds the separators U+001C..U+001F to White_Space.
bool AddedTokenMatcher::is_space(char32_t c) const {
  return is_white_space(c) || (space_ == StripSpace::python && c >= 0x1C && c <= 0x1F);
}

void AddedTokenMatcher::add(const AddedToken* t) {
  if (t->content.empty()) return;
  by_first_[static_cast<uint8_t>(t->content[0])].push_back(t);
  ++count_;
  if (t->single_word && !word_regex_) word_regex_ = std::make_unique<Pcre2Regex>("\\w", false, "[tokenizer] ");
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view s, size_t i) const {
  const AddedToken* best = nullptr;
  for (const AddedToken* t : by_first_[static_cast<uint8_t>(s[i])]) {
    const size_t n = t->content.size();
    if (n <= s.size() - i && (!best || n > best->content.size()) && s.compare(i, n, t->content) == 0) best = t;
  }
  return best;
}

bool AddedTokenMatcher::word_char_at(std::string_view s, size_t i) const {
  size_t j = i;
  utf8_next(s, j);
  std::vector<std::pair<size_t, size_t>> m;
  word_regex_->find_all(s.substr(i, j - i), m);
  return !m.empty();
}

// HF AddedVocabulary::find_matches. HF's \w (Rust regex) also counts
// combining marks as word characters, PCRE2's \w (letters, numbers, '_')
// does not: a single_word token right after a combining mark can differ.
void AddedTokenMatcher::split(std::string_view s, std::vector<Segment>& out) const {
  if (empty()) {
    if (!s.empty()) out.push_back({s, -1});
    return;
  }
  size_t start_offset = 0, i = 0;
  while (i < s.size()) {
    const AddedToken* t = longest_at(s, i);
    if (!t) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + t->content.size();
    i = stop;  // the next search starts after this match, kept or not
    if (t->single_word) {
      size_t before = start;
      if (before > 0) utf8_prev(s, before);
      const bool start_ok = start == 0 || !word_char_at(s, before);
      const bool stop_ok = stop == s.size() || !word_char_at(s, stop);
      if (!start_ok || !stop_ok) continue;
    }
    if (t->lstrip) {
      size_t k = start;
      while (k > 0) {
        size_t p = k;
        if (!is_space(utf8_prev(s, p))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (t->rstrip) {
      while (stop < s.size()) {
        size_t p = stop;
        if (!is_space(utf8_next(s, p))) break;
        stop = p;
      }
    }
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({s.substr(start, stop - start), t->id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
}

}  // namespace rt
