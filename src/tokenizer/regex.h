// PCRE2 split regexes for the tokenizers: compiled once in UTF + UCP mode
// (JIT when the library has it), shared read-only between threads.
// HF tokenizers runs these patterns with Oniguruma, whose Unicode \s is
// U+0009-000D, U+0085 and \p{Z}; PCRE2's (UCP) also matches U+180E.
// regex_onig_compatible() spells \s / \S out as Oniguruma's set so both
// engines split identically. Matching is leftmost-first with backtracking in
// both engines.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace rt {

// Rewrites \s to [\t-\r\x{85}\p{Z}] and \S to [^\t-\r\x{85}\p{Z}]; inside a
// class \s becomes \t-\r\x{85}\p{Z}. \S inside a class stays PCRE2's (it then
// differs at U+180E only; no HF pattern uses it).
std::string regex_onig_compatible(std::string_view pattern);

class Pcre2Regex {
 public:
  // where: the "[where]" prefix for errors (names the file holding the pattern).
  // literal: match the pattern as a plain string.
  Pcre2Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Appends the [begin, end) byte ranges of all non-empty, non-overlapping
  // matches in s, left to right. s must be valid UTF-8 (not re-checked).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  bool jit() const { return jit_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string where_;
};

}  // namespace rt
