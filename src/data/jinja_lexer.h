// Lexer of the Jinja subset: splits a template into text and tag tokens with
// the whitespace rules of the environment transformers renders chat
// templates in (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline
// False), exactly as jinja2's lexer applies them:
//   - "\r\n" and "\r" become "\n"; one trailing newline of the source is dropped;
//   - {%- / {{- / {#- strip all whitespace before the tag, -%} / -}} / -#} all after;
//   - lstrip_blocks: spaces and tabs between a line start and {% or {# are
//     dropped (not before {{, not with {%+);
//   - trim_blocks: the first newline after %} or #} is dropped (not with +%}).
// Comments vanish. Inside tags the expression is split into names, numbers,
// strings (Python escapes) and operators; "}}" / "%}" inside open brackets
// are operators, as in jinja2.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rt::jinja {

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;  // text: the data; string: the unescaped value; name/op/number: the spelling
  size_t pos = 0;    // byte offset in the normalized source
};

class SourceMap {
 public:
  SourceMap(std::string name, const std::string& source);
  // "NAME:LINE:COL" of byte offset pos.
  std::string where(size_t pos) const;

 private:
  std::string name_;
  std::vector<size_t> line_starts_;
};

// Normalizes newlines and tokenizes; throws std::runtime_error with
// "LINE:COL: message" for an unclosed tag, comment or string.
std::vector<Token> jinja_lex(const std::string& source, std::string* normalized);

}  // namespace rt::jinja
