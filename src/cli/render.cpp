// ramtrain render: shows fine-tuning examples as training sees them, with
// the tokens that carry loss highlighted: the records are encoded by the same
// ExampleEncoder as `train` (the model's chat_template, or --chat-format),
// then each example's ids are decoded in runs of equal loss flag. Trained runs
// are green (ANSI) or, with --plain (and whenever stdout is not a terminal),
// wrapped in [[ and ]].
#include <unistd.h>

#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/dataset.h"
#include "data/finetune.h"
#include "data/hf_chat_template.h"
#include "data/records.h"
#include "io/token_file.h"
#include "tokenizer/tokenizer.h"

namespace rt::cli {

namespace {

struct RenderLimit {};  // thrown by the sink to stop after --limit examples

}  // namespace

int cmd_render(const Args& raw_args) {
  Args args;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    const std::string& a = raw_args[i];
    if (a.rfind("--", 0) == 0) {
      args.push_back(a);
      if (a != "--help" && a != "--plain" && a.find('=') == std::string::npos && i + 1 < raw_args.size())
        args.push_back(raw_args[++i]);
    } else {
      inputs.push_back(a);
    }
  }
  ArgParser p("render",
              "Prints fine-tuning examples (text, .jsonl and .json records: docs/finetune_data.md) as `train` encodes\n"
              "them with the model's tokenizer and chat template, with the tokens that carry loss highlighted:\n"
              "green on a terminal, [[like this]] with --plain or when the output is not a terminal.",
              "  ramtrain render chat.jsonl --model ./Qwen2.5-0.5B-Instruct\n"
              "  ramtrain render alpaca.json --model ./Llama-3.2-1B-Instruct --limit 3 --plain\n");
  p.option("model", "DIR", "model directory with the tokenizer files (and its chat_template)");
  p.option("chat-template-var", "NAME=VALUE...",
           "variables for the model's chat_template, NAME=VALUE (VALUE as JSON when it is, else a string), e.g. "
           "reasoning_effort=high enable_thinking=false")
      .list();
  p.option("chat-format", "chatml|llama3|mistral", "built-in chat format instead of the model's chat_template")
      .choice({"chatml", "llama3", "mistral"});
  p.option("data-format", "auto|text|jsonl", "input format (auto: *.jsonl jsonl, *.json a JSON array, the rest text)",
           "auto")
      .choice({"auto", "text", "jsonl"});
  p.option("bad-lines", "abort|skip", "bad records (malformed JSON, invalid UTF-8, ...): stop, or skip and count",
           "abort")
      .choice({"abort", "skip"});
  p.option("limit", "N", "examples to print (0: all)", "5");
  p.flag("plain", "mark trained tokens with [[ ]] instead of colour");
  if (!p.parse(args)) return 0;
  if (inputs.empty()) fail("[render] give one or more data files");
  for (const std::string& in : inputs)
    if (const TokenStream::Look look = TokenStream::look(in); look != TokenStream::Look::none)
      fail("[render] ", in, ": is ", look == TokenStream::Look::token ? "" : "named or begins like ",
           "a token file; render shows text and .jsonl records as they are tokenized");
  const std::string dir = resolve_model_dir(p.require("model"));
  const int64_t limit = p.integer("limit");
  if (limit < 0) fail("[render] --limit must be >= 0, got ", limit);
  const bool ansi = !p.on("plain") && ::isatty(STDOUT_FILENO);

  const auto tok = tokenizer_load(dir);
  std::unique_ptr<ChatTemplate> chat;
  std::string no_chat;
  std::optional<ChatFormat> cf;
  if (p.has("chat-format")) cf = chat_format_parse(p.str("chat-format"));
  std::optional<HfChatTemplate> hf;
  if (!cf) hf = hf_chat_template_find(dir);
  if (hf) hf_chat_vars_assign(p.list("chat-template-var"), hf->specials, "--chat-template-var");
  if (!cf && !hf) {
    // the tokenizer's special tokens pick chatml/llama3; [INST] (mistral) when it has BOS and EOS
    cf = chat_format_detect(*tok, Family::llama, &no_chat);
  }
  if (cf) chat = std::make_unique<ChatTemplate>(*tok, *cf);
  std::unique_ptr<jinja::Template> tpl;
  if (hf) tpl = std::make_unique<jinja::Template>(hf->source, hf->origin);
  ExampleEncoder enc(*tok, chat.get(),
                     no_chat.empty() ? "the model dir has no chat_template; pass --chat-format" : no_chat,
                     /*text_only=*/false, /*with_masks=*/true);
  if (hf) enc.use_hf_template(tpl.get(), hf->specials);
  std::printf("tokenizer: %s; chat template: %s\n", tok->describe().c_str(),
              hf     ? hf->origin.c_str()
              : chat ? chat_format_name(chat->format())
                     : "none");

  RecordOptions ro;
  ro.format = data_format_parse(p.str("data-format"));
  ro.bad_records = bad_record_policy_parse(p.str("bad-lines"));
  int64_t shown = 0;
  const char* on = ansi ? "\x1b[1;32m" : "[[";
  const char* off = ansi ? "\x1b[0m" : "]]";
  auto show = [&](const char* kind, const int32_t* ids, const uint8_t* trained, size_t n) {
    size_t n_trained = 0;
    for (size_t k = 0; k < n; ++k) n_trained += trained[k] & 1;
    std::printf("=== example %lld (%s): %zu tokens, %zu trained ===\n", (long long)shown + 1, kind, n, n_trained);
    std::string out;
    for (size_t b = 0; b < n;) {
      size_t e = b + 1;
      while (e < n && (trained[e] & 1) == (trained[b] & 1)) ++e;
      const std::string text = tok->decode(std::span<const int32_t>(ids + b, e - b), /*skip_special=*/false);
      if (trained[b] & 1)
        out += on + text + off;
      else
        out += text;
      b = e;
    }
    std::printf("%s\n", out.c_str());
    if (++shown == limit) throw RenderLimit{};
  };
  try {
    records_for_each(
        inputs, ro, [&](const RecordPiece& piece, EncodedPiece& e) { enc.encode(piece, e); },
        [&](const char* kind, std::vector<int32_t>& ids, std::vector<uint8_t>& trained) {
          size_t b = 0;
          for (size_t k = 1; k <= ids.size(); ++k) {
            if (k < ids.size() && !(trained[k] & ExampleEncoder::example_start)) continue;
            show(kind, ids.data() + b, trained.data() + b, k - b);
            b = k;
          }
        });
  } catch (const RenderLimit&) {
  }
  if (shown == 0) fail("[render] no examples in ", inputs[0], inputs.size() > 1 ? " and the others" : "");
  return 0;
}

}  // namespace rt::cli
