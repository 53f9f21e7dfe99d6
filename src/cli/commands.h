// Subcommands of the ramtrain executable. Each takes the arguments after the
// subcommand name and returns the process exit code; user errors are thrown
// as rt::Error and reported once by run_cli() (or, from Python, raised as an
// exception by the module). No command calls exit().
#pragma once
#include <string>
#include <vector>

namespace rt::cli {

using Args = std::vector<std::string>;

int cmd_loss(const Args& args);
int cmd_train(const Args& args);
int cmd_sample(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_render(const Args& args);
int cmd_export(const Args& args);
int cmd_eval(const Args& args);
int cmd_plan(const Args& args);

using CommandFn = int (*)(const Args&);
// The subcommand of this name ("train", "plan", ...); null when there is none.
CommandFn find_command(const std::string& name);
// `ramtrain ARGV...` as the executable runs it: dispatches to the command,
// prints usage, help and errors ("ramtrain CMD: error: ...") and returns the
// exit code; never throws.
int run_cli(const Args& argv);

}  // namespace rt::cli
