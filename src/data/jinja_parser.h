// Syntax tree and parser of the Jinja subset (data/jinja_template.h), with
// jinja2's operator precedence: if-else < or < and < not < comparisons and
// `in` < + - < ~ < * / // % < ** < unary - + < postfix (. [] () | is).
// Statements: for (tuple targets, `if` filter, else), if/elif/else, set
// (names, tuples, ns.attr, block set), macro, break/continue, and
// transformers' {% generation %} (rendered as its body).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/jinja_lexer.h"
#include "data/jinja_value.h"

namespace rt::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { literal, name, attr, item, slice, call, filter, test, unary, binary, cond, list, dict };
  Kind kind;
  size_t pos = 0;
  Value value;                // literal
  std::string name;           // name, attr, filter/test name, unary/binary operator
  ExprPtr a, b, c, d;         // operands: attr/item/slice/call/filter/test target a; item index b;
                              // slice a[b:c:d]; binary a op b; cond: b if a else c; unary a
  std::vector<ExprPtr> args;  // call/filter/test positional args; list items; dict keys and values interleaved
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // test: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind { text, output, for_loop, if_chain, set, set_block, macro, brk, cont, generation };
  Kind kind;
  size_t pos = 0;
  std::string text;                                     // text
  ExprPtr expr;                                         // output; for: iterable; set: value
  ExprPtr filter;                                       // for: the `if` condition
  std::vector<std::string> targets;                     // for / set: names (several: tuple unpacking)
  ExprPtr target_obj;                                   // set ns.attr: the object expression, attribute in targets[0]
  std::vector<std::pair<ExprPtr, Body>> branches;       // if/elif: (condition, body); else: (nullptr, body)
  Body body, else_body;                                 // for, set_block, macro, generation
  std::string name;                                     // macro
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults (nullptr: none)
};

// Parses tokens from jinja_lex; throws std::runtime_error "POS: message" via
// the source map.
Body jinja_parse(const std::vector<Token>& tokens, const SourceMap& where);

}  // namespace rt::jinja
