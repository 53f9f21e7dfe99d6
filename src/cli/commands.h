// Subcommands of the ramtrain executable. Each takes the arguments after the
// subcommand name and returns the process exit code; user errors are thrown
// as rt::Error and reported once by main().
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

}  // namespace rt::cli
