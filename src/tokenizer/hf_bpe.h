// HF tokenizer.json reader for BPE models: byte-level (GPT-2, Llama-3,
// Qwen2/2.5/3, DeepSeek) and SentencePiece-style over characters with byte
// fallback (the Llama-2-era tokenizer.json).
// Supported, everything else refused with an rt::Error naming the field:
//   model:          BPE (vocab, merges as "a b" strings or [a, b] pairs,
//                   ignore_merges, byte_fallback, unk_token/fuse_unk); no dropout,
//                   no continuing_subword_prefix / end_of_word_suffix.
//   normalizer:     null, NFC, Prepend, Replace, or a Sequence of those (hf_pipeline.h).
//   pre_tokenizer:  null (the normalized text is one word), ByteLevel (add_prefix_space,
//                   use_regex = GPT-2's regex), Split (Regex or String pattern,
//                   behavior Isolated or Removed, invert), Digits (individual_digits),
//                   Metaspace (replacement, prepend_scheme always/never/first, split),
//                   or a Sequence of those with ByteLevel, if any, last. Regexes run on
//                   PCRE2. With a ByteLevel step BPE runs on the bytes of each
//                   pre-token; without one, on its characters (missing ones become
//                   <0xXX> byte tokens with byte_fallback, else unk).
//   added_tokens:   matched before pre-tokenization, leftmost-longest; tokens with
//                   normalized=false on the raw text, the others (spelled as the
//                   normalizer rewrites them) on the normalized text; single_word,
//                   lstrip and rstrip as HF applies them (added_tokens.h).
//   post_processor: null, ByteLevel, TemplateProcessing (single form), or a
//                   Sequence of those: add_special adds the template's tokens.
//   decoder:        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, or a
//                   Sequence of those (Llama-2: Replace, ByteFallback, Fuse, Strip);
//                   null joins the tokens with spaces, as HF does.
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
