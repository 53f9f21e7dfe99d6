// The interpreter of data/jinja_template.h: walks the syntax tree with a
// stack of scopes and appends to one output string.
#include <map>
#include <stdexcept>

#include "core/error.h"
#include "data/jinja_builtins.h"
#include "data/jinja_template.h"

namespace rt::jinja {

namespace {

// A runtime error that already knows where in the template it happened.
struct PositionedError : std::runtime_error {
  PositionedError(const std::string& m, size_t p) : std::runtime_error(m), pos(p) {}
  size_t pos;
};

enum class Flow { normal, brk, cont };

class Interp {
 public:
  explicit Interp(std::shared_ptr<Object> globals) { scopes_.push_back(std::move(globals)); }

  void push_scope(std::shared_ptr<Object> s) { scopes_.push_back(std::move(s)); }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec_one(*s, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const Value* v = (*it)->find(name)) return *v;
    return Value::undefined(name);
  }

  void assign(const std::vector<std::string>& targets, const Value& v, Object& scope) {
    if (targets.size() == 1) {
      scope.set(targets[0], v);
      return;
    }
    const Array items = iterate(v);
    if (items.size() != targets.size())
      throw std::runtime_error("cannot unpack " + std::to_string(items.size()) + " values into " +
                               std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scope.set(targets[k], items[k]);
  }

  Flow exec_one(const Stmt& s, std::string& out) {
    try {
      switch (s.kind) {
        case Stmt::Kind::text:
          out += s.text;
          return Flow::normal;
        case Stmt::Kind::output:
          out += to_str(eval(*s.expr));
          return Flow::normal;
        case Stmt::Kind::if_chain:
          for (const auto& [cond, body] : s.branches)
            if (!cond || truthy(eval(*cond))) return exec(body, out);
          return Flow::normal;
        case Stmt::Kind::for_loop:
          exec_for(s, out);
          return Flow::normal;
        case Stmt::Kind::set: {
          const Value v = eval(*s.expr);
          if (s.target_obj) {
            const Value obj = eval(*s.target_obj);
            if (!obj.is_object() || !obj.obj->is_namespace)
              throw std::runtime_error("cannot assign attribute '" + s.targets[0] + "' on a " + kind_name(obj) +
                                       ": only a namespace() takes `set x.attr = ...`");
            obj.obj->set(s.targets[0], v);
          } else {
            assign(s.targets, v, *scopes_.back());
          }
          return Flow::normal;
        }
        case Stmt::Kind::set_block: {
          std::string captured;
          exec(s.body, captured);
          scopes_.back()->set(s.targets[0], Value::string(std::move(captured)));
          return Flow::normal;
        }
        case Stmt::Kind::macro:
          scopes_.back()->set(s.name, make_macro(s));
          return Flow::normal;
        case Stmt::Kind::brk:
          return Flow::brk;
        case Stmt::Kind::cont:
          return Flow::cont;
        case Stmt::Kind::generation:
          return exec(s.body, out);
      }
    } catch (const PositionedError&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw PositionedError(e.what(), s.pos);
    }
    return Flow::normal;
  }

  void exec_for(const Stmt& s, std::string& out) {
    Array all = iterate(eval(*s.expr));
    if (s.filter) {
      Array kept;
      for (const Value& item : all) {
        auto scope = std::make_shared<Object>();
        assign(s.targets, item, *scope);
        scopes_.push_back(scope);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      all = std::move(kept);
    }
    if (all.empty()) {
      exec(s.else_body, out);
      return;
    }
    const int64_t n = int64_t(all.size());
    for (int64_t k = 0; k < n; ++k) {
      if (++iterations_ > kMaxIterations)
        throw std::runtime_error("the template ran more than 10000000 loop iterations; refusing to go on");
      auto scope = std::make_shared<Object>();
      Object loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(n - k));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? all[size_t(k - 1)] : Value::undefined("loop.previtem"));
      loop.set("nextitem", k + 1 < n ? all[size_t(k + 1)] : Value::undefined("loop.nextitem"));
      loop.set("cycle", Value::function([k](CallArgs& a) -> Value {
                 if (a.pos.empty()) throw std::runtime_error("loop.cycle() needs at least one argument");
                 return a.pos[size_t(k) % a.pos.size()];
               }));
      scope->set("loop", Value::object(std::move(loop)));
      assign(s.targets, all[size_t(k)], *scope);
      scopes_.push_back(scope);
      Flow f;
      try {
        f = exec(s.body, out);
      } catch (...) {
        scopes_.pop_back();
        throw;
      }
      scopes_.pop_back();
      if (f == Flow::brk) break;
    }
  }

  Value make_macro(const Stmt& s) {
    const Stmt* def = &s;
    // Weak: the macro value is stored in the module scope it captures, and a
    // shared capture would be a reference cycle (a leak per rendered macro).
    std::weak_ptr<Object> top_w = scopes_.front();
    std::weak_ptr<Object> module_w = scopes_.size() > 1 ? scopes_[1] : scopes_.front();
    return Value::function([this, def, top_w, module_w](CallArgs& a) -> Value {
      const std::shared_ptr<Object> top = top_w.lock(), module = module_w.lock();
      if (!top || !module) throw std::runtime_error("macro '" + def->name + "' called after its template finished");
      if (macro_depth_ >= 100) throw std::runtime_error("macro '" + def->name + "' recursed more than 100 levels deep");
      struct DepthGuard {
        int& d;
        explicit DepthGuard(int& x) : d(x) { ++d; }
        ~DepthGuard() { --d; }
      } depth(macro_depth_);
      auto scope = std::make_shared<Object>();
      if (a.pos.size() > def->params.size())
        throw std::runtime_error("macro '" + def->name + "' takes " + std::to_string(def->params.size()) +
                                 " arguments, got " + std::to_string(a.pos.size()));
      for (size_t k = 0; k < def->params.size(); ++k) {
        const auto& [pname, pdef] = def->params[k];
        Value v = a.get(k, pname.c_str(), Value::undefined("__missing__"));
        if (v.is_undefined() && v.s == "__missing__") v = pdef ? eval(*pdef) : Value::undefined(pname);
        scope->set(pname, v);
      }
      for (const auto& [k, v] : a.kw) {
        bool known = false;
        for (const auto& p : def->params) known |= p.first == k;
        if (!known) throw std::runtime_error("macro '" + def->name + "' has no parameter '" + k + "'");
      }
      std::vector<std::shared_ptr<Object>> saved;
      saved.swap(scopes_);
      scopes_ = {top};
      if (module != top) scopes_.push_back(module);
      scopes_.push_back(scope);
      std::string out;
      try {
        exec(def->body, out);
      } catch (...) {
        scopes_.swap(saved);
        throw;
      }
      scopes_.swap(saved);
      return Value::string(std::move(out));
    });
  }

  CallArgs eval_args(const Expr& e, std::string where) {
    CallArgs a;
    a.where = std::move(where);
    for (const auto& x : e.args) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  [[noreturn]] static void undefined_fail(const Value& v) {
    throw std::runtime_error(v.s.empty()           ? "value is undefined"
                             : v.s.front() == '\'' ? v.s
                                                   : "'" + v.s + "' is undefined");
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const PositionedError&) {
      throw;
    } catch (const std::runtime_error& err) {
      throw PositionedError(err.what(), e.pos);
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal:
        return e.value;
      case Expr::Kind::name:
        return lookup(e.name);
      case Expr::Kind::attr: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) undefined_fail(obj);
        return attr_get(obj, e.name);
      }
      case Expr::Kind::item: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) undefined_fail(obj);
        return item_get(obj, eval(*e.b));
      }
      case Expr::Kind::slice: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) undefined_fail(obj);
        return slice_get(obj, e.b ? eval(*e.b) : Value::none(), e.c ? eval(*e.c) : Value::none(),
                         e.d ? eval(*e.d) : Value::none());
      }
      case Expr::Kind::call: {
        const Value fn = eval(*e.a);
        if (fn.is_undefined()) undefined_fail(fn);
        if (!fn.is_function()) throw std::runtime_error(std::string("'") + kind_name(fn) + "' object is not callable");
        CallArgs a = eval_args(e, "call");
        return (*fn.fn)(a);
      }
      case Expr::Kind::filter: {
        const Value v = eval(*e.a);
        CallArgs a = eval_args(e, "filter " + e.name);
        return filter_apply(e.name, v, a);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.a);
        CallArgs a = eval_args(e, "test " + e.name);
        return Value::boolean(test_apply(e.name, v, a) != e.negated);
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.kind == Value::Kind::integer && v.i == INT64_MIN && e.name == "-")
          throw std::runtime_error("integer overflow in unary '-'");
        if (v.kind == Value::Kind::integer || v.kind == Value::Kind::boolean)
          return Value::integer(e.name == "-" ? -(v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i)
                                              : (v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i));
        if (v.kind == Value::Kind::floating) return Value::floating(e.name == "-" ? -v.f : v.f);
        if (v.is_undefined()) undefined_fail(v);
        throw std::runtime_error(std::string("bad operand type for unary ") + e.name + ": '" + kind_name(v) + "'");
      }
      case Expr::Kind::binary: {
        if (e.name == "and") {
          Value a = eval(*e.a);
          return truthy(a) ? eval(*e.b) : a;
        }
        if (e.name == "or") {
          Value a = eval(*e.a);
          return truthy(a) ? a : eval(*e.b);
        }
        const Value a = eval(*e.a), b = eval(*e.b);
        return binary_apply(e.name, a, b);
      }
      case Expr::Kind::cond:
        if (truthy(eval(*e.a))) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined("the else branch");
      case Expr::Kind::list: {
        Array a;
        for (const auto& x : e.args) a.push_back(eval(*x));
        return Value::array(std::move(a));
      }
      case Expr::Kind::dict: {
        Object o;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (!key.is_string()) throw std::runtime_error("dict literal keys must be strings here");
          o.set(key.s, eval(*e.args[k + 1]));
        }
        return Value::object(std::move(o));
      }
    }
    return Value::undefined();
  }

  std::vector<std::shared_ptr<Object>> scopes_;
  int macro_depth_ = 0;
  static constexpr int64_t kMaxIterations = 10000000;  // per render: chat templates loop over messages
  int64_t iterations_ = 0;
};

}  // namespace

Template::Template(const std::string& source, std::string name) : name_(std::move(name)) {
  try {
    const std::vector<Token> tokens = jinja_lex(source, &source_);
    map_ = std::make_unique<SourceMap>(name_, source_);
    body_ = jinja_parse(tokens, *map_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    // lexer errors carry "LINE:COL: ..." without the name; parser errors carry the name
    fail("[template] ", msg.rfind(name_ + ":", 0) == 0 ? "" : name_ + ":", msg);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Object& vars) const {
  auto globals = std::make_shared<Object>();
  add_globals(
      *globals, clock_ ? clock_ : [] { return std::time(nullptr); });
  Interp interp(globals);
  // the template's variables live in a scope above the globals, as in jinja2's context
  interp.push_scope(std::make_shared<Object>(vars));
  std::string out;
  try {
    interp.exec(body_, out);
  } catch (const PositionedError& e) {
    fail("[template] ", map_->where(e.pos), ": ", e.what());
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // e.g. std::out_of_range from a numeric conversion
    fail("[template] ", name_, ": ", e.what());
  }
  return out;
}

}  // namespace rt::jinja
