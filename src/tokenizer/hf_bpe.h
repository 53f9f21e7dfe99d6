// HF tokenizer.json reader for byte-level BPE (GPT-2, Llama-3, Qwen2/2.5/3).
// Supported, everything else refused with an rt::Error naming the field:
//   model:          BPE (vocab, merges as "a b" strings or [a, b] pairs,
//                   ignore_merges, byte_fallback, unk_token/fuse_unk); no dropout,
//                   no continuing_subword_prefix / end_of_word_suffix.
//   normalizer:     null, NFC, or a Sequence of NFC (Unicode version: unicode.h).
//   pre_tokenizer:  ByteLevel (add_prefix_space, use_regex = GPT-2's regex), or a
//                   Sequence of Split (Regex or String pattern, behavior Isolated or
//                   Removed, invert) steps ending in ByteLevel. Regexes run on PCRE2.
//   added_tokens:   matched before pre-tokenization, leftmost-longest; tokens with
//                   normalized=false on the raw text, the others on the normalized
//                   text; single_word, lstrip and rstrip as HF applies them.
//   post_processor: null, ByteLevel, TemplateProcessing (single form), or a
//                   Sequence of those: add_special adds the template's tokens.
//   decoder:        ByteLevel (or a Sequence holding only ByteLevel).
// decode() drops ids the file does not define, as HF does.
// config_path: tokenizer_config.json for bos_token/eos_token ("" = none; then bos
// is the template's leading special token, if any, and eos is unknown).
#pragma once
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace rt {

std::unique_ptr<Tokenizer> hf_bpe_tokenizer_load(const std::string& json_path, const std::string& config_path);

}  // namespace rt
