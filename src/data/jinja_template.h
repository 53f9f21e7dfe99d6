// A Jinja renderer for HF chat templates: the subset of Jinja2 that
// tokenizer_config.json `chat_template` strings use, rendered the way
// transformers' apply_chat_template renders them (ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and loop controls; transformers' own tojson
// (json.dumps, ensure_ascii=False), raise_exception, strftime_now, namespace
// and dict globals). Values follow Python semantics (data/jinja_value.h).
// Supported: {{ }}, {% %}, {# #} with - and + whitespace control; for (tuple
// targets, if-filter, else, loop.index/index0/revindex/first/last/length/
// previtem/nextitem/cycle), if/elif/else, set (incl. namespace attributes and
// block set), macro, break/continue, {% generation %}; filters, tests, string,
// dict and list methods listed in jinja_builtins.cpp. Anything else is an
// error naming NAME:LINE:COL, never silently ignored.
// Scoping as in jinja2: each loop iteration and each macro call has its own
// scope; `set` inside a loop does not leak out of it (namespace() does).
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include "data/jinja_parser.h"
#include "data/jinja_value.h"

namespace rt::jinja {

class Template {
 public:
  // Throws rt::Error "[template] NAME:LINE:COL: message" on a syntax error.
  Template(const std::string& source, std::string name);
  ~Template();
  Template(Template&&) noexcept;

  // Renders with `vars` (the names the template sees, e.g. messages,
  // add_generation_prompt, bos_token) on top of the globals. Throws
  // rt::Error "[template] NAME:LINE:COL: message" on a runtime error,
  // including raise_exception("...") from the template.
  std::string render(const Object& vars) const;

  // The clock strftime_now reads (default: time(nullptr), local time as Python's
  // datetime.now()); tests pin it.
  void set_clock(std::function<std::time_t()> clock) { clock_ = std::move(clock); }
  const std::string& name() const { return name_; }

 private:
  std::string name_, source_;
  std::unique_ptr<SourceMap> map_;
  Body body_;
  std::function<std::time_t()> clock_;
};

}  // namespace rt::jinja
