#include "cli/train_data.h"

#include <cstdio>

#include "core/error.h"
#include "core/fs.h"
#include "data/byte_tokenizer.h"
#include "data/finetune.h"
#include "data/hf_chat_template.h"
#include "data/loss_mask_file.h"
#include "data/records.h"

namespace rt::cli {

void train_data_options(ArgParser& p) {
  p.option("tokenizer", "DIR", "tokenizer for text/.jsonl data (default: the --model dir's tokenizer.json/.model)");
  p.option("data-format", "auto|text|jsonl", "format of non-token data files (auto: *.jsonl is jsonl, the rest text)",
           "auto")
      .choice({"auto", "text", "jsonl"});
  p.option("text-split", "blank-lines|file", "text data: one example per blank-line-separated block, or per file",
           "blank-lines")
      .choice({"blank-lines", "file"});
  p.option("chat-format", "chatml|llama3|mistral",
           "built-in chat format for chat/instruction records (default: the model's chat_template, else from the "
           "tokenizer)")
      .choice({"chatml", "llama3", "mistral"});
  p.option("chat-template-var", "NAME=VALUE...",
           "variables for the model's chat_template, NAME=VALUE (VALUE as JSON when it is, else a string), e.g. "
           "reasoning_effort=high enable_thinking=false")
      .list();
  p.option("truncate", "keep-start|drop|split", "examples longer than seq-len+1 tokens: keep the start, drop, or split",
           "keep-start")
      .choice({"keep-start", "drop", "split"});
  p.option("bad-lines", "abort|skip",
           "bad records (malformed JSON, invalid UTF-8, unknown role, ...): stop, or skip and count", "abort")
      .choice({"abort", "skip"});
  p.option("pack", "yes|no", "pack several short examples into each sequence (positions restart per example)", "yes")
      .choice({"yes", "no"});
  p.option("pack-attention", "masked|cross",
           "packed examples: attention stays inside each example (masked), or also sees the earlier examples of its "
           "sequence (cross)",
           "masked")
      .choice({"masked", "cross"});
}

namespace {

// --pack and --pack-attention into fo.
void pack_options_parse(const ArgParser& p, FinetuneOptions& fo) {
  const std::string pack = p.str("pack");
  if (pack != "yes" && pack != "no") fail("[train] --pack must be yes or no, got '", pack, "'");
  fo.pack = pack == "yes";
  const std::string att = p.str("pack-attention");
  if (att != "masked" && att != "cross") fail("[train] --pack-attention must be masked or cross, got '", att, "'");
  fo.pack_attention = pack_attention_parse(att);
}

// A byte-level model: the 258 byte/BOS/EOS ids, its embedding perhaps padded to a GPU-friendly multiple.
bool is_byte_vocab(int64_t vocab) { return vocab >= ByteTokenizer::vocab_size && vocab <= 512; }

bool has_tokenizer_files(const std::string& dir) {
  return !dir.empty() &&
         (file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.model")));
}

}  // namespace

TrainData train_data_open(const ArgParser& p, const std::vector<std::string>& paths, const ModelSpec& spec,
                          const std::string& model_dir, uint64_t seed, double val_fraction, const char* flag) {
  TrainData td;
  RT_CHECK(!paths.empty(), "[train] --data is required: text/.jsonl files, directories, or one token file");
  // Data is memory-mapped: a FIFO or a device is refused by what it is, before anything is read.
  for (const std::string& path : paths)
    if (!is_record_stream(path)) require_regular_file(path, cat("[data] ", flag), /*dir_ok=*/true);
  std::string tok_dir = p.has("tokenizer") ? p.str("tokenizer") : std::string();
  if (tok_dir.empty() && has_tokenizer_files(model_dir)) tok_dir = model_dir;
  if (p.has("tokenizer") && !has_tokenizer_files(tok_dir))
    fail("[train] --tokenizer ", tok_dir, " holds neither tokenizer.json nor tokenizer.model");
  DatasetOptions dopt;
  dopt.seq_len = p.integer("seq-len");
  dopt.val_fraction = val_fraction >= 0 ? val_fraction : p.number("val-fraction");
  dopt.seed = seed;
  dopt.vocab_size = static_cast<uint64_t>(spec.vocab);

  if (paths.size() == 1 && TokenStream::looks_like_token_file(paths[0])) {
    td.tokenizer_dir = tok_dir;
    // The header's vocabulary: every id must lie below it (else the file is
    // damaged), and one that differs from the model's tokenizer suggests the
    // file was made with another tokenizer (the ids would mean other text).
    auto check_header = [&](const TokenStream& t) {
      const uint64_t hv = t.vocab_size();
      if (hv == 0) return;
      t.validate_ids(hv, /*header=*/true);
      if (!tok_dir.empty()) {
        const uint64_t mv = static_cast<uint64_t>(tokenizer_load(tok_dir)->vocab_size());
        if (mv != hv)
          std::printf("warning: %s was tokenized for a vocabulary of %llu tokens, the model's tokenizer (%s) has %llu: "
                      "was it made with another tokenizer? (ramtrain tokenize --tokenizer %s makes a matching one)\n",
                      paths[0].c_str(), (unsigned long long)hv, tok_dir.c_str(), (unsigned long long)mv,
                      tok_dir.c_str());
      }
    };
    if (file_exists(loss_mask_path(paths[0]))) {  // tokenized chat data: documents with loss masks
      TokenStream tokens = TokenStream::open(paths[0]);
      check_header(tokens);
      tokens.validate_ids(static_cast<uint64_t>(spec.vocab));
      const LossMaskFile mask(loss_mask_path(paths[0]), tokens.size());
      FinetuneOptions fo;
      fo.seq_len = dopt.seq_len;
      fo.val_fraction = dopt.val_fraction;
      fo.seed = seed;
      fo.truncation = truncation_parse(p.str("truncate"));
      pack_options_parse(p, fo);
      fo.pad_id = 0;
      auto ds = std::make_unique<FinetuneDataset>(tokens, mask, fo);
      std::printf("token file %s with loss masks %s\n%s\n", paths[0].c_str(), loss_mask_path(paths[0]).c_str(),
                  ds->stats().summary().c_str());
      td.source = std::move(ds);
      return td;
    }
    TokenStream tokens = TokenStream::open(paths[0]);
    check_header(tokens);
    td.source = std::make_unique<Dataset>(std::move(tokens), dopt);
    return td;
  }
  for (const std::string& path : paths) {
    const TokenStream::Look look = TokenStream::look(path);
    if (look == TokenStream::Look::token)
      fail("[data] ", path,
           ": is a token file; give one token file on its own, or only text/.jsonl files and directories");
    if (look == TokenStream::Look::damaged)
      fail("[data] ", path,
           ": is named or begins like a ramtrain token file but has no valid RTTOKENS header: the file is damaged "
           "(tokenize the data again with ramtrain tokenize), or rename it if it is text");
  }
  const DataFormat format = data_format_parse(p.str("data-format"));
  bool any_jsonl = false;
  for (const std::string& path : paths)
    any_jsonl |= (file_exists(path) || is_record_stream(path)) && (path_is_jsonl(path, format) || path_is_json_array(path, format));

  if (tok_dir.empty()) {
    if (is_byte_vocab(spec.vocab) && !any_jsonl && format != DataFormat::jsonl) {
      td.byte_text = true;
      td.source = std::make_unique<Dataset>(load_text_documents(paths), dopt);
      return td;
    }
    if (!is_byte_vocab(spec.vocab))
      fail("[train] the data is text/.jsonl, which needs the model's tokenizer, but ",
         model_dir.empty() ? std::string("a preset has none") : model_dir + " has no tokenizer.json or tokenizer.model",
         ". Pass --tokenizer DIR (a model directory with the tokenizer files), pre-tokenize with `ramtrain tokenize`, "
         "or train a byte-level model (--preset tiny-byte) on plain text.");
  }
  // A byte-level model without a tokenizer directory reads records (text records; chat records have no format to
  // render with) through the byte tokenizer, so .jsonl files and Python's data= train it as they train any model.
  const bool byte_records = tok_dir.empty();
  if (byte_records) {
    if (p.has("chat-format"))
      fail("[train] --chat-format: a byte-level model has no chat tokens; train chat data on a model with a tokenizer "
           "(--model DIR, or --tokenizer DIR)");
    td.tokenizer = std::make_unique<ByteVocabTokenizer>();
    td.byte_text = true;
  } else {
    td.tokenizer = tokenizer_load(tok_dir);
    td.tokenizer_dir = tok_dir;
  }
  const Tokenizer& tok = *td.tokenizer;
  if (tok.vocab_size() > spec.vocab)
    fail("[train] the tokenizer ", tok.describe(), " has ", tok.vocab_size(), " ids but the model's vocab is ",
         spec.vocab, ": they do not belong together (pass the model's own tokenizer)");
  std::string no_chat = "a byte-level model has no chat format: give text records ({\"text\": ...}) or plain text, "
                        "or train chat data on a model with a tokenizer (--model DIR, or --tokenizer DIR)";
  std::optional<ChatFormat> cf;
  if (p.has("chat-format"))
    cf = chat_format_parse(p.str("chat-format"));
  else if (!byte_records)
    cf = chat_format_detect(tok, spec.family, &no_chat);
  if (cf) td.chat = std::make_unique<ChatTemplate>(tok, *cf);
  std::optional<HfChatTemplate> hf;
  if (!p.has("chat-format") && !byte_records) hf = hf_chat_template_find(tok_dir);
  if (hf) hf_chat_vars_assign(p.list("chat-template-var"), hf->specials, "--chat-template-var");
  if (hf) td.hf_template = std::make_unique<jinja::Template>(hf->source, hf->origin);

  std::vector<std::string> files;
  for (const std::string& path : paths) {
    if (is_directory(path)) {
      for (auto& f : text_document_paths({path})) files.push_back(f);
    } else {
      if (!file_exists(path) && !is_record_stream(path)) fail("[data] ", path, ": no such file or directory");
      files.push_back(path);
    }
  }
  FinetuneOptions fo;
  fo.seq_len = dopt.seq_len;
  fo.val_fraction = dopt.val_fraction;
  fo.seed = seed;
  fo.truncation = truncation_parse(p.str("truncate"));
  pack_options_parse(p, fo);
  fo.pad_id = tok.eos_id().value_or(0);
  fo.records.format = format;
  fo.records.text_split = text_split_parse(p.str("text-split"));
  fo.records.bad_records = bad_record_policy_parse(p.str("bad-lines"));
  fo.records.progress = true;
  fo.records.label = "encoding data";
  fo.records.piece_bytes = tok.describe().rfind("hf-bpe", 0) == 0 ? (1u << 20) : 0;
  ExampleEncoder enc(tok, td.chat.get(), no_chat, /*text_only=*/false, /*with_masks=*/true);
  if (hf) enc.use_hf_template(td.hf_template.get(), hf->specials);
  auto ds = std::make_unique<FinetuneDataset>(files, enc, fo);
  std::printf("tokenizer: %s (%d ids); chat format: %s\n%s\n", tok.describe().c_str(), tok.vocab_size(),
              hf        ? ("chat_template from " + hf->origin).c_str()
              : td.chat ? chat_format_name(td.chat->format())
                        : "none",
              ds->stats().summary().c_str());
  td.source = std::move(ds);
  return td;
}

}  // namespace rt::cli
