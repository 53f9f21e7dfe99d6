#include "data/jinja_lexer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "data/jinja_value.h"

namespace rt::jinja {

SourceMap::SourceMap(std::string name, const std::string& source) : name_(std::move(name)) {
  line_starts_.push_back(0);
  for (size_t k = 0; k < source.size(); ++k)
    if (source[k] == '\n') line_starts_.push_back(k + 1);
}

std::string SourceMap::where(size_t pos) const {
  const size_t line = size_t(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  return name_ + ":" + std::to_string(line) + ":" + std::to_string(pos - line_starts_[line - 1] + 1);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

[[noreturn]] void lex_fail(const std::string& src, size_t pos, const std::string& msg) {
  throw std::runtime_error(SourceMap("", src).where(pos).substr(1) + ": " + msg);
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(const std::string& src, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) {
    if (src[k] != '\\' || k + 1 >= end) {
      out += src[k];
      continue;
    }
    const char c = src[++k];
    auto hex = [&](int n) -> uint32_t {
      if (k + size_t(n) >= end) lex_fail(src, k, "truncated \\x/\\u escape in a string");
      uint32_t v = 0;
      for (int m = 1; m <= n; ++m) {
        const char h = src[k + size_t(m)];
        v = v * 16 + uint32_t(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      k += size_t(n);
      return v;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        out += utf8_encode({hex(2)}, 0, 1);
        break;
      case 'u':
        out += utf8_encode({hex(4)}, 0, 1);
        break;
      case 'U':
        out += utf8_encode({hex(8)}, 0, 1);
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = uint32_t(c - '0');
          for (int m = 0; m < 2 && k + 1 < end && src[k + 1] >= '0' && src[k + 1] <= '7'; ++m)
            v = v * 8 + uint32_t(src[++k] - '0');
          out += utf8_encode({v}, 0, 1);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                            ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};

// Tokens of one tag from pos (just past "{{" / "{%" and its sign) up to its
// end; returns the offset just past the end marker and the trailing whitespace it eats.
size_t lex_tag(const std::string& src, size_t pos, bool block, std::vector<Token>& out) {
  const char close = block ? '%' : '}';
  int depth = 0;
  const size_t start = pos;
  while (true) {
    while (pos < src.size() && is_space(src[pos])) ++pos;
    if (pos >= src.size()) lex_fail(src, start, block ? "unclosed {% tag" : "unclosed {{ tag");
    if (depth == 0) {
      const bool minus = src[pos] == '-' && src.compare(pos + 1, 2, std::string(1, close) + "}") == 0;
      const bool plus = block && src[pos] == '+' && src.compare(pos + 1, 2, "%}") == 0;
      if (minus || plus || src.compare(pos, 2, std::string(1, close) + "}") == 0) {
        out.push_back({block ? Tok::block_end : Tok::var_end, "", pos});
        pos += minus || plus ? 3 : 2;
        if (minus) {
          while (pos < src.size() && is_space(src[pos])) ++pos;
        } else if (block && !plus && pos < src.size() && src[pos] == '\n') {
          ++pos;  // trim_blocks
        }
        return pos;
      }
    }
    const char c = src[pos];
    if (is_name_start(c)) {
      size_t e = pos;
      while (e < src.size() && is_name_char(src[e])) ++e;
      out.push_back({Tok::name, src.substr(pos, e - pos), pos});
      pos = e;
    } else if (is_digit(c)) {
      size_t e = pos;
      while (e < src.size() && (is_digit(src[e]) || src[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < src.size() && src[e] == '.' && is_digit(src[e + 1])) {
        is_float = true;
        ++e;
        while (e < src.size() && (is_digit(src[e]) || src[e] == '_')) ++e;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t x = e + 1;
        if (x < src.size() && (src[x] == '+' || src[x] == '-')) ++x;
        if (x < src.size() && is_digit(src[x])) {
          is_float = true;
          e = x;
          while (e < src.size() && is_digit(src[e])) ++e;
        }
      }
      std::string num = src.substr(pos, e - pos);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      out.push_back({is_float ? Tok::floating : Tok::integer, num, pos});
      pos = e;
    } else if (c == '\'' || c == '"') {
      size_t e = pos + 1;
      while (e < src.size() && src[e] != c) e += src[e] == '\\' ? 2 : 1;
      if (e >= src.size()) lex_fail(src, pos, "unclosed string literal");
      out.push_back({Tok::string, unescape(src, pos + 1, e), pos});
      pos = e + 1;
    } else {
      const char* op = nullptr;
      for (const char* o : kOps)
        if (src.compare(pos, std::strlen(o), o) == 0) {
          op = o;
          break;
        }
      if (!op) lex_fail(src, pos, std::string("unexpected character '") + c + "'");
      if (*op == '(' || *op == '[' || *op == '{') ++depth;
      if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
      out.push_back({Tok::op, op, pos});
      pos += std::strlen(op);
    }
  }
}

}  // namespace

std::vector<Token> jinja_lex(const std::string& raw, std::string* normalized) {
  std::string src;
  src.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\r') {
      src += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    } else {
      src += raw[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline=False
  std::vector<Token> out;
  size_t pos = 0;
  while (pos < src.size()) {
    size_t tag = pos;
    while (true) {
      tag = src.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src.size()) {
        tag = std::string::npos;
        break;
      }
      const char n = src[tag + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++tag;
    }
    if (tag == std::string::npos) {
      out.push_back({Tok::text, src.substr(pos), pos});
      break;
    }
    const char kind = src[tag + 1];
    const char sign = tag + 2 < src.size() ? src[tag + 2] : 0;
    std::string text = src.substr(pos, tag - pos);
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && kind != '{') {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      const bool line_starting = pos == 0 || src[pos - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          std::all_of(text.begin() + long(l_pos), text.end(), [](char c) { return is_space(c); }))
        text.resize(l_pos);
    }
    if (!text.empty()) out.push_back({Tok::text, std::move(text), pos});
    const size_t body = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
    if (kind == '#') {
      size_t e = src.find("#}", body);
      if (e == std::string::npos) lex_fail(src, tag, "unclosed comment {#");
      const char before = e > body ? src[e - 1] : 0;
      pos = e + 2;
      if (before == '-') {
        while (pos < src.size() && is_space(src[pos])) ++pos;
      } else if (before != '+' && pos < src.size() && src[pos] == '\n') {
        ++pos;
      }
      continue;
    }
    const bool block = kind == '%';
    out.push_back({block ? Tok::block_begin : Tok::var_begin, "", tag});
    pos = lex_tag(src, body, block, out);
  }
  out.push_back({Tok::eof, "", src.size()});
  if (normalized) *normalized = std::move(src);
  return out;
}

}  // namespace rt::jinja
