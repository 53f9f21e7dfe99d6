// ByteTokenizer: the built-in tokenizer for training from scratch on raw
// text. Vocab 258: ids 0..255 are the bytes themselves, 256 = BOS, 257 = EOS.
// encode never fails and never adds BOS/EOS unless asked; decode drops BOS/EOS
// and refuses ids outside [0, 258) with rt::Error. encode/decode round-trip
// any byte string exactly (no UTF-8 validation, no normalisation).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace rt {

class ByteTokenizer {
 public:
  static constexpr int32_t vocab_size = 258;
  static constexpr int32_t bos_id = 256;
  static constexpr int32_t eos_id = 257;

  // One id per byte of text, BOS first and EOS last when add_bos_eos is set.
  std::vector<int32_t> encode(std::string_view text, bool add_bos_eos = false) const;
  // Appends the ids of text (with BOS/EOS when add_bos_eos) to out.
  void encode_append(std::string_view text, bool add_bos_eos, std::vector<int32_t>& out) const;
  // The bytes of ids 0..255; BOS/EOS are dropped; any other id throws
  // "[tokenizer] ..." naming the id and its position.
  std::string decode(std::span<const int32_t> ids) const;
};

// The byte tokenizer behind the Tokenizer interface, so that records (.jsonl,
// and Python's data=) reach a byte-level model through the same record and
// packing code as a model tokenizer's: encode(text, true) is BOS + bytes
// (the record encoder appends EOS after a text, as the text-file path puts
// EOS after a document); decode(ids, skip_special) drops BOS/EOS either way.
// No chat format and no token names: chat records are refused by the caller.
class ByteVocabTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special,
                                           std::vector<TokenSpan>& spans) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t vocab_size() const override { return ByteTokenizer::vocab_size; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::optional<int32_t> bos_id() const override { return ByteTokenizer::bos_id; }
  std::optional<int32_t> eos_id() const override { return ByteTokenizer::eos_id; }
  std::string describe() const override { return "byte (ids 0..255 the bytes, 256 BOS, 257 EOS)"; }
  bool encodes_line_pieces_exactly() const override { return true; }
};

}  // namespace rt
