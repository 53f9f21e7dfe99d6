// SentencePiece tokenizer.model through libsentencepiece (Llama-2, Mistral, ...),
// with the added and special tokens transformers' LlamaTokenizer (legacy mode)
// and the Llama-2 tokenizer.json recognise inside text:
//   - the model's unk, bos and eos pieces (<unk>, <s>, </s>);
//   - DIR/tokenizer_config.json "added_tokens_decoder" {id: {content, lstrip,
//     rstrip, single_word, special}}, and its bos/eos/unk/pad/sep/cls/mask_token
//     and additional_special_tokens (strings or {"content": ...});
//   - DIR/added_tokens.json {content: id} (ids may lie past the model's pieces);
//   - DIR/special_tokens_map.json, same keys as tokenizer_config.json.
// encode() splits the text on those tokens first (leftmost-longest, lstrip /
// rstrip / single_word as HF applies them) and encodes each piece in between
// with SentencePiece, which adds its dummy "▁" prefix to every piece, as HF's
// legacy mode does. add_special prepends bos (add_bos_token, default true) and
// appends eos (add_eos_token, default false).
// decode() writes added tokens as their text (special ones dropped with
// skip_special), SentencePiece decodes the runs in between; a run after
// emitted text keeps the space of its leading "▁" (HF's fast decoder does:
// "<s> Hello"). Ids that are neither pieces nor added tokens are dropped.
// tokenizer_config.json "legacy": false (no dummy prefix after a special
// token) is not implemented: loading such a model prints a warning, and
// tokenizer_load prefers the model's tokenizer.json when it can read it.
#pragma once
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace rt {

// model_dir: where the JSON files above are looked up ("" = none).
std::unique_ptr<Tokenizer> sentencepiece_tokenizer_load(const std::string& model_path, const std::string& model_dir);

}  // namespace rt
