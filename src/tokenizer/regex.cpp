// PCRE2 wrapper; see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace rt {

std::string regex_onig_compatible(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      if (n == 's') {
        out += in_class ? "\\t-\\r\\x{85}\\p{Z}" : "[\\t-\\r\\x{85}\\p{Z}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\t-\\r\\x{85}\\p{Z}]";
      } else if (n == 'Q') {  // \Q...\E: copy verbatim
        const size_t e = p.find("\\E", i + 1);
        const size_t stop = e == std::string_view::npos ? p.size() : e + 2;
        out += "\\Q";
        out.append(p.substr(i + 1, stop - (i + 1)));
        i = stop - 1;
      } else {
        out += '\\';
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t e = p.find(":]", i + 2);
      if (e != std::string_view::npos) {
        out.append(p.substr(i, e + 2 - i));
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Pcre2Regex::Pcre2Regex(const std::string& pattern, bool literal, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  const std::string src = literal ? pattern : regex_onig_compatible(pattern);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(src.data()), src.size(), opts, &err, &off, nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(where, "cannot compile split regex /", pattern, "/ with PCRE2 at offset ", off, ": ",
         reinterpret_cast<const char*>(msg), ". The tokenizer file may use a regex feature PCRE2 lacks.");
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Pcre2Regex::~Pcre2Regex() {
  if (code_) pcre2_code_free(code_);
}

void Pcre2Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
  RT_CHECK(md, where_, "out of memory creating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos < s.size()) {
    int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                  : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // very long match: the interpreter keeps its frames on the heap
      rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail(where_, "PCRE2 match failed: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one character
      pos = b + 1;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
}

}  // namespace rt
