// Command-line options for the subcommands: --name value, --name=value and
// boolean --flag; generated --help with examples; unknown options refused
// with the closest known name; optional TOML config file whose keys are the
// option names (dashes or underscores) and which command-line flags override.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rt::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary, std::string examples);
  // An option taking a value; empty default means "not set".
  void option(const std::string& name, const std::string& metavar, const std::string& help,
              const std::string& default_value = "");
  void flag(const std::string& name, const std::string& help);
  // Parses args. Returns false when --help was given (help already printed).
  // Throws rt::Error on unknown options, missing values and bad config files.
  bool parse(const std::vector<std::string>& args);
  // Merges a TOML file: keys become option values unless given on the command line.
  void merge_toml(const std::string& path);
  // The lowest layer above the defaults (a resumed run's saved configuration):
  // command line > TOML file > base > defaults. Base values count as given().
  void merge_base(const std::map<std::string, std::string>& values);

  bool has(const std::string& name) const;  // given, or has a default
  bool given(const std::string& name) const;  // on the command line, in the config file or in the base
  bool given_explicitly(const std::string& name) const;  // on the command line or in the config file
  std::string str(const std::string& name) const;  // throws when unset
  int64_t integer(const std::string& name) const;  // throws naming the option on bad numbers
  double number(const std::string& name) const;
  bool on(const std::string& name) const;  // flags
  uint64_t size_bytes(const std::string& name) const;  // "512M", "16G", "1024"
  std::string require(const std::string& name) const;  // throws "--name is required"
  std::string help() const;
  // The resolved configuration (every option with its value), for logs and checkpoints.
  std::map<std::string, std::string> resolved() const;

 private:
  struct Opt {
    std::string name, metavar, help, def;
    bool is_flag;
  };
  const Opt* find(const std::string& name) const;
  std::string command_, summary_, examples_;
  std::vector<Opt> opts_;
  std::map<std::string, std::string> values_;  // from the command line
  std::map<std::string, std::string> file_values_;
  std::map<std::string, std::string> base_values_;
};

}  // namespace rt::cli
