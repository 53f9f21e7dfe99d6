// ramtrain sample: generate text from a model directory.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "data/byte_tokenizer.h"
#include "engine/sampler.h"

namespace rt::cli {

int cmd_sample(const Args& args) {
  ArgParser p("sample",
              "Generates text from a model directory written by 'ramtrain train' (byte-level tokenizer).\n"
              "Sampling is seeded: the same seed gives the same text.",
              "  ramtrain sample --model runs/demo/final --prompt \"Once upon a time\"\n"
              "  ramtrain sample --model runs/demo/final --prompt \"int main\" --temperature 0 --max-tokens 100\n");
  p.option("model", "DIR", "model directory (config.json + safetensors + tokenizer)");
  p.option("prompt", "TEXT", "text to continue", "");
  p.option("max-tokens", "N", "new tokens to generate", "200");
  p.option("temperature", "T", "softmax temperature (0: greedy)", "0.8");
  p.option("top-k", "K", "sample among the K most likely tokens (0: all)", "40");
  p.option("seed", "S", "random seed", "0");
  p.option("threads", "N", "CPU threads (0: all cores)", "0");
  if (!p.parse(args)) return 0;
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));
  const std::string dir = p.require("model");
  LoadedModel m = load_model_dir(dir, false);
  if (m.tokenizer != "byte")
    fail("[sample] ", dir, " has no tokenizer ramtrain can use yet (expected ramtrain_tokenizer.json from "
         "'ramtrain train'; HF tokenizer.json support is coming)");
  SampleOptions so;
  so.max_new_tokens = p.integer("max-tokens");
  so.temperature = p.number("temperature");
  so.top_k = p.integer("top-k");
  so.seed = static_cast<uint64_t>(p.integer("seed"));
  so.stop_ids = {ByteTokenizer::eos_id};
  so.vocab_limit = ByteTokenizer::vocab_size;
  RT_CHECK(so.max_new_tokens >= 0, "[sample] --max-tokens must be >= 0");
  RT_CHECK(so.temperature >= 0, "[sample] --temperature must be >= 0");
  ByteTokenizer tok;
  const std::string prompt = p.str("prompt");
  std::vector<int32_t> ids = tok.encode(prompt);
  ids.insert(ids.begin(), ByteTokenizer::bos_id);
  std::vector<int32_t> out = sample_tokens(*m.state, ids, so);
  std::printf("%s%s\n", prompt.c_str(), tok.decode(out).c_str());
  return 0;
}

}  // namespace rt::cli
