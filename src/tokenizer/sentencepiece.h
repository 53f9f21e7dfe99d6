// SentencePiece tokenizer.model through libsentencepiece (Llama-2, Mistral, ...).
// encode() is SentencePiece's own segmentation; add_special prepends the
// model's BOS when it defines one (the Llama-2 convention: BOS, no EOS).
// decode() drops control tokens (BOS/EOS/...) whatever skip_special says:
// SentencePiece has no text for them. Ids outside the model are dropped.
#pragma once
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace rt {

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_load(const std::string& model_path);

}  // namespace rt
