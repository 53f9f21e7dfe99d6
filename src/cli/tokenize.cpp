// ramtrain tokenize: pre-tokenize text and .jsonl corpora into one ramtrain
// token file with a model's tokenizer. Documents are encoded in parallel on
// the thread pool (long documents in pieces cut where the ids cannot change,
// data/records.h) and written in input order through a streaming atomic
// writer, so the output is identical for any --threads. Each text document
// is the tokenizer's template (e.g. BOS) + its ids + EOS (when the tokenizer
// has one). Chat, instruction and prompt/completion records (.jsonl, .json)
// become documents whose ids are exactly the chat template's rendering (the
// tokenizer dir's chat_template, or --chat-format), and their loss masks go
// to OUT.mask beside the token file (data/loss_mask_file.h), which
// `train --data OUT` reads with it.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "data/finetune.h"
#include "data/hf_chat_template.h"
#include "data/loss_mask_file.h"
#include "data/records.h"
#include "io/token_file.h"
#include "tokenizer/tokenizer.h"

namespace rt::cli {

int cmd_tokenize(const Args& raw_args) {
  // Words that are neither options nor option values are the inputs.
  Args args;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    const std::string& a = raw_args[i];
    if (a.rfind("--", 0) == 0) {
      args.push_back(a);
      if (a != "--help" && a.find('=') == std::string::npos && i + 1 < raw_args.size()) args.push_back(raw_args[++i]);
    } else {
      inputs.push_back(a);
    }
  }
  ArgParser p("tokenize",
              "Pre-tokenizes text and .jsonl files into one ramtrain token file (docs/token_format.md) with a model's\n"
              "tokenizer, for `ramtrain train --data OUT.bin`. Inputs are files or directories (searched for text\n"
              "files as `train --data` does). A document is the tokenizer's template (e.g. BOS) + its ids + EOS.\n"
              "Text: one document per file, or per blank-line-separated paragraph. .jsonl/.json: one record per\n"
              "line/element; chat, instruction and prompt/completion records are rendered with the tokenizer dir's\n"
              "chat_template (or --chat-format) and their loss masks are written to OUT.mask, which train reads\n"
              "together with OUT (docs/token_format.md).",
              "  ramtrain tokenize corpus/ --tokenizer ./Qwen2.5-0.5B --out corpus.tok\n"
              "  ramtrain tokenize a.jsonl b.jsonl --tokenizer ./Llama-3.2-1B --out ab.tok --threads 16\n");
  p.option("tokenizer", "DIR", "model directory with tokenizer.json or tokenizer.model");
  p.option("out", "OUT", "output token file (written atomically)");
  p.option("format", "auto|text|jsonl", "input format (auto: *.jsonl jsonl, *.json a JSON array, the rest text)",
           "auto")
      .choice({"auto", "text", "jsonl"});
  p.option(
      "chat-format", "chatml|llama3|mistral",
      "built-in chat format for chat records (default: the tokenizer dir's chat_template, else from the tokenizer)")
      .choice({"chatml", "llama3", "mistral"});
  p.option("chat-template-var", "NAME=VALUE...",
           "variables for the model's chat_template, NAME=VALUE (VALUE as JSON when it is, else a string), e.g. "
           "reasoning_effort=high enable_thinking=false")
      .list();
  p.option("text-split", "file|blank-lines", "text documents: one per file, or split at blank lines", "file")
      .choice({"file", "blank-lines"});
  p.option("bad-lines", "abort|skip", "bad records (malformed JSON, invalid UTF-8, ...): stop, or skip and count",
           "abort")
      .choice({"abort", "skip"});
  p.option("threads", "N", "encoding threads (0: all cores)", "0").integer(0);
  if (!p.parse(args)) return 0;
  if (inputs.empty()) fail("[tokenize] give one or more input files or directories");
  const std::string out = p.require("out");
  const std::string tok_dir = p.require("tokenizer");
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));

  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    if (is_directory(in)) {
      for (auto& f : text_document_paths({in})) files.push_back(f);
    } else if (is_record_stream(in)) {
      files.push_back(in);
    } else {
      require_regular_file(in, "[tokenize]", /*dir_ok=*/true);
      if (const TokenStream::Look look = TokenStream::look(in); look != TokenStream::Look::none)
        fail("[tokenize] ", in, ": is ", look == TokenStream::Look::token ? "" : "named or begins like ",
             "a token file already; tokenize takes text and .jsonl files (train takes the token file directly)");
      files.push_back(in);
    }
  }
  {  // the output must not replace an input
    namespace fs = std::filesystem;
    std::error_code e1, e2, e3;
    const fs::path o = fs::weakly_canonical(out, e1), om = fs::weakly_canonical(loss_mask_path(out), e2);
    for (const std::string& f : files) {
      const fs::path c = fs::weakly_canonical(f, e3);
      if (!e1 && !e3 && c == o)
        fail("[tokenize] --out ", out, " is also an input: the token file would replace it. Pick another --out");
      if (!e2 && !e3 && c == om)
        fail("[tokenize] --out ", out, ": its loss-mask file ", loss_mask_path(out),
             " is an input, which writing it would replace. Pick another --out");
    }
  }
  const auto tok = tokenizer_load(tok_dir);
  RecordOptions ro;
  ro.format = data_format_parse(p.str("format"));
  ro.text_split = text_split_parse(p.str("text-split"));
  ro.bad_records = bad_record_policy_parse(p.str("bad-lines"));
  ro.progress = true;
  ro.label = "tokenize";
  // Byte-level BPE encodes long documents in exact pieces; SentencePiece adds a prefix space per call.
  ro.piece_bytes = tok->describe().rfind("hf-bpe", 0) == 0 ? (1u << 20) : 0;
  std::unique_ptr<ChatTemplate> chat;
  std::string no_chat;
  std::optional<ChatFormat> cf;
  if (p.has("chat-format")) cf = chat_format_parse(p.str("chat-format"));
  std::optional<HfChatTemplate> hf;
  if (!cf) hf = hf_chat_template_find(tok_dir);
  if (hf) hf_chat_vars_assign(p.list("chat-template-var"), hf->specials, "--chat-template-var");
  if (!cf && !hf) cf = chat_format_detect(*tok, Family::llama, &no_chat);
  if (cf) chat = std::make_unique<ChatTemplate>(*tok, *cf);
  std::unique_ptr<jinja::Template> tpl;
  if (hf) tpl = std::make_unique<jinja::Template>(hf->source, hf->origin);
  ExampleEncoder enc(*tok, chat.get(), no_chat, /*text_only=*/false, /*with_masks=*/true);
  if (hf) enc.use_hf_template(tpl.get(), hf->specials);

  TokenFileWriter writer(out, static_cast<uint64_t>(tok->vocab_size()));
  LossMaskWriter masks(loss_mask_path(out));
  bool masked = false;  // some token is untrained: the mask file is needed
  uint64_t docs = 0;
  RecordStats st = records_for_each(
      files, ro, [&](const RecordPiece& piece, EncodedPiece& e) { enc.encode(piece, e); },
      [&](const char*, std::vector<int32_t>& ids, std::vector<uint8_t>& trained) {
        writer.append(ids);
        size_t b = 0;  // a record may hold several examples (ExampleEncoder::example_start): one document each
        for (size_t k = 1; k <= ids.size(); ++k) {
          if (k < ids.size() && !(trained[k] & ExampleEncoder::example_start)) continue;
          masks.append(std::span<const uint8_t>(trained).subspan(b, k - b));
          ++docs;
          b = k;
        }
        for (uint8_t f : trained) masked |= !(f & 1);
      });
  if (writer.count() == 0)
    fail("[tokenize] no tokens in ", files.size() == 1 ? files[0] : cat(files.size(), " files"), ": ", st.summary(),
         "; give files that hold text or records");
  if (masked) masks.commit();  // before the token file: a crash in between leaves a count mismatch, which is refused
  writer.commit();
  const std::string mask_path = loss_mask_path(out);
  if (!masked && file_exists(mask_path)) {
    std::remove(mask_path.c_str());
    std::printf("removed the stale %s (these documents have no loss masks)\n", mask_path.c_str());
  }
  const double mb = static_cast<double>(st.bytes) / 1e6;
  std::printf("tokenized %s\n", st.summary().c_str());
  std::printf("%llu documents, %.1f MB -> %llu tokens in %.2f s: %.2f MB/s, %.0f tokens/s (%d threads, %s)\n",
              (unsigned long long)docs, mb, (unsigned long long)writer.count(), st.seconds,
              st.seconds > 0 ? mb / st.seconds : 0.0,
              st.seconds > 0 ? static_cast<double>(writer.count()) / st.seconds : 0.0, global_pool().size(),
              tok->describe().c_str());
  std::printf("wrote %s: %llu bytes, ramtrain token format, vocab %d, %d bytes per token\n", out.c_str(),
              (unsigned long long)writer.bytes(), tok->vocab_size(), tok->vocab_size() <= 65536 ? 2 : 4);
  if (masked)
    std::printf("wrote %s: the loss mask of every token (chat template: %s)\n", mask_path.c_str(),
                hf     ? hf->origin.c_str()
                : chat ? chat_format_name(chat->format())
                       : "none");
  return 0;
}

}  // namespace rt::cli
