#include "data/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace rt::jinja {

const Value* Object::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::array(Array a) {
  Value v;
  v.kind = Kind::array;
  v.arr = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::object(Object o) {
  Value v;
  v.kind = Kind::object;
  v.obj = std::make_shared<Object>(std::move(o));
  return v;
}

Value Value::function(NativeFn f) {
  Value v;
  v.kind = Kind::function;
  v.fn = std::make_shared<NativeFn>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? floating(double(u)) : integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, e] : j.items()) o.items.emplace_back(k, from_json(e));
      return object(std::move(o));
    }
    default:
      return none();
  }
}

Value CallArgs::get(size_t idx, const char* name, Value def) const {
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  if (idx < pos.size()) return pos[idx];
  return def;
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
      return "Undefined";
    case Value::Kind::none:
      return "NoneType";
    case Value::Kind::boolean:
      return "bool";
    case Value::Kind::integer:
      return "int";
    case Value::Kind::floating:
      return "float";
    case Value::Kind::string:
      return "str";
    case Value::Kind::array:
      return "list";
    case Value::Kind::object:
      return v.obj->is_namespace ? "Namespace" : "dict";
    case Value::Kind::function:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return false;
    case Value::Kind::boolean:
      return v.b;
    case Value::Kind::integer:
      return v.i != 0;
    case Value::Kind::floating:
      return v.f != 0;
    case Value::Kind::string:
      return !v.s.empty();
    case Value::Kind::array:
      return !v.arr->empty();
    case Value::Kind::object:
      return v.obj->is_namespace || !v.obj->items.empty();
    case Value::Kind::function:
      return true;
  }
  return false;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX, shortest round trip
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python repr: fixed notation for decimal exponents -4..15
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else
      out += char(c);
  }
  return out + q;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
          } else
            out += char(c);
      }
    }
  } else {
    for (uint32_t c : utf8_decode(s)) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default: {
          char b[16];
          if (c >= 0x20 && c < 0x7f) {
            out += char(c);
          } else if (c < 0x10000) {
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
          } else {
            const uint32_t v = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            out += b;
          }
        }
      }
    }
  }
  out += '"';
}

struct JsonOpts {
  int indent;
  bool ensure_ascii, sort_keys;
  std::string item_sep, key_sep;
};

void json_dump(const Value& v, const JsonOpts& o, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    out += std::string(size_t(o.indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      out += "null";
      return;
    case Value::Kind::boolean:
      out += v.b ? "true" : "false";
      return;
    case Value::Kind::integer:
      out += std::to_string(v.i);
      return;
    case Value::Kind::floating:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(v.f);
      return;
    case Value::Kind::string:
      json_string(v.s, o.ensure_ascii, out);
      return;
    case Value::Kind::array: {
      if (v.arr->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += o.item_sep;
        if (o.indent >= 0) newline(depth + 1);
        json_dump((*v.arr)[k], o, depth + 1, out);
      }
      if (o.indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::object: {
      if (v.obj->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.obj->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += o.item_sep;
        if (o.indent >= 0) newline(depth + 1);
        json_string(items[k]->first, o.ensure_ascii, out);
        out += o.key_sep;
        json_dump(items[k]->second, o, depth + 1, out);
      }
      if (o.indent >= 0) newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::function:
      throw std::runtime_error("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string:
      return repr_string(v.s);
    case Value::Kind::array: {
      std::string out = "[";
      for (size_t k = 0; k < v.arr->size(); ++k) out += (k ? ", " : "") + to_repr((*v.arr)[k]);
      return out + "]";
    }
    case Value::Kind::object: {
      if (v.obj->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t k = 0; k < v.obj->items.size(); ++k)
        out += (k ? ", " : "") + repr_string(v.obj->items[k].first) + ": " + to_repr(v.obj->items[k].second);
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::none:
      return "None";
    case Value::Kind::boolean:
      return v.b ? "True" : "False";
    case Value::Kind::integer:
      return std::to_string(v.i);
    case Value::Kind::floating:
      return float_repr(v.f);
    case Value::Kind::string:
      return v.s;
    case Value::Kind::array:
    case Value::Kind::object:
      return to_repr(v);
    case Value::Kind::function:
      return "<function>";
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::floating || b.kind == Value::Kind::floating) return a.as_double() == b.as_double();
    const int64_t x = a.kind == Value::Kind::boolean ? a.b : a.i, y = b.kind == Value::Kind::boolean ? b.b : b.i;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return true;
    case Value::Kind::string:
      return a.s == b.s;
    case Value::Kind::array:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!equals((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case Value::Kind::object:
      if (a.obj == b.obj) return true;
      if (a.obj->is_namespace || b.obj->is_namespace) return false;
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (const auto& [k, v] : a.obj->items) {
        const Value* o = b.obj->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    case Value::Kind::function:
      return a.fn == b.fn;
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.is_array() && b.is_array()) {
    const size_t n = std::min(a.arr->size(), b.arr->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.arr)[k], (*b.arr)[k])) return less((*a.arr)[k], (*b.arr)[k]);
    }
    return a.arr->size() < b.arr->size();
  }
  throw std::runtime_error(std::string("'<' not supported between instances of '") + kind_name(a) + "' and '" +
                           kind_name(b) + "'");
}

std::string to_json(const Value& v, int indent, bool ensure_ascii, bool sort_keys, const std::string* item_sep,
                    const std::string* key_sep) {
  JsonOpts o{indent, ensure_ascii, sort_keys, item_sep ? *item_sep : (indent >= 0 ? "," : ", "),
             key_sep ? *key_sep : ": "};
  std::string out;
  json_dump(v, o, 0, out);
  return out;
}

nlohmann::ordered_json to_json_value(const Value& v) {
  switch (v.kind) {
    case Value::Kind::boolean:
      return v.b;
    case Value::Kind::integer:
      return v.i;
    case Value::Kind::floating:
      return v.f;
    case Value::Kind::string:
      return v.s;
    case Value::Kind::array: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : *v.arr) a.push_back(to_json_value(e));
      return a;
    }
    case Value::Kind::object: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.obj->items) o[k] = to_json_value(e);
      return o;
    }
    default:
      return nullptr;
  }
}

std::vector<uint32_t> utf8_decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = s[k];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + size_t(n) > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int m = 1; m < n; ++m) cp = (cp << 6) | (uint32_t(static_cast<unsigned char>(s[k + size_t(m)])) & 0x3F);
    out.push_back(cp);
    k += size_t(n);
  }
  return out;
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) {
    const uint32_t c = cps[k];
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace rt::jinja
