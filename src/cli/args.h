// Command-line options for the subcommands: --name value, --name=value and
// boolean --flag; positional words anywhere (bound to the options declared
// positional, in order); generated --help, grouped and wrapped to at most 100
// columns, with examples; unknown options refused with the closest known
// name; an optional TOML config file whose keys are the option names (dashes
// or underscores) and which command-line flags override.
//
// One path for every value: each option has a type (text, integer, number,
// size, choice, flag, list) and bounds, and a value is checked against them
// the same way whether it came from the command line ("--steps must be ...")
// or from the TOML file ("run.toml: key 'steps' must be ..."); a TOML value of
// the wrong TOML type (a string for a flag) is refused, never coerced.
#pragma once
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace rt::cli {

enum class OptType { text, integer, number, size, choice, flag, list };

struct OptSpec {
  std::string name, metavar, help, def, group;
  OptType type = OptType::text;
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;               // lo itself is refused (x > lo)
  bool hi_open = false;               // hi itself is refused (x < hi)
  std::vector<std::string> choices;   // OptType::choice
  std::vector<std::string> specials;  // words accepted besides the type (e.g. "auto" for an integer)
  bool positional = false;            // bare words bind to it (in declaration order)

  // Chained setters: p.option("steps", "N", "...", "200").integer(1)
  OptSpec& integer(double min = -std::numeric_limits<double>::infinity(),
                   double max = std::numeric_limits<double>::infinity());
  OptSpec& number(double min = -std::numeric_limits<double>::infinity(),
                  double max = std::numeric_limits<double>::infinity());
  OptSpec& above(double min);  // number > min
  OptSpec& below(double max);  // and < max
  OptSpec& size();
  OptSpec& choice(std::vector<std::string> values);
  OptSpec& list();                         // several words after the option (an array or comma list in TOML)
  OptSpec& or_word(const std::string& w);  // also accept this word (e.g. "auto")
  OptSpec& as_positional();
};

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary, std::string examples);
  // Options declared after this call appear under this heading in --help.
  void group(const std::string& title);
  // An option taking a value; empty default means "not set".
  OptSpec& option(const std::string& name, const std::string& metavar, const std::string& help,
                  const std::string& default_value = "");
  OptSpec& flag(const std::string& name, const std::string& help);
  // Parses args. Returns false when --help was given (help already printed).
  // Throws rt::Error on unknown options, missing or bad values and bad config files.
  bool parse(const std::vector<std::string>& args);
  // Merges a TOML file: keys become option values unless given on the command line.
  // Refuses a path that is not a regular file, unknown keys, wrong TOML types
  // and values outside the option's bounds, naming file and key.
  void merge_toml(const std::string& path);
  // The lowest layer above the defaults (a resumed run's saved configuration):
  // command line > TOML file > base > defaults. Base values count as given().
  void merge_base(const std::map<std::string, std::string>& values);

  bool has(const std::string& name) const;               // given, or has a default
  bool given(const std::string& name) const;             // on the command line, in the config file or in the base
  bool given_explicitly(const std::string& name) const;  // on the command line or in the config file
  std::string str(const std::string& name) const;        // throws when unset
  int64_t integer(const std::string& name) const;        // throws naming the option on bad numbers
  double number(const std::string& name) const;
  bool on(const std::string& name) const;                        // flags
  uint64_t size_bytes(const std::string& name) const;            // "512M", "16G", "1024"
  std::vector<std::string> list(const std::string& name) const;  // list options (empty when unset)
  std::string require(const std::string& name) const;            // throws "--name is required"
  std::string help() const;
  const std::string& command() const { return command_; }
  // Where a value came from, for messages: "--name" or "FILE: key 'name'".
  std::string source(const std::string& name) const;
  // The resolved configuration (every option with its value), for logs and checkpoints.
  std::map<std::string, std::string> resolved() const;

 private:
  const OptSpec* find(const std::string& name) const;
  void check(const OptSpec& o, const std::string& value, const std::string& where) const;
  void set_value(std::map<std::string, std::string>& into, const OptSpec& o, const std::string& value);
  std::string command_, summary_, examples_, group_;
  std::deque<OptSpec> opts_;                   // deque: references handed out stay valid
  std::map<std::string, std::string> values_;  // from the command line
  std::map<std::string, std::string> file_values_;
  std::map<std::string, std::string> base_values_;
  std::string config_path_;
};

// Lists are stored as one string joined by this separator (not a character paths hold).
inline constexpr char kListSep = '\x1f';

// Parses "512M", "16G", "1024" (K/M/G, optional B/iB); false on anything else.
bool parse_size(const std::string& s, uint64_t* bytes);

// Wraps text to width columns for a block that starts at column indent (the
// caller prints the first line's indent); continuation lines get indent spaces.
std::string wrap_text(const std::string& text, size_t width, size_t indent);

}  // namespace rt::cli
