// Filters, tests, methods and globals of the Jinja subset, with the Python /
// jinja2 / transformers behaviour HF chat templates see. Each throws
// std::runtime_error with a message (the renderer adds the position).
//   filters: abs capitalize count d default dictsort e escape first float int
//            indent items join last length list lower map max min reject
//            rejectattr replace reverse round safe select selectattr sort
//            string sum title tojson trim unique upper wordcount
//   tests:   boolean callable defined divisibleby eq equalto even false float
//            ge gt in integer iterable le lower lt mapping ne none number odd
//            sameas sequence string true undefined upper (and ==, !=, <, ...)
//   methods: str capitalize count endswith find index isalnum isalpha isdigit
//            islower isspace isupper join lower lstrip replace rfind rsplit
//            rstrip split splitlines startswith strip title upper;
//            dict get items keys values; list count index
//   globals: range namespace dict raise_exception strftime_now
#pragma once
#include <ctime>
#include <functional>
#include <string>

#include "data/jinja_value.h"

namespace rt::jinja {

Value filter_apply(const std::string& name, const Value& v, CallArgs& args);
bool test_apply(const std::string& name, const Value& v, CallArgs& args);
// obj.name: a method bound to obj, a dict key, or Undefined.
Value attr_get(const Value& obj, const std::string& name);
// obj[key]: a dict key (or, failing that, an attribute), a list/string index, or Undefined.
Value item_get(const Value& obj, const Value& key);
Value slice_get(const Value& obj, const Value& lo, const Value& hi, const Value& step);
// The items `for` iterates: list items, dict keys, string characters; Undefined: none.
Array iterate(const Value& v);
// Binary operators other than and/or (which short-circuit in the renderer).
Value binary_apply(const std::string& op, const Value& a, const Value& b);
// The globals transformers defines plus jinja2's range/dict/namespace.
void add_globals(Object& g, std::function<std::time_t()> clock);

}  // namespace rt::jinja
