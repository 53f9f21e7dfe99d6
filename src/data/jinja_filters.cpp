// Filters of the Jinja subset (listed in data/jinja_builtins.h).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "data/jinja_builtins.h"
#include "data/jinja_pyops.h"

namespace rt::jinja {

Value filter_apply(const std::string& name, const Value& v, CallArgs& a) {
  if (name == "tojson") {
    // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    const Value ea = a.get(0, "ensure_ascii", Value::boolean(false)), ind = a.get(1, "indent", Value::none()),
                sep = a.get(2, "separators", Value::none()), sk = a.get(3, "sort_keys", Value::boolean(false));
    std::string s1, s2;
    if (!sep.is_none()) {
      if (!sep.is_array() || sep.arr->size() != 2) throw std::runtime_error("tojson: separators must be a pair");
      s1 = need_str((*sep.arr)[0], "tojson separators");
      s2 = need_str((*sep.arr)[1], "tojson separators");
    }
    int indent = -1;
    if (ind.is_string()) throw std::runtime_error("tojson: string indent is not supported");
    if (!ind.is_none()) indent = int(std::max<int64_t>(0, need_int(ind, "tojson indent")));
    return Value::string(
        to_json(v, indent, truthy(ea), truthy(sk), sep.is_none() ? nullptr : &s1, sep.is_none() ? nullptr : &s2));
  }
  if (name == "trim") return Value::string(py_strip(need_str(v, "trim"), a.get(0, "chars", Value::none()), true, true));
  if (name == "length" || name == "count") return Value::integer(length_of(v));
  if (name == "upper") return Value::string(py_case(to_str(v), 1));
  if (name == "lower") return Value::string(py_case(to_str(v), 0));
  if (name == "title") return Value::string(py_case(to_str(v), 2));
  if (name == "capitalize") return Value::string(py_case(py_case(to_str(v), 0), 3));
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value::string(html_escape(to_str(v)));
  if (name == "default" || name == "d") {
    const bool boolean = truthy(a.get(1, "boolean", Value::boolean(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return a.get(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "join") {
    const std::string d = to_str(a.get(0, "d", Value::string("")));
    const Value attr = a.get(1, "attribute", Value::none());
    std::string out;
    const Array items = iterate(v);
    for (size_t k = 0; k < items.size(); ++k)
      out += (k ? d : "") + to_str(attr.is_none() ? items[k] : attr_path(items[k], to_str(attr)));
    return Value::string(out);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) type_fail("items", v);
    return items_of(*v.obj);
  }
  if (name == "dictsort") {
    if (!v.is_object()) type_fail("dictsort", v);
    Value items = items_of(*v.obj);
    std::stable_sort(items.arr->begin(), items.arr->end(), [](const Value& x, const Value& y) {
      return py_case((*x.arr)[0].s, 0) < py_case((*y.arr)[0].s, 0);
    });
    return items;
  }
  if (name == "list") return Value::array(iterate(v));
  if (name == "first" || name == "last") {
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) return slice_get(v, Value::none(), Value::none(), Value::integer(-1));
    Array items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (name == "int") {
    const Value def = a.get(0, "default", Value::integer(0));
    if (v.kind == Value::Kind::integer) return v;
    if (v.kind == Value::Kind::boolean) return Value::integer(v.b);
    if (v.kind == Value::Kind::floating) return Value::integer(int64_t(v.f));
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string t = py_strip(v.s, Value::none(), true, true);
        const long long x = std::stoll(t, &used, 10);
        if (used == t.size()) return Value::integer(x);
        const double f = std::stod(t, &used);
        if (used == t.size()) return Value::integer(int64_t(f));
      } catch (const std::exception&) {
      }
    }
    return def;
  }
  if (name == "float") {
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_string()) {
      try {
        size_t used = 0;
        const double f = std::stod(v.s, &used);
        if (used == v.s.size()) return Value::floating(f);
      } catch (const std::exception&) {
      }
    }
    return a.get(0, "default", Value::floating(0));
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::floating) return Value::floating(std::fabs(v.f));
    const int64_t x = need_int(v, "abs");
    if (x == INT64_MIN) throw std::runtime_error("abs: integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (name == "round") {
    const int64_t prec = need_int(a.get(0, "precision", Value::integer(0)), "round");
    const std::string method = to_str(a.get(1, "method", Value::string("common")));
    const double scale = std::pow(10.0, double(prec)), x = v.as_double() * scale;
    const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::floating(r / scale);
  }
  if (name == "replace") {
    return Value::string(
        py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                   a.get(2, "count", Value::none()).is_none() ? -1 : need_int(a.get(2, "count"), "replace")));
  }
  if (name == "wordcount") return Value::integer(int64_t(py_split(to_str(v), Value::none(), -1).size()));
  if (name == "indent") {
    const Value w = a.get(0, "width", Value::integer(4));
    const std::string pad =
        w.is_string() ? w.s : std::string(size_t(std::clamp<int64_t>(need_int(w, "indent"), 0, 1000)), ' ');
    const bool first = truthy(a.get(1, "first", Value::boolean(false))),
               blank = truthy(a.get(2, "blank", Value::boolean(false)));
    const std::string s = to_str(v);
    std::string out;
    size_t k = 0;
    bool line0 = true;
    while (k <= s.size()) {
      size_t e = s.find('\n', k);
      const bool last = e == std::string::npos;
      if (last) e = s.size();
      const std::string line = s.substr(k, e - k);
      if ((!line0 || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (!last) out += '\n';
      line0 = false;
      if (last) break;
      k = e + 1;
    }
    return Value::string(out);
  }
  if (name == "select" || name == "reject") return Value::array(select_items(v, a, false, name == "select"));
  if (name == "selectattr" || name == "rejectattr") return Value::array(select_items(v, a, true, name == "selectattr"));
  if (name == "map") {
    Array out;
    const Value attr = a.get(99, "attribute", Value::none());
    const Value def = a.get(99, "default", Value::undefined());
    for (const Value& item : iterate(v)) {
      if (!attr.is_none()) {
        Value x = attr_path(item, to_str(attr));
        out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
      } else {
        if (a.pos.empty()) throw std::runtime_error("map needs a filter name or attribute=");
        CallArgs fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(filter_apply(need_str(a.pos[0], "map filter name"), item, fa));
      }
    }
    return Value::array(std::move(out));
  }
  if (name == "unique") {
    Array out;
    for (const Value& x : iterate(v))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equals(x, y); })) out.push_back(x);
    return Value::array(std::move(out));
  }
  if (name == "sort") {
    const bool rev = truthy(a.get(0, "reverse", Value::boolean(false)));
    const Value attr = a.get(2, "attribute", Value::none());
    Array items = iterate(v);
    auto key = [&](const Value& x) { return attr.is_none() ? x : attr_path(x, to_str(attr)); };
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& x, const Value& y) { return rev ? less(key(y), key(x)) : less(key(x), key(y)); });
    return Value::array(std::move(items));
  }
  if (name == "min" || name == "max") {
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("empty sequence");
    Value best = items[0];
    for (const Value& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "sum") {
    const Value attr = a.get(0, "attribute", Value::none());
    Value acc = a.get(1, "start", Value::integer(0));
    for (const Value& x : iterate(v)) acc = binary_apply("+", acc, attr.is_none() ? x : attr_path(x, to_str(attr)));
    return acc;
  }
  throw std::runtime_error("unknown filter '" + name + "'");
}

}  // namespace rt::jinja
