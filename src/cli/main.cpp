// ramtrain: train and fine-tune transformer LLMs larger than GPU memory.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

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

Run 'ramtrain <command> --help' for the options of a command.

Examples:
  ramtrain train --preset tiny-byte --data README.md --steps 200 --out runs/demo
  ramtrain train --resume auto --out runs/demo
  ramtrain export runs/demo/ckpt-00000200 --out runs/demo/hf
  ramtrain sample --model runs/demo/final --prompt "The " --max-tokens 200
  ramtrain train --model ./Qwen2.5-0.5B-Instruct --data chat.jsonl --steps 100 --out runs/chat
  ramtrain sample --model runs/chat/final --chat --prompt "Hello!"
  ramtrain tokenize corpus/ --tokenizer ./Qwen2.5-0.5B --out corpus.tok
  ramtrain loss --model path/to/hf_model --tokens seqs.txt --json
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::puts("ramtrain 0.1.0");
    return 0;
  }
  std::string cmd = args[0];
  rt::cli::Args rest(args.begin() + 1, args.end());
  try {
    if (cmd == "loss") return rt::cli::cmd_loss(rest);
    if (cmd == "train") return rt::cli::cmd_train(rest);
    if (cmd == "sample") return rt::cli::cmd_sample(rest);
    if (cmd == "tokenize") return rt::cli::cmd_tokenize(rest);
    if (cmd == "render") return rt::cli::cmd_render(rest);
    if (cmd == "export") return rt::cli::cmd_export(rest);
    std::fprintf(stderr, "ramtrain: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const rt::Error& e) {
    std::fprintf(stderr, "ramtrain %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ramtrain %s: error: out of host memory\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ramtrain %s: internal error: %s\n", cmd.c_str(), e.what());
    return 3;
  }
}
