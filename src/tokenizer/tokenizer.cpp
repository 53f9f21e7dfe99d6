// tokenizer_load: picks the tokenizer format from the files in a model dir.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/hf_bpe.h"
#include "tokenizer/sentencepiece.h"

namespace rt {

std::unique_ptr<Tokenizer> tokenizer_load(const std::string& model_dir) {
  RT_CHECK(is_directory(model_dir), "[tokenizer] ", model_dir, " is not a directory; pass the model directory");
  const std::string json_path = path_join(model_dir, "tokenizer.json");
  const std::string config_path = path_join(model_dir, "tokenizer_config.json");
  if (file_exists(json_path))
    return hf_bpe_tokenizer_load(json_path, file_exists(config_path) ? config_path : std::string());
  const std::string model_path = path_join(model_dir, "tokenizer.model");
  if (file_exists(model_path)) return sentencepiece_tokenizer_load(model_path);
  fail("[tokenizer] no tokenizer in ", model_dir, ": looked for ", json_path, " (HF tokenizers) and ", model_path,
       " (SentencePiece); copy the tokenizer files of the model into that directory");
}

}  // namespace rt
