#include "data/jinja_parser.h"

#include <cmath>
#include <stdexcept>

namespace rt::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& t, const SourceMap& m) : t_(t), map_(m) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& next() { return t_[i_++]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  [[noreturn]] void fail(const std::string& msg, size_t pos) const {
    throw std::runtime_error(map_.where(pos) + ": " + msg);
  }
  [[noreturn]] void fail(const std::string& msg) const { fail(msg, cur().pos); }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "'" + got());
    ++i_;
  }
  std::string got() const {
    switch (cur().type) {
      case Tok::eof:
        return ", got the end of the template";
      case Tok::block_end:
        return ", got the end of the tag";
      case Tok::var_end:
        return ", got '}}'";
      default:
        return ", got '" + cur().text + "'";
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail("expected a name" + got());
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) fail("expected the end of the tag" + got());
    ++i_;
  }

  // Statements up to a block tag whose keyword is in `ends` (left unconsumed
  // after its keyword; *end gets the keyword). ends empty: up to eof.
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::eof) {
        if (!ends.empty()) fail("missing {% " + ends.front() + " %}: the template ended inside a block", tk.pos);
        return body;
      }
      if (tk.type == Tok::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->pos = tk.pos;
        s->text = tk.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (tk.type == Tok::var_begin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->pos = tk.pos;
        s->expr = parse_tuple_or_expr();
        if (cur().type != Tok::var_end) fail("expected '}}'" + got());
        ++i_;
        body.push_back(std::move(s));
        continue;
      }
      // block
      const size_t pos = tk.pos;
      ++i_;
      const std::string kw = cur().type == Tok::name ? cur().text : "";
      for (const std::string& e : ends)
        if (kw == e) {
          ++i_;
          *end = kw;
          return body;
        }
      body.push_back(parse_statement(pos));
    }
  }

  std::unique_ptr<Stmt> parse_statement(size_t pos) {
    Depth guard(*this, pos);
    const std::string kw = expect_name();
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    std::string end;
    if (kw == "for") {
      s->kind = Stmt::Kind::for_loop;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in the for tag" + got());
      ++i_;
      s->expr = parse_expr(/*no_cond=*/true);
      if (is_name("if")) {
        ++i_;
        s->filter = parse_expr(true);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      s->body = parse_body({"else", "endfor"}, &end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
      expect_block_end();
    } else if (kw == "if") {
      s->kind = Stmt::Kind::if_chain;
      ExprPtr cond = parse_tuple_or_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_tuple_or_expr();
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}, &end));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (kw == "set") {
      s->kind = Stmt::Kind::set;
      const size_t npos = cur().pos;
      std::string first = expect_name();
      if (is_op(".")) {
        ++i_;
        auto obj = std::make_unique<Expr>();
        obj->kind = Expr::Kind::name;
        obj->pos = npos;
        obj->name = first;
        s->target_obj = std::move(obj);
        s->targets.push_back(expect_name());
      } else {
        s->targets.push_back(first);
        while (is_op(",")) {
          ++i_;
          s->targets.push_back(expect_name());
        }
      }
      if (cur().type == Tok::block_end && !s->target_obj && s->targets.size() == 1) {
        ++i_;
        s->kind = Stmt::Kind::set_block;
        s->body = parse_body({"endset"}, &end);
        expect_block_end();
      } else {
        expect_op("=");
        s->expr = parse_tuple_or_expr();
        expect_block_end();
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Kind::macro;
      s->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++i_;
          def = parse_expr();
        }
        s->params.emplace_back(std::move(p), std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      ++i_;
      expect_block_end();
      s->body = parse_body({"endmacro"}, &end);
      if (cur().type == Tok::name) ++i_;  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Kind::brk : Stmt::Kind::cont;
      expect_block_end();
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
    } else {
      fail("unknown or unsupported tag '" + kw + "'", pos);
    }
    return s;
  }

  ExprPtr make(Expr::Kind k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  // An expression, or a bare tuple "a, b" (a list value).
  ExprPtr parse_tuple_or_expr() {
    const size_t pos = cur().pos;
    ExprPtr e = parse_expr();
    if (!is_op(",")) return e;
    auto t = make(Expr::Kind::list, pos);
    t->args.push_back(std::move(e));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tok::var_end || cur().type == Tok::block_end) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  // Nesting guard: a template nested deeper than this is refused instead of
  // overflowing the stack (real templates nest a few levels).
  struct Depth {
    Parser& p;
    explicit Depth(Parser& q, size_t pos) : p(q) {
      if (++p.depth_ > 200) p.fail("nested too deeply (more than 200 levels)", pos);
    }
    ~Depth() { --p.depth_; }
  };

  ExprPtr parse_expr(bool no_cond = false) {
    Depth guard(*this, cur().pos);
    ExprPtr e = parse_or();
    if (no_cond) return e;
    while (is_name("if")) {
      const size_t pos = cur().pos;
      ++i_;
      auto c = make(Expr::Kind::cond, pos);
      c->a = parse_or();
      c->b = std::move(e);
      if (is_name("else")) {
        ++i_;
        c->c = parse_expr();
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, size_t pos) {
    auto e = make(Expr::Kind::binary, pos);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary("or", std::move(e), parse_and(), pos);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary("and", std::move(e), parse_not(), pos);
    }
    return e;
  }
  ExprPtr parse_not() {
    Depth guard(*this, cur().pos);
    if (is_name("not")) {
      auto e = make(Expr::Kind::unary, next().pos);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const size_t pos = cur().pos;
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        const std::string op = next().text;
        e = binary(op, std::move(e), parse_math1(), pos);
      } else if (is_name("in")) {
        ++i_;
        e = binary("in", std::move(e), parse_math1(), pos);
      } else if (is_name("not") && t_[i_ + 1].type == Tok::name && t_[i_ + 1].text == "in") {
        i_ += 2;
        e = binary("not in", std::move(e), parse_math1(), pos);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.pos);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const size_t pos = next().pos;
      e = binary("~", std::move(e), parse_math2(), pos);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.pos);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const size_t pos = next().pos;
      e = binary("**", std::move(e), parse_unary(true), pos);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth guard(*this, cur().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      e = make(Expr::Kind::unary, op.pos);
      e->name = op.text;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case Tok::name: {
        ++i_;
        auto e = make(Expr::Kind::literal, tk.pos);
        if (tk.text == "true" || tk.text == "True")
          e->value = Value::boolean(true);
        else if (tk.text == "false" || tk.text == "False")
          e->value = Value::boolean(false);
        else if (tk.text == "none" || tk.text == "None")
          e->value = Value::none();
        else {
          e->kind = Expr::Kind::name;
          e->name = tk.text;
        }
        return e;
      }
      case Tok::string: {
        std::string s;
        while (cur().type == Tok::string) s += next().text;  // adjacent literals concatenate
        auto e = make(Expr::Kind::literal, tk.pos);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::integer: {
        ++i_;
        auto e = make(Expr::Kind::literal, tk.pos);
        try {
          e->value = Value::integer(std::stoll(tk.text));
        } catch (const std::exception&) {
          fail("integer literal out of range", tk.pos);
        }
        return e;
      }
      case Tok::floating: {
        ++i_;
        auto e = make(Expr::Kind::literal, tk.pos);
        try {
          e->value = Value::floating(std::stod(tk.text));
        } catch (const std::exception&) {
          e->value = Value::floating(tk.text.find('-') != std::string::npos ? 0.0 : HUGE_VAL);  // Python: inf / 0.0
        }
        return e;
      }
      case Tok::op: {
        if (tk.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return make(Expr::Kind::list, tk.pos);  // empty tuple
          }
          ExprPtr e = parse_expr();
          if (is_op(",")) {
            auto t = make(Expr::Kind::list, tk.pos);
            t->args.push_back(std::move(e));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              t->args.push_back(parse_expr());
            }
            e = std::move(t);
          }
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          ++i_;
          auto e = make(Expr::Kind::list, tk.pos);
          while (!is_op("]")) {
            e->args.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          ++i_;
          return e;
        }
        if (tk.text == "{") {
          ++i_;
          auto e = make(Expr::Kind::dict, tk.pos);
          while (!is_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          ++i_;
          return e;
        }
        break;
      }
      default:
        break;
    }
    fail("unexpected token" + got().substr(5));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::name && t_[i_ + 1].type == Tok::op && t_[i_ + 1].text == "=") {
        std::string k = next().text;
        ++i_;
        call.kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail("positional argument after a keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const size_t pos = next().pos;
        auto a = make(Expr::Kind::attr, pos);
        if (cur().type == Tok::integer) {  // foo.0 is foo[0]
          a->kind = Expr::Kind::item;
          a->b = make(Expr::Kind::literal, cur().pos);
          try {
            a->b->value = Value::integer(std::stoll(cur().text));
          } catch (const std::exception&) {
            fail("index out of range");
          }
          ++i_;
        } else {
          a->name = expect_name();
        }
        a->a = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        const size_t pos = next().pos;
        ExprPtr lo, hi, step;
        bool slice = false;
        if (!is_op(":")) lo = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++i_;
          if (!is_op("]") && !is_op(":")) hi = parse_expr();
          if (is_op(":")) {
            ++i_;
            if (!is_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        auto s = make(slice ? Expr::Kind::slice : Expr::Kind::item, pos);
        s->a = std::move(e);
        s->b = std::move(lo);
        s->c = std::move(hi);
        s->d = std::move(step);
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::call, cur().pos);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const size_t pos = next().pos;
        auto f = make(Expr::Kind::filter, pos);
        f->name = expect_name();
        while (is_op(".")) {
          ++i_;
          f->name += "." + expect_name();
        }
        f->a = std::move(e);
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const size_t pos = next().pos;
        auto t = make(Expr::Kind::test, pos);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        t->a = std::move(e);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                    cur().type == Tok::floating || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("cannot chain tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::call, cur().pos);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const SourceMap& map_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body jinja_parse(const std::vector<Token>& tokens, const SourceMap& where) { return Parser(tokens, where).parse_all(); }

}  // namespace rt::jinja
