// Python string and value operations shared by the Jinja builtins and
// filters (data/jinja_builtins.cpp, data/jinja_filters.cpp); internal to them.
#pragma once
#include <string>

#include "data/jinja_value.h"

namespace rt::jinja {

[[noreturn]] void type_fail(const std::string& what, const Value& v);
bool py_space(uint32_t c);  // Python str.isspace() for one code point
const std::string& need_str(const Value& v, const char* what);
int64_t need_int(const Value& v, const char* what);
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);  // chars None: whitespace
Array py_split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count);
std::string py_case(const std::string& s, int mode);  // 0 lower, 1 upper, 2 title, 3 capitalize (ASCII letters)
Value items_of(const Object& o);                      // [[key, value], ...]
int64_t length_of(const Value& v);
Value attr_path(const Value& v, const std::string& path);  // "a.b.0" for map/sort/join attribute=
Array select_items(const Value& seq, CallArgs& a, bool by_attr, bool keep);
std::string html_escape(const std::string& s);

}  // namespace rt::jinja
