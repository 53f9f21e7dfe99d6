#include "data/jinja_builtins.h"
#include "data/jinja_pyops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace rt::jinja {

[[noreturn]] void type_fail(const std::string& what, const Value& v) {
  throw std::runtime_error(what + " got a value of type '" + kind_name(v) + "'");
}

// Python str.isspace() for one code point.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) type_fail(std::string(what) + " expects a string but", v);
  return v.s;
}

int64_t need_int(const Value& v, const char* what) {
  if (v.kind == Value::Kind::integer) return v.i;
  if (v.kind == Value::Kind::boolean) return v.b;
  type_fail(std::string(what) + " expects an integer but", v);
}

// Python str.strip/lstrip/rstrip; chars = None strips whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<uint32_t> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_decode(need_str(chars, "strip"));
  auto strip_it = [&](uint32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(cps, b, e);
}

Array py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_none() || sep.is_undefined()) {
    const std::vector<uint32_t> cps = utf8_decode(s);
    size_t k = 0;
    while (true) {
      while (k < cps.size() && py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && py_space(cps[e - 1])) --e;
        out.push_back(Value::string(utf8_encode(cps, k, e)));
        break;
      }
      size_t e = k;
      while (e < cps.size() && !py_space(cps[e])) ++e;
      out.push_back(Value::string(utf8_encode(cps, k, e)));
      k = e;
    }
    return out;
  }
  const std::string& d = need_str(sep, "split");
  if (d.empty()) throw std::runtime_error("split: empty separator");
  size_t k = 0;
  while (true) {
    const size_t f = s.find(d, k);
    if (f == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(k)));
      return out;
    }
    out.push_back(Value::string(s.substr(k, f - k)));
    k = f + d.size();
  }
}

std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  std::string out;
  size_t k = 0;
  int64_t n = 0;
  if (a.empty()) {  // Python inserts b between every character
    const std::vector<uint32_t> cps = utf8_decode(s);
    for (size_t c = 0; c <= cps.size(); ++c) {
      if (count < 0 || n < count) {
        out += b;
        ++n;
      }
      if (c < cps.size()) out += utf8_encode(cps, c, c + 1);
    }
    return out;
  }
  while (true) {
    const size_t f = s.find(a, k);
    if (f == std::string::npos || (count >= 0 && n >= count)) break;
    out += s.substr(k, f - k) + b;
    k = f + a.size();
    ++n;
  }
  return out + s.substr(k);
}

std::string py_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out = s;
  bool prev_cased = false;
  for (size_t k = 0; k < out.size(); ++k) {
    char& c = out[k];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    bool up = false;
    if (mode == 1)
      up = true;
    else if (mode == 2)
      up = !prev_cased;
    else if (mode == 3)
      up = k == 0;
    if (alpha) c = up ? char(c & ~0x20) : char(c | 0x20);
    prev_cased = alpha || (static_cast<unsigned char>(c) >= 0x80);  // non-ASCII letters count as cased
  }
  return out;
}

static bool starts_or_ends(const std::string& s, const Value& arg, bool start) {
  auto one = [&](const Value& p) {
    const std::string& x = need_str(p, start ? "startswith" : "endswith");
    return x.size() <= s.size() &&
           (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (arg.is_array()) {
    for (const Value& p : *arg.arr)
      if (one(p)) return true;
    return false;
  }
  return one(arg);
}

static Value str_method(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "startswith") return Value::boolean(starts_or_ends(s, a.get(0, "prefix"), true));
  if (name == "endswith") return Value::boolean(starts_or_ends(s, a.get(0, "suffix"), false));
  if (name == "strip") return Value::string(py_strip(s, a.get(0, "chars", Value::none()), true, true));
  if (name == "lstrip") return Value::string(py_strip(s, a.get(0, "chars", Value::none()), true, false));
  if (name == "rstrip") return Value::string(py_strip(s, a.get(0, "chars", Value::none()), false, true));
  if (name == "split") {
    const Value m = a.get(1, "maxsplit", Value::integer(-1));
    return Value::array(py_split(s, a.get(0, "sep", Value::none()), need_int(m, "split")));
  }
  if (name == "rsplit" && a.pos.size() + a.kw.size() <= 1)
    return Value::array(py_split(s, a.get(0, "sep", Value::none()), -1));
  if (name == "splitlines") {
    Array out;
    size_t k = 0;
    while (k < s.size()) {
      size_t e = s.find('\n', k);
      if (e == std::string::npos) e = s.size();
      std::string line = s.substr(k, e - k);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      out.push_back(Value::string(line));
      k = e + 1;
    }
    return Value::array(std::move(out));
  }
  if (name == "lower") return Value::string(py_case(s, 0));
  if (name == "upper") return Value::string(py_case(s, 1));
  if (name == "title") return Value::string(py_case(s, 2));
  if (name == "capitalize") return Value::string(py_case(py_case(s, 0), 3));
  if (name == "replace") {
    return Value::string(py_replace(s, need_str(a.get(0, "old"), "replace"), need_str(a.get(1, "new"), "replace"),
                                    need_int(a.get(2, "count", Value::integer(-1)), "replace")));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string& x = need_str(a.get(0, "sub"), name.c_str());
    if (name == "count") {
      if (x.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t k = s.find(x); k != std::string::npos; k = s.find(x, k + x.size())) ++n;
      return Value::integer(n);
    }
    const size_t f = name == "rfind" ? s.rfind(x) : s.find(x);
    if (f == std::string::npos) {
      if (name == "index") throw std::runtime_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(utf8_length(s.substr(0, f))));
  }
  if (name == "join") {
    std::string out;
    const Array items = iterate(a.get(0, "iterable"));
    for (size_t k = 0; k < items.size(); ++k) out += (k ? s : "") + need_str(items[k], "join");
    return Value::string(out);
  }
  auto all_of = [&](auto pred) {
    const std::vector<uint32_t> cps = utf8_decode(s);
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
  };
  if (name == "isdigit") return all_of([](uint32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all_of([](uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; });
  if (name == "isalnum")
    return all_of([](uint32_t c) { return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all_of(py_space);
  if (name == "islower") return Value::boolean(py_case(s, 0) == s && py_case(s, 1) != s);
  if (name == "isupper") return Value::boolean(py_case(s, 1) == s && py_case(s, 0) != s);
  throw std::runtime_error("str has no method '" + name + "' in this renderer");
}

static bool is_str_method(const std::string& n) {
  static const char* const names[] = {"startswith", "endswith",   "strip",   "lstrip",  "rstrip",  "split",
                                      "rsplit",     "splitlines", "lower",   "upper",   "title",   "capitalize",
                                      "replace",    "find",       "rfind",   "index",   "count",   "join",
                                      "isdigit",    "isalpha",    "isalnum", "isspace", "islower", "isupper"};
  return std::find_if(std::begin(names), std::end(names), [&](const char* x) { return n == x; }) != std::end(names);
}

static Value bound(Value self, std::string name, Value (*fn)(const Value&, const std::string&, CallArgs&)) {
  return Value::function([self, name, fn](CallArgs& a) { return fn(self, name, a); });
}

Value items_of(const Object& o) {
  Array out;
  for (const auto& [k, v] : o.items) out.push_back(Value::array({Value::string(k), v}));
  return Value::array(std::move(out));
}

static Value dict_method(const Value& self, const std::string& name, CallArgs& a) {
  const Object& o = *self.obj;
  if (name == "get") {
    const Value key = a.get(0, "key");
    const Value* v = key.is_string() ? o.find(key.s) : nullptr;
    return v ? *v : a.get(1, "default", Value::none());
  }
  if (name == "items") return items_of(o);
  Array out;
  for (const auto& [k, v] : o.items) out.push_back(name == "keys" ? Value::string(k) : v);
  return Value::array(std::move(out));
}

static Value list_method(const Value& self, const std::string& name, CallArgs& a) {
  const Value x = a.get(0, "value");
  int64_t n = 0;
  for (size_t k = 0; k < self.arr->size(); ++k) {
    if (equals((*self.arr)[k], x)) {
      if (name == "index") return Value::integer(int64_t(k));
      ++n;
    }
  }
  if (name == "index") throw std::runtime_error(to_repr(x) + " is not in list");
  return Value::integer(n);
}

static Value str_bound(const Value& self, const std::string& name, CallArgs& a) { return str_method(self.s, name, a); }

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string:
      return int64_t(utf8_length(v.s));
    case Value::Kind::array:
      return int64_t(v.arr->size());
    case Value::Kind::object:
      return int64_t(v.obj->items.size());
    case Value::Kind::undefined:
      return 0;
    default:
      type_fail("length", v);
  }
}

// An attribute path "a.b" of v (map/selectattr/sort/join attribute=).
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t k = 0;
  while (k <= path.size()) {
    size_t e = path.find('.', k);
    if (e == std::string::npos) e = path.size();
    const std::string part = path.substr(k, e - k);
    cur = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })
              ? item_get(cur, Value::integer(std::stoll(part)))
              : item_get(cur, Value::string(part));
    k = e + 1;
  }
  return cur;
}

Array select_items(const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  Array out;
  const size_t first = by_attr ? 1 : 0;
  const std::string attr = by_attr ? need_str(a.get(0, "attribute"), "selectattr") : "";
  const Value test = a.pos.size() > first ? a.pos[first] : Value::undefined();
  for (const Value& item : iterate(seq)) {
    const Value v = by_attr ? attr_path(item, attr) : item;
    bool ok;
    if (test.is_undefined()) {
      ok = truthy(v);
    } else {
      CallArgs ta;
      ta.pos.assign(a.pos.begin() + long(first) + 1, a.pos.end());
      ok = test_apply(need_str(test, "select test name"), v, ta);
    }
    if (ok == keep) out.push_back(item);
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Array iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
      return {};
    case Value::Kind::array:
      return *v.arr;
    case Value::Kind::object: {
      Array keys;
      for (const auto& [k, x] : v.obj->items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::string: {
      Array chars;
      const std::vector<uint32_t> cps = utf8_decode(v.s);
      for (size_t k = 0; k < cps.size(); ++k) chars.push_back(Value::string(utf8_encode(cps, k, k + 1)));
      return chars;
    }
    default:
      throw std::runtime_error(std::string("'") + kind_name(v) + "' object is not iterable");
  }
}

Value attr_get(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::object:
      if (!obj.obj->is_namespace && (name == "get" || name == "items" || name == "keys" || name == "values"))
        return bound(obj, name, dict_method);
      if (const Value* v = obj.obj->find(name)) return *v;
      return Value::undefined("'" + std::string(obj.obj->is_namespace ? "Namespace" : "dict object") +
                              "' has no attribute '" + name + "'");
    case Value::Kind::string:
      if (is_str_method(name)) return bound(obj, name, str_bound);
      break;
    case Value::Kind::array:
      if (name == "index" || name == "count") return bound(obj, name, list_method);
      break;
    default:
      break;
  }
  std::string msg = "'";
  msg.append(kind_name(obj)).append(" object' has no attribute '").append(name).append("'");
  return Value::undefined(std::move(msg));
}

Value item_get(const Value& obj, const Value& key) {
  if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.obj->find(key.s)) return *v;
    return attr_get(obj, key.s);
  }
  if ((obj.is_array() || obj.is_string()) && (key.kind == Value::Kind::integer || key.kind == Value::Kind::boolean)) {
    int64_t k = key.kind == Value::Kind::boolean ? key.b : key.i;
    if (obj.is_array()) {
      const int64_t n = int64_t(obj.arr->size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("list index out of range");
      return (*obj.arr)[size_t(k)];
    }
    const std::vector<uint32_t> cps = utf8_decode(obj.s);
    const int64_t n = int64_t(cps.size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined("string index out of range");
    return Value::string(utf8_encode(cps, size_t(k), size_t(k) + 1));
  }
  if (key.is_string()) return attr_get(obj, key.s);
  std::string msg = "'";
  msg.append(kind_name(obj)).append(" object' has no item ").append(to_repr(key));
  return Value::undefined(std::move(msg));
}

Value slice_get(const Value& obj, const Value& lo, const Value& hi, const Value& step_v) {
  const int64_t step = step_v.is_none() ? 1 : need_int(step_v, "slice step");
  if (step == 0) throw std::runtime_error("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = utf8_decode(obj.s);
    n = int64_t(cps.size());
  } else if (obj.is_array()) {
    n = int64_t(obj.arr->size());
  } else {
    type_fail("slicing", obj);
  }
  auto norm = [&](const Value& v, int64_t def) -> int64_t {
    if (v.is_none()) return def;
    int64_t x = need_int(v, "slice index");
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = norm(lo, step > 0 ? 0 : n - 1), e = norm(hi, step > 0 ? n : -1);
  std::vector<size_t> idx;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) idx.push_back(size_t(k));
  if (obj.is_string()) {
    std::vector<uint32_t> picked;
    for (size_t k : idx) picked.push_back(cps[k]);
    return Value::string(utf8_encode(picked, 0, picked.size()));
  }
  Array out;
  for (size_t k : idx) out.push_back((*obj.arr)[k]);
  return Value::array(std::move(out));
}

Value binary_apply(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "<") return Value::boolean(less(a, b));
  if (op == ">") return Value::boolean(less(b, a));
  if (op == "<=") return Value::boolean(!less(b, a));
  if (op == ">=") return Value::boolean(!less(a, b));
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      found = b.s.find(need_str(a, "'in <string>'")) != std::string::npos;
    } else if (b.is_object()) {
      found = a.is_string() && b.obj->find(a.s);
    } else if (b.is_array()) {
      for (const Value& x : *b.arr) found = found || equals(x, a);
    } else if (!b.is_undefined()) {
      throw std::runtime_error(std::string("argument of type '") + kind_name(b) + "' is not iterable");
    }
    return Value::boolean(found == (op == "in"));
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    throw std::runtime_error(u.s.empty()           ? "value is undefined"
                             : u.s.front() == '\'' ? u.s
                                                   : "'" + u.s + "' is undefined");
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.is_array() && b.is_array()) {
      Array out = *a.arr;
      out.insert(out.end(), b.arr->begin(), b.arr->end());
      return Value::array(std::move(out));
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_array() ? &a : b.is_string() || b.is_array() ? &b : nullptr;
    const Value& times = seq == &a ? b : a;
    if (seq && (times.kind == Value::Kind::integer || times.kind == Value::Kind::boolean)) {
      const int64_t n = std::max<int64_t>(0, need_int(times, "*"));
      const uint64_t item = seq->is_string() ? seq->s.size() : seq->arr->size();
      if (item > 0 && uint64_t(n) > (uint64_t(1) << 27) / item)
        throw std::runtime_error("'*' would make a value of more than 134217728 items");
      if (seq->is_string()) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq->s;
        return Value::string(out);
      }
      Array out;
      for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->arr->begin(), seq->arr->end());
      return Value::array(std::move(out));
    }
  }
  if (a.is_number() && b.is_number()) {
    const bool ints = a.kind != Value::Kind::floating && b.kind != Value::Kind::floating;
    const int64_t x = a.kind == Value::Kind::boolean ? a.b : a.i, y = b.kind == Value::Kind::boolean ? b.b : b.i;
    const double fx = a.as_double(), fy = b.as_double();
    int64_t r = 0;
    auto overflow = [&] { throw std::runtime_error("integer overflow in '" + op + "' (ramtrain's ints are 64-bit)"); };
    if (op == "+") {
      if (!ints) return Value::floating(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) overflow();
      return Value::integer(r);
    }
    if (op == "-") {
      if (!ints) return Value::floating(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) overflow();
      return Value::integer(r);
    }
    if (op == "*") {
      if (!ints) return Value::floating(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) overflow();
      return Value::integer(r);
    }
    if (op == "/") {
      if (fy == 0) throw std::runtime_error("division by zero");
      return Value::floating(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) throw std::runtime_error("integer division or modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) overflow();
        int64_t q = x / y;
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(fx / fy);
      return Value::floating(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        r = 1;
        for (int64_t k = 0; k < y; ++k)
          if (__builtin_mul_overflow(r, x, &r)) overflow();
        return Value::integer(r);
      }
      return Value::floating(std::pow(fx, fy));
    }
  }
  throw std::runtime_error(std::string("unsupported operand type(s) for ") + op + ": '" + kind_name(a) + "' and '" +
                           kind_name(b) + "'");
}

bool test_apply(const std::string& name, const Value& v, CallArgs& a) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::integer;
  if (name == "float") return v.kind == K::floating;
  if (name == "boolean") return v.kind == K::boolean;
  if (name == "true") return v.kind == K::boolean && v.b;
  if (name == "false") return v.kind == K::boolean && !v.b;
  if (name == "mapping") return v.is_object() && !v.obj->is_namespace;
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence")
    return v.is_string() || v.is_array() || (v.is_object() && !v.obj->is_namespace) || v.is_undefined();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && py_case(v.s, 0) == v.s;
  if (name == "upper") return v.is_string() && py_case(v.s, 1) == v.s;
  if (name == "odd" || name == "even")
    return need_int(v, name.c_str()) % 2 == (name == "odd" ? 1 : 0) || (name == "odd" && need_int(v, "odd") % 2 == -1);
  if (name == "divisibleby") {
    const int64_t x = need_int(v, "divisibleby"), d = need_int(a.get(0, "num"), "divisibleby");
    if (d == 0) throw std::runtime_error("divisibleby(0): integer division or modulo by zero");
    return d == -1 || x % d == 0;
  }
  const Value other = a.get(0, "other");
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "sameas") return equals(v, other) && v.kind == other.kind;
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other, v);
  if (name == "le" || name == "<=") return !less(other, v);
  if (name == "ge" || name == ">=") return !less(v, other);
  if (name == "in") return truthy(binary_apply("in", v, a.get(0, "seq")));
  throw std::runtime_error("unknown test '" + name + "'");
}

void add_globals(Object& g, std::function<std::time_t()> clock) {
  g.set("range", Value::function([](CallArgs& a) {
          int64_t start = 0, stop, step = 1;
          if (a.pos.size() == 1) {
            stop = need_int(a.pos[0], "range");
          } else if (a.pos.size() == 2 || a.pos.size() == 3) {
            start = need_int(a.pos[0], "range");
            stop = need_int(a.pos[1], "range");
            if (a.pos.size() == 3) step = need_int(a.pos[2], "range");
          } else {
            throw std::runtime_error("range takes 1 to 3 arguments");
          }
          if (step == 0) throw std::runtime_error("range() arg 3 must not be zero");
          Array out;
          for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            out.push_back(Value::integer(k));
            if (out.size() >= 1000000) throw std::runtime_error("range() of more than 1000000 items");
          }
          return Value::array(std::move(out));
        }));
  auto make_obj = [](CallArgs& a, bool ns) {
    Object o;
    o.is_namespace = ns;
    for (const Value& p : a.pos) {
      if (!p.is_object()) type_fail(ns ? "namespace()" : "dict()", p);
      for (const auto& [k, v] : p.obj->items) o.set(k, v);
    }
    for (const auto& [k, v] : a.kw) {
      if (ns && !k.empty() && k[0] == '_') throw std::runtime_error("namespace attributes cannot start with '_'");
      o.set(k, v);
    }
    return Value::object(std::move(o));
  };
  g.set("namespace", Value::function([make_obj](CallArgs& a) { return make_obj(a, true); }));
  g.set("dict", Value::function([make_obj](CallArgs& a) { return make_obj(a, false); }));
  g.set("raise_exception", Value::function([](CallArgs& a) -> Value {
          throw std::runtime_error("raise_exception: " + to_str(a.get(0, "message", Value::string(""))));
        }));
  g.set("strftime_now", Value::function([clock](CallArgs& a) {
          const std::string fmt = need_str(a.get(0, "format"), "strftime_now");
          const std::time_t t = clock();
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[512];
          const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return Value::string(std::string(buf, n));
        }));
}

}  // namespace rt::jinja
