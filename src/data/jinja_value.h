// Values of the Jinja subset (data/jinja_template.h), with the Python
// semantics HF chat templates rely on: None/True/False spelled as Python
// prints them, dicts keep insertion order (json.dumps and `| items` follow
// it), lists and dicts are shared by reference like Python objects (a
// namespace() set inside a loop is seen after it), strings are UTF-8 and are
// indexed, sliced and measured in code points as Python str is.
// Undefined is a value: it prints as "", is falsy, iterates as empty and
// fails only when an attribute or item of it is taken or it is called.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace rt::jinja {

struct Value;
struct CallArgs;
using Array = std::vector<Value>;
using NativeFn = std::function<Value(CallArgs&)>;

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the only object `set a.b = ...` may write
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct Value {
  enum class Kind { undefined, none, boolean, integer, floating, string, array, object, function };
  Kind kind = Kind::undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                 // string; undefined: the name that was missing (for errors)
  std::shared_ptr<Array> arr;    // array
  std::shared_ptr<Object> obj;   // object
  std::shared_ptr<NativeFn> fn;  // function

  static Value undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::none;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::boolean;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::integer;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.kind = Kind::floating;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::string;
    v.s = std::move(x);
    return v;
  }
  static Value array(Array a = {});
  static Value object(Object o = {});
  static Value function(NativeFn f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_array() const { return kind == Kind::array; }
  bool is_object() const { return kind == Kind::object; }
  bool is_function() const { return kind == Kind::function; }
  double as_double() const { return kind == Kind::floating ? f : kind == Kind::boolean ? (b ? 1 : 0) : double(i); }
};

// Positional and keyword arguments of a call; `where` names the callee for errors.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::string where;
  // Argument idx by position or by name, else def (an Undefined means "required").
  Value get(size_t idx, const char* name, Value def = Value::undefined()) const;
};

const char* kind_name(const Value& v);  // Python's type names: str, int, list, dict, NoneType, ...
bool truthy(const Value& v);
std::string to_str(const Value& v);           // Python str(): what {{ v }} prints
std::string to_repr(const Value& v);          // Python repr(): how items print inside a list or dict
bool equals(const Value& a, const Value& b);  // Python ==
// Python <: numbers with numbers, strings with strings, lists elementwise;
// throws std::runtime_error otherwise.
bool less(const Value& a, const Value& b);
// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys) as
// transformers' tojson filter calls it: indent < 0 means None; separators
// default to (", ", ": ") without indent and (",", ": ") with it.
std::string to_json(const Value& v, int indent, bool ensure_ascii, bool sort_keys, const std::string* item_sep,
                    const std::string* key_sep);
nlohmann::ordered_json to_json_value(const Value& v);  // for callers outside the renderer

// UTF-8 helpers: code points of s, and back.
std::vector<uint32_t> utf8_decode(const std::string& s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t utf8_length(const std::string& s);
std::string float_repr(double x);  // Python repr(float)

}  // namespace rt::jinja
