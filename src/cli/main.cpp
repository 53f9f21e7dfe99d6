// ramtrain: train and fine-tune transformer LLMs larger than GPU memory.
#include <string>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) { return rt::cli::run_cli(rt::cli::Args(argv + 1, argv + argc)); }
