#include "cli/args.h"

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/quote.h"

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

bool parse_int(const std::string& s, int64_t* v) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || errno) return false;
  *v = x;
  return true;
}

bool parse_double(const std::string& s, double* v) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || errno || !std::isfinite(x)) return false;
  *v = x;
  return true;
}

std::string fmt_bound(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// The help width: the terminal's, at most 100 columns, at least 60.
size_t help_width() {
  winsize w{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0)
    return std::clamp<size_t>(w.ws_col, 60, 100);
  return 100;
}

}  // namespace

bool parse_size(const std::string& s, uint64_t* bytes) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || errno || !std::isfinite(v) || v < 0) return false;
  std::string suf(end);
  double mult = 1;
  if (suf == "" || suf == "B")
    mult = 1;
  else if (suf == "K" || suf == "KB" || suf == "KiB")
    mult = 1024.0;
  else if (suf == "M" || suf == "MB" || suf == "MiB")
    mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "GB" || suf == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (suf == "T" || suf == "TB" || suf == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return false;
  if (v * mult >= 1.8e19) return false;
  *bytes = static_cast<uint64_t>(v * mult);
  return true;
}

std::string wrap_text(const std::string& text, size_t width, size_t indent) {
  std::string out;
  size_t col = indent;  // the first line starts at the indent column too
  std::istringstream in(text);
  std::string word;
  bool first = true;
  while (in >> word) {
    if (!first && col + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
    } else if (!first) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    first = false;
  }
  return out;
}

OptSpec& OptSpec::integer(double min, double max) {
  type = OptType::integer;
  lo = min;
  hi = max;
  return *this;
}
OptSpec& OptSpec::number(double min, double max) {
  type = OptType::number;
  lo = min;
  hi = max;
  return *this;
}
OptSpec& OptSpec::below(double max) {
  hi = max;
  hi_open = true;
  return *this;
}

OptSpec& OptSpec::above(double min) {
  type = OptType::number;
  lo = min;
  lo_open = true;
  return *this;
}
OptSpec& OptSpec::size() {
  type = OptType::size;
  return *this;
}
OptSpec& OptSpec::choice(std::vector<std::string> values) {
  type = OptType::choice;
  choices = std::move(values);
  return *this;
}
OptSpec& OptSpec::list() {
  type = OptType::list;
  return *this;
}
OptSpec& OptSpec::or_word(const std::string& w) {
  specials.push_back(w);
  return *this;
}
OptSpec& OptSpec::as_positional() {
  positional = true;
  return *this;
}

ArgParser::ArgParser(std::string command, std::string summary, std::string examples)
    : command_(std::move(command)), summary_(std::move(summary)), examples_(std::move(examples)) {}

void ArgParser::group(const std::string& title) { group_ = title; }

OptSpec& ArgParser::option(const std::string& name, const std::string& metavar, const std::string& help,
                           const std::string& default_value) {
  OptSpec o;
  o.name = name;
  o.metavar = metavar;
  o.help = help;
  o.def = default_value;
  o.group = group_;
  opts_.push_back(std::move(o));
  return opts_.back();
}

OptSpec& ArgParser::flag(const std::string& name, const std::string& help) {
  OptSpec& o = option(name, "", help);
  o.type = OptType::flag;
  return o;
}

const OptSpec* ArgParser::find(const std::string& name) const {
  for (auto& o : opts_)
    if (o.name == name) return &o;
  return nullptr;
}

// The single check every value goes through, whatever its source.
void ArgParser::check(const OptSpec& o, const std::string& value, const std::string& where) const {
  if (std::find(o.specials.begin(), o.specials.end(), value) != o.specials.end()) return;
  const std::string alt = o.specials.empty() ? "" : cat(" (or ", join(o.specials, " or "), ")");
  auto bounds = [&]() {
    std::string b;
    if (std::isfinite(o.lo)) b += cat(o.lo_open ? " > " : " >= ", fmt_bound(o.lo));
    if (std::isfinite(o.hi)) b += cat(b.empty() ? " " : " and ", o.hi_open ? "< " : "<= ", fmt_bound(o.hi));
    return b;
  };
  auto in_bounds = [&](double x) { return (o.lo_open ? x > o.lo : x >= o.lo) && (o.hi_open ? x < o.hi : x <= o.hi); };
  switch (o.type) {
    case OptType::integer: {
      int64_t v;
      if (!parse_int(value, &v) || !in_bounds(static_cast<double>(v)))
        fail("[", command_, "] ", where, " must be an integer", bounds(), alt, ", got '", value, "'");
      return;
    }
    case OptType::number: {
      double v;
      if (!parse_double(value, &v) || !in_bounds(v))
        fail("[", command_, "] ", where, " must be a number", bounds(), alt, ", got '", value, "'");
      return;
    }
    case OptType::size: {
      uint64_t b;
      if (!parse_size(value, &b))
        fail("[", command_, "] ", where, " must be a size like 512M or 16G, got '", value, "'");
      return;
    }
    case OptType::choice:
      if (std::find(o.choices.begin(), o.choices.end(), value) == o.choices.end())
        fail("[", command_, "] ", where, " must be one of ", join(o.choices, ", "), "; got '", value, "'");
      return;
    case OptType::flag:
      if (value != "true" && value != "false")
        fail("[", command_, "] ", where, " is a flag: true or false (on the command line: just --", o.name, "); got '",
             value, "'");
      return;
    case OptType::text:
    case OptType::list:
      return;
  }
}

void ArgParser::set_value(std::map<std::string, std::string>& into, const OptSpec& o, const std::string& value) {
  if (o.type == OptType::list && into.count(o.name))
    into[o.name] += kListSep + value;
  else
    into[o.name] = value;
}

bool ArgParser::parse(const std::vector<std::string>& args) {
  size_t next_positional = 0;
  // An option given both as an argument and as --name with another value is
  // ambiguous (a repeated --name is not: the last one wins, as usual).
  std::map<std::string, std::string> as_argument, as_option;
  auto clash = [&](const std::string& name) {
    if (!as_argument.count(name) || !as_option.count(name) || as_argument[name] == as_option[name]) return;
    fail("[", command_, "] ", quote_input(as_argument[name]), " (an argument) and --", name, " ",
         quote_input(as_option[name]), " both give --", name, ": give it once");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      // A positional word: the next positional option (a list one takes every later word).
      const OptSpec* target = nullptr;
      size_t k = 0;
      for (auto& o : opts_) {
        if (!o.positional) continue;
        if (k++ < next_positional) continue;
        target = &o;
        break;
      }
      if (!target)
        fail("[", command_, "] unexpected argument '", a, "'. Options start with --; see 'ramtrain ", command_,
             " --help'.");
      if (target->type != OptType::list) ++next_positional;
      check(*target, a, "argument " + target->metavar);
      set_value(values_, *target, a);
      if (target->type != OptType::list) as_argument[target->name] = a, clash(target->name);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const OptSpec* o = find(name);
    if (!o) {
      std::string best;
      size_t bd = 1000;
      for (auto& k : opts_) {
        size_t d = edit_distance(name, k.name);
        if (d < bd) bd = d, best = k.name;
      }
      fail("[", command_, "] unknown option --", name, bd <= 3 ? cat(" (did you mean --", best, "?)") : std::string(),
           ". See 'ramtrain ", command_, " --help'.");
    }
    const std::string where = "--" + name;
    if (o->type == OptType::flag) {
      if (has_value && value != "true" && value != "false" && value != "1" && value != "0")
        fail("[", command_, "] --", name, " is a flag; it takes no value (or true/false)");
      values_[name] = has_value ? ((value == "true" || value == "1") ? "true" : "false") : "true";
      continue;
    }
    if (o->type == OptType::list && !has_value) {
      values_.erase(name);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) set_value(values_, *o, args[++i]);
      if (!values_.count(name)) fail("[", command_, "] --", name, " needs one or more values (", o->metavar, ")");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) fail("[", command_, "] --", name, " needs a value (", o->metavar, ")");
      value = args[++i];
    }
    check(*o, value, where);
    if (o->type == OptType::list) {
      values_.erase(name);
      for (auto& v : split(value, ',')) set_value(values_, *o, v);
    } else {
      values_[name] = value;
      if (o->positional) as_option[name] = value, clash(name);
    }
  }
  return true;
}

void ArgParser::merge_toml(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("[config] ", path, ": no such file (--config takes a TOML file)");
  if (!S_ISREG(st.st_mode))
    fail("[config] ", path, ": is ", S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
         "; --config takes a TOML file such as run.toml");
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << e.description() << " at line " << e.source().begin.line << ", column " << e.source().begin.column;
    fail("[config] ", path, ": invalid TOML: ", s.str());
  }
  config_path_ = path;
  for (auto&& [k, node] : tbl) {
    const auto& v = node;  // a plain reference: lambdas may not capture structured bindings before clang 16
    const std::string key = normalise(std::string(k.str()));
    const OptSpec* o = find(key);
    const std::string where = cat(path, ": key '", k.str(), "'");
    if (!o || key == "config")
      fail("[config] ", path, ": unknown key '", k.str(), "'. Keys are the option names of 'ramtrain ", command_,
           " --help'.");
    auto wrong_type = [&](const char* want) {
      fail("[", command_, "] ", where, " must be ", want, ", got ",
           v.is_string()           ? "a string"
           : v.is_boolean()        ? "a boolean"
           : v.is_integer()        ? "an integer"
           : v.is_floating_point() ? "a float"
           : v.is_array()          ? "an array"
                                   : "a table");
    };
    std::string val;
    switch (o->type) {
      case OptType::flag:
        if (!v.is_boolean()) wrong_type("true or false (a TOML boolean, unquoted)");
        val = *v.value<bool>() ? "true" : "false";
        break;
      case OptType::integer:
        if (v.is_integer())
          val = std::to_string(*v.value<int64_t>());
        else if (v.is_string() && !o->specials.empty())
          val = *v.value<std::string>();
        else
          wrong_type(o->specials.empty() ? "an integer"
                                         : cat("an integer or \"", join(o->specials, "\" or \""), "\"").c_str());
        break;
      case OptType::number:
        if (v.is_integer())
          val = std::to_string(*v.value<int64_t>());
        else if (v.is_floating_point()) {
          std::ostringstream os;
          os.precision(17);
          os << *v.value<double>();
          val = os.str();
        } else
          wrong_type("a number");
        break;
      case OptType::size:
        if (v.is_integer())
          val = std::to_string(*v.value<int64_t>());
        else if (v.is_string())
          val = *v.value<std::string>();
        else
          wrong_type("a size: a string like \"16G\" or a number of bytes");
        break;
      case OptType::choice:
        if (!v.is_string()) wrong_type("a string");
        val = *v.value<std::string>();
        break;
      case OptType::text:
        if (v.is_string())
          val = *v.value<std::string>();
        else if (v.is_integer())
          val = std::to_string(*v.value<int64_t>());
        else
          wrong_type("a string");
        break;
      case OptType::list:
        if (v.is_string()) {
          val = join(split(*v.value<std::string>(), ','), std::string(1, kListSep));
        } else if (auto* arr = v.as_array()) {
          std::vector<std::string> items;
          for (auto&& e : *arr) {
            if (!e.is_string()) wrong_type("an array of strings");
            items.push_back(*e.value<std::string>());
          }
          val = join(items, std::string(1, kListSep));
        } else {
          wrong_type("a string or an array of strings");
        }
        break;
    }
    if (o->type != OptType::list) check(*o, val, where);
    file_values_[key] = val;
  }
}

void ArgParser::merge_base(const std::map<std::string, std::string>& values) {
  for (auto& [k, v] : values)
    if (find(k)) base_values_[k] = v;
}

bool ArgParser::has(const std::string& name) const {
  if (values_.count(name) || file_values_.count(name) || base_values_.count(name)) return true;
  const OptSpec* o = find(name);
  return o && !o->def.empty();
}

bool ArgParser::given(const std::string& name) const { return given_explicitly(name) || base_values_.count(name); }

bool ArgParser::given_explicitly(const std::string& name) const {
  return values_.count(name) || file_values_.count(name);
}

std::string ArgParser::source(const std::string& name) const {
  if (!values_.count(name) && file_values_.count(name)) return cat(config_path_, ": key '", name, "'");
  return "--" + name;
}

std::string ArgParser::str(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = file_values_.find(name); it != file_values_.end()) return it->second;
  if (auto it = base_values_.find(name); it != base_values_.end()) return it->second;
  const OptSpec* o = find(name);
  if (!o) fail("[", command_, "] internal: no option --", name);
  if (o->def.empty()) fail("[", command_, "] --", name, " is not set");
  return o->def;
}

std::string ArgParser::require(const std::string& name) const {
  if (!has(name)) fail("[", command_, "] --", name, " is required. See 'ramtrain ", command_, " --help'.");
  return str(name);
}

int64_t ArgParser::integer(const std::string& name) const {
  const std::string s = str(name);
  int64_t v;
  if (!parse_int(s, &v)) fail("[", command_, "] ", source(name), " must be an integer, got '", s, "'");
  return v;
}

double ArgParser::number(const std::string& name) const {
  const std::string s = str(name);
  double v;
  if (!parse_double(s, &v)) fail("[", command_, "] ", source(name), " must be a number, got '", s, "'");
  return v;
}

bool ArgParser::on(const std::string& name) const {
  if (!has(name)) return false;
  std::string s = str(name);
  return s == "true" || s == "1";
}

uint64_t ArgParser::size_bytes(const std::string& name) const {
  const std::string s = str(name);
  uint64_t b;
  if (!parse_size(s, &b)) fail("[", command_, "] ", source(name), " must be a size like 512M or 16G, got '", s, "'");
  return b;
}

std::vector<std::string> ArgParser::list(const std::string& name) const {
  if (!has(name)) return {};
  return split(str(name), kListSep);
}

std::string ArgParser::help() const {
  const size_t width = help_width(), col = 30;
  std::ostringstream s;
  std::string usage = "Usage: ramtrain " + command_;
  for (auto& o : opts_)
    if (o.positional) usage += " [" + o.metavar + "]";
  s << usage << " [options]\n\n";
  // The summary: paragraphs (separated by blank lines) reflowed to the width.
  size_t b = 0;
  while (b < summary_.size()) {
    size_t e = summary_.find("\n\n", b);
    if (e == std::string::npos) e = summary_.size();
    std::string para = summary_.substr(b, e - b);
    std::replace(para.begin(), para.end(), '\n', ' ');
    s << (b ? "\n" : "") << wrap_text(para, width, 0) << "\n";
    b = e + 2;
  }
  std::vector<std::string> groups;
  for (auto& o : opts_)
    if (std::find(groups.begin(), groups.end(), o.group) == groups.end()) groups.push_back(o.group);
  for (const std::string& g : groups) {
    s << "\n" << (g.empty() ? std::string("Options") : g) << ":\n";
    for (auto& o : opts_) {
      if (o.group != g) continue;
      std::string left = "  --" + o.name + (o.type == OptType::flag ? "" : " " + o.metavar);
      if (o.positional) left += " (or as an argument)";
      std::string text = o.help;
      if (!o.def.empty()) text += " (default: " + o.def + ")";
      if (left.size() + 2 <= col) {
        s << left << std::string(col - left.size(), ' ') << wrap_text(text, width, col) << "\n";
      } else {
        s << left << "\n" << std::string(col, ' ') << wrap_text(text, width, col) << "\n";
      }
    }
  }
  s << "\n  --help" << std::string(col - 8, ' ') << "show this help\n";
  if (!examples_.empty()) {
    s << "\nExamples:\n";
    for (const std::string& line : split(examples_, '\n')) {
      if (line.size() <= width) {
        s << line << "\n";
        continue;
      }
      // A long command: break at spaces with a shell continuation.
      std::string rest = line, indent = "      ";
      bool first = true;
      while (rest.size() + (first ? 0 : indent.size()) > width) {
        const size_t room = width - 2 - (first ? 0 : indent.size());
        size_t cut = rest.rfind(' ', room);
        if (cut == std::string::npos || cut == 0) break;
        s << (first ? "" : indent) << rest.substr(0, cut) << " \\\n";
        rest = rest.substr(cut + 1);
        first = false;
      }
      s << (first ? "" : indent) << rest << "\n";
    }
  }
  return s.str();
}

std::map<std::string, std::string> ArgParser::resolved() const {
  std::map<std::string, std::string> r;
  for (auto& o : opts_) {
    if (!has(o.name)) continue;
    std::string v = str(o.name);
    if (o.type == OptType::list) std::replace(v.begin(), v.end(), kListSep, ',');
    r[o.name] = v;
  }
  return r;
}

}  // namespace rt::cli
