#include "cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"

namespace rt::cli {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string normalise(std::string k) {
  std::replace(k.begin(), k.end(), '_', '-');
  return k;
}

}  // namespace

ArgParser::ArgParser(std::string command, std::string summary, std::string examples)
    : command_(std::move(command)), summary_(std::move(summary)), examples_(std::move(examples)) {}

void ArgParser::option(const std::string& name, const std::string& metavar, const std::string& help,
                       const std::string& default_value) {
  opts_.push_back({name, metavar, help, default_value, false});
}

void ArgParser::flag(const std::string& name, const std::string& help) { opts_.push_back({name, "", help, "", true}); }

const ArgParser::Opt* ArgParser::find(const std::string& name) const {
  for (auto& o : opts_)
    if (o.name == name) return &o;
  return nullptr;
}

bool ArgParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.rfind("--", 0) != 0)
      fail("[", command_, "] unexpected argument '", a, "'. Options start with --; see 'ramtrain ", command_,
           " --help'.");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Opt* o = find(name);
    if (!o) {
      std::string best;
      size_t bd = 1000;
      for (auto& k : opts_) {
        size_t d = edit_distance(name, k.name);
        if (d < bd) bd = d, best = k.name;
      }
      fail("[", command_, "] unknown option --", name,
           bd <= 3 ? cat(" (did you mean --", best, "?)") : std::string(), ". See 'ramtrain ", command_, " --help'.");
    }
    if (o->is_flag) {
      if (has_value && value != "true" && value != "false" && value != "1" && value != "0")
        fail("[", command_, "] --", name, " is a flag; it takes no value (or true/false)");
      values_[name] = has_value ? ((value == "true" || value == "1") ? "true" : "false") : "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) fail("[", command_, "] --", name, " needs a value (", o->metavar, ")");
      value = args[++i];
    }
    values_[name] = value;
  }
  return true;
}

void ArgParser::merge_toml(const std::string& path) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << e.description() << " at line " << e.source().begin.line << ", column " << e.source().begin.column;
    fail("[config] ", path, ": invalid TOML: ", s.str());
  }
  for (auto&& [k, v] : tbl) {
    std::string key = normalise(std::string(k.str()));
    const Opt* o = find(key);
    if (!o || key == "config") fail("[config] ", path, ": unknown key '", k.str(), "'. Keys are the option names of 'ramtrain ", command_, " --help'.");
    std::string val;
    if (auto s = v.value<std::string>()) val = *s;
    else if (v.is_integer()) val = std::to_string(*v.value<int64_t>());
    else if (v.is_floating_point()) {
      std::ostringstream os;
      os.precision(17);
      os << *v.value<double>();
      val = os.str();
    } else if (auto b = v.value<bool>()) val = *b ? "true" : "false";
    else fail("[config] ", path, ": key '", k.str(), "' must be a string, number or boolean");
    file_values_[key] = val;
  }
}

void ArgParser::merge_base(const std::map<std::string, std::string>& values) {
  for (auto& [k, v] : values)
    if (find(k)) base_values_[k] = v;
}

bool ArgParser::has(const std::string& name) const {
  if (values_.count(name) || file_values_.count(name) || base_values_.count(name)) return true;
  const Opt* o = find(name);
  return o && !o->def.empty();
}

bool ArgParser::given(const std::string& name) const { return given_explicitly(name) || base_values_.count(name); }

bool ArgParser::given_explicitly(const std::string& name) const {
  return values_.count(name) || file_values_.count(name);
}

std::string ArgParser::str(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = file_values_.find(name); it != file_values_.end()) return it->second;
  if (auto it = base_values_.find(name); it != base_values_.end()) return it->second;
  const Opt* o = find(name);
  if (!o) fail("[", command_, "] internal: no option --", name);
  if (o->def.empty()) fail("[", command_, "] --", name, " is not set");
  return o->def;
}

std::string ArgParser::require(const std::string& name) const {
  if (!has(name)) fail("[", command_, "] --", name, " is required. See 'ramtrain ", command_, " --help'.");
  return str(name);
}

int64_t ArgParser::integer(const std::string& name) const {
  std::string s = str(name);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || errno) fail("[", command_, "] --", name, " must be an integer, got '", s, "'");
  return v;
}

double ArgParser::number(const std::string& name) const {
  std::string s = str(name);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || errno || !std::isfinite(v)) fail("[", command_, "] --", name, " must be a number, got '", s, "'");
  return v;
}

bool ArgParser::on(const std::string& name) const {
  if (!has(name)) return false;
  std::string s = str(name);
  return s == "true" || s == "1";
}

uint64_t ArgParser::size_bytes(const std::string& name) const {
  std::string s = str(name);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf(end);
  double mult = 1;
  if (suf == "" || suf == "B") mult = 1;
  else if (suf == "K" || suf == "KB" || suf == "KiB") mult = 1024.0;
  else if (suf == "M" || suf == "MB" || suf == "MiB") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "GB" || suf == "GiB") mult = 1024.0 * 1024 * 1024;
  else fail("[", command_, "] --", name, " must be a size like 512M or 16G, got '", s, "'");
  if (!(v >= 0)) fail("[", command_, "] --", name, " must be a non-negative size, got '", s, "'");
  return static_cast<uint64_t>(v * mult);
}

std::string ArgParser::help() const {
  std::ostringstream s;
  s << "Usage: ramtrain " << command_ << " [options]\n\n" << summary_ << "\n\nOptions:\n";
  for (auto& o : opts_) {
    std::string left = "  --" + o.name + (o.is_flag ? "" : " " + o.metavar);
    s << left;
    if (left.size() < 30) s << std::string(30 - left.size(), ' ');
    else s << "\n" << std::string(30, ' ');
    s << o.help;
    if (!o.def.empty()) s << " (default: " << o.def << ")";
    s << "\n";
  }
  s << "  --help                      show this help\n";
  if (!examples_.empty()) s << "\nExamples:\n" << examples_;
  return s.str();
}

std::map<std::string, std::string> ArgParser::resolved() const {
  std::map<std::string, std::string> r;
  for (auto& o : opts_)
    if (has(o.name)) r[o.name] = str(o.name);
  return r;
}

}  // namespace rt::cli
