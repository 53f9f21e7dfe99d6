// The data half of `ramtrain train`: its options and the BatchSource they open.
//   one token file                 -> the window Dataset (data/dataset.h)
//   text / .jsonl with a tokenizer -> FinetuneDataset (data/finetune.h) with the
//                                     model dir's tokenizer (or --tokenizer DIR)
//                                     and chat template (chat_template in the
//                                     tokenizer dir, else a built-in chat format;
//                                     --chat-format forces a built-in one)
//   text with a byte-vocab model   -> byte-level text in the window Dataset
//     and no tokenizer                (the tiny-byte path, unchanged)
// Every other combination is refused with a message that says what to pass.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.h"
#include "data/chat_format.h"
#include "data/jinja_template.h"
#include "data/dataset.h"
#include "model/spec.h"
#include "tokenizer/tokenizer.h"

namespace rt::cli {

// --tokenizer --data-format --text-split --chat-format --truncate --bad-lines --pack
void train_data_options(ArgParser& p);

struct TrainData {
  std::unique_ptr<Tokenizer> tokenizer;          // null: byte-level text, or a token file with no tokenizer at hand
  std::unique_ptr<ChatTemplate> chat;            // null: no chat format (none needed, or none detected)
  std::unique_ptr<jinja::Template> hf_template;  // the tokenizer dir's chat_template (null: none, or --chat-format)
  std::unique_ptr<BatchSource> source;
  bool byte_text = false;     // the byte-level text path
  std::string tokenizer_dir;  // holds the tokenizer files ("" none): the export copies them
};

// model_dir: the --model directory ("" with --preset). val_fraction >= 0
// overrides --val-fraction (0 for --eval-data, which is all held out).
// flag: the option that named the paths, for messages.
TrainData train_data_open(const ArgParser& p, const std::vector<std::string>& paths, const ModelSpec& spec,
                          const std::string& model_dir, uint64_t seed, double val_fraction = -1,
                          const char* flag = "--data");

}  // namespace rt::cli
