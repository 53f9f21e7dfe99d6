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

}  // namespace rt
