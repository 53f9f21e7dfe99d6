// tokenizer_load: picks the tokenizer format from the files in a model dir.
#include "tokenizer/tokenizer.h"

#include <cstdio>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/hf_bpe.h"
#include "tokenizer/sentencepiece.h"

namespace rt {

std::unique_ptr<Tokenizer> tokenizer_load(const std::string& model_dir) {
  RT_CHECK(is_directory(model_dir), "[tokenizer] ", model_dir, " is not a directory; pass the model directory");
  const std::string json_path = path_join(model_dir, "tokenizer.json");
  const std::string config_path = path_join(model_dir, "tokenizer_config.json");
  const std::string model_path = path_join(model_dir, "tokenizer.model");
  const bool has_json = file_exists(json_path), has_model = file_exists(model_path);
  auto load_json = [&] {
    return hf_bpe_tokenizer_load(json_path, file_exists(config_path) ? config_path : std::string());
  };
  if (has_json && has_model) {
    // tokenizer.json is what transformers' AutoTokenizer loads (the fast
    // tokenizer): the reference when ramtrain implements all of it.
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = load_json();
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "tokenizer: %s has tokenizer.json and tokenizer.model; using tokenizer.model (SentencePiece) "
                   "because tokenizer.json cannot be read exactly: %s\n",
                   model_dir.c_str(), e.what());
      return sentencepiece_tokenizer_load(model_path, model_dir);
    }
    std::fprintf(stderr,
                 "tokenizer: %s has tokenizer.json and tokenizer.model; using tokenizer.json because ramtrain reads "
                 "its whole pipeline exactly and it is what transformers' AutoTokenizer loads\n",
                 model_dir.c_str());
    return tok;
  }
  if (has_json) return load_json();
  if (has_model) return sentencepiece_tokenizer_load(model_path, model_dir);
  fail("[tokenizer] no tokenizer in ", model_dir, ": looked for ", json_path, " (HF tokenizers) and ", model_path,
       " (SentencePiece); copy the tokenizer files of the model into that directory");
}

}  // namespace rt
