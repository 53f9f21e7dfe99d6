// Tokenizers: text <-> token ids for the model families ramtrain trains.
// tokenizer_load(dir) picks the format from the files in a HF model dir:
//   DIR/tokenizer.json  -> HF BPE (GPT-2, Llama-2, Llama-3, Qwen2/2.5/3,
//                          DeepSeek layouts; see hf_bpe.h)
//   DIR/tokenizer.model -> SentencePiece (Llama-2, Mistral, ...; see sentencepiece.h)
// and reads DIR/tokenizer_config.json (and for SentencePiece added_tokens.json
// and special_tokens_map.json), when present, for bos/eos and added tokens.
// With both files, tokenizer.json is used when every part of it is supported
// (it is what transformers loads by default), else tokenizer.model; the choice
// and its reason go to stderr.
// Contract: encode() takes valid UTF-8 (invalid input throws rt::Error naming
// the byte offset) and reproduces HF tokenizers' ids exactly; add_special
// applies the model's single-sequence template (e.g. Llama-3's BOS).
// decode() turns ids back into UTF-8 (partial byte sequences become U+FFFD);
// skip_special drops special tokens. Every method is const and thread-safe.
// encode_with_offsets() gives the same ids plus each token's byte span in the
// text, as HF's offsets mapping does (added tokens included): a token's span
// covers the original bytes its normalized bytes came from, whole characters
// (a byte-level token holding part of a UTF-8 character spans the character);
// a character a normalizer or pre-tokenizer prepends (Metaspace's "▁",
// ByteLevel's add_prefix_space " ", Prepend) belongs to the character it was
// put before. Template tokens (add_special) have empty spans at 0 or
// text.size().
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rt {

// Bytes [begin, end) of the text given to encode_with_offsets.
struct TokenSpan {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  virtual std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special,
                                                   std::vector<TokenSpan>& spans) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;

  // One past the largest id (vocabulary plus added tokens): the embedding rows needed.
  virtual int32_t vocab_size() const = 0;
  // The id of a token spelled as the tokenizer file spells it (added tokens
  // first, e.g. "<|im_end|>"; byte-level vocab entries as in the file, e.g. "Ġthe").
  virtual std::optional<int32_t> token_to_id(std::string_view name) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // "hf-bpe" (byte-level tokenizer.json), "hf-char-bpe" (SentencePiece-style
  // tokenizer.json) or "sentencepiece", plus the file it came from, for logs.
  virtual std::string describe() const = 0;
  // True when encoding a text in pieces cut just after a '\n' between two
  // printable non-space ASCII bytes (data/records.h) gives the ids of the
  // whole text: the byte-level layouts, whose pre-tokenizers never merge
  // across such a point. Not SentencePiece (a dummy prefix per call) nor the
  // character-level tokenizer.json layouts (Prepend / Metaspace per piece,
  // the whole text one BPE word).
  virtual bool encodes_line_pieces_exactly() const { return false; }
};

std::unique_ptr<Tokenizer> tokenizer_load(const std::string& model_dir);

}  // namespace rt
