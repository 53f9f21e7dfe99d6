// The command-line front end: `ramtrain <command> [options]` dispatched to the
// subcommands, as a function (main.cpp and the Python module's
// `python -m ramtrain` call it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/quote.h"

namespace rt::cli {

namespace {

const char* kUsage = R"(ramtrain - train and fine-tune transformer LLMs with all training state in host RAM

Usage: ramtrain <command> [options]

Commands:
  train     train or fine-tune a model (from a HF model directory or a built-in preset)
  sample    generate text from a model directory
  tokenize  pre-tokenize text and .jsonl corpora into a token file with a model's tokenizer
  render    show fine-tuning examples with the tokens that carry loss highlighted
  export    write a checkpoint as a HF model directory (config.json, safetensors, tokenizer)
  loss      compute the loss (and optionally every gradient) of a HF model on token sequences
  eval      mean loss per token and perplexity of a model over a whole dataset
  plan      host RAM, device plan and predicted step time of a run on a given card and host

Run 'ramtrain <command> --help' (or 'ramtrain help <command>') for the options of a command.

Examples:
  ramtrain train --preset tiny-byte --data README.md --steps 200 --out runs/demo
  ramtrain train --resume auto --out runs/demo
  ramtrain export runs/demo/ckpt-00000200 --out runs/demo/hf
  ramtrain sample --model runs/demo/final --prompt "The " --max-tokens 200
  ramtrain train --model ./Qwen2.5-0.5B-Instruct --data chat.jsonl --steps 100 --out runs/chat
  ramtrain sample --model runs/chat/final --chat --prompt "Hello!"
  ramtrain tokenize corpus/ --tokenizer ./Qwen2.5-0.5B --out corpus.tok
  ramtrain loss --model path/to/hf_model --tokens seqs.txt --json
  ramtrain eval --model runs/chat/final --data held_out.jsonl
  ramtrain plan --preset qwen2.5-7b --gpu rtx3080 --micro-batch 2 --grad-accum 16
)";

// The subcommands: add a line here (and to kUsage) for a new one.
struct Command {
  const char* name;
  CommandFn run;
};
const Command kCommands[] = {
    {"train", cmd_train},   {"sample", cmd_sample}, {"tokenize", cmd_tokenize}, {"export", cmd_export},
    {"loss", cmd_loss},     {"eval", cmd_eval},     {"render", cmd_render},     {"plan", cmd_plan},
};

}  // namespace

CommandFn find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return c.run;
  return nullptr;
}

int run_cli(const Args& argv) {
  Args args = argv;
  // "ramtrain help CMD" is "ramtrain CMD --help".
  if (args.size() >= 2 && args[0] == "help" && find_command(args[1])) args = {args[1], "--help"};
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() >= 2) std::fprintf(stderr, "ramtrain: unknown command '%s'\n\n", args[1].c_str());
    std::fputs(kUsage, args.empty() || args.size() >= 2 ? stderr : stdout);
    return args.empty() || args.size() >= 2 ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::puts("ramtrain 0.1.0");
    return 0;
  }
  std::string cmd = args[0];
  rt::cli::Args rest(args.begin() + 1, args.end());
  // one rank of several (a launcher's, or train --nproc-per-node's): its errors say which
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  const std::string who =
      rank && world && std::string(world) != "1" ? cmd + " (rank " + rank + " of " + world + ")" : cmd;
  try {
    if (CommandFn run = find_command(cmd)) return run(rest);
    std::fprintf(stderr, "ramtrain: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const rt::Error& e) {
    std::fflush(stdout);
    // A backstop: a message that quotes huge input somewhere quote_input was not used is cut too.
    std::fprintf(stderr, "ramtrain %s: error: %s\n", who.c_str(), rt::quote_input(e.what(), 4000).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "ramtrain %s: error: out of host memory\n", who.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ramtrain %s: internal error: %s\n", who.c_str(), rt::quote_input(e.what(), 4000).c_str());
    return 3;
  }
}

}  // namespace rt::cli
