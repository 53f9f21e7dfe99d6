#include "data/byte_tokenizer.h"

#include "core/error.h"

namespace rt {

void ByteTokenizer::encode_append(std::string_view text, bool add_bos_eos, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size() + (add_bos_eos ? 2 : 0));
  if (add_bos_eos) out.push_back(bos_id);
  for (char c : text) out.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  if (add_bos_eos) out.push_back(eos_id);
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos_eos) const {
  std::vector<int32_t> out;
  encode_append(text, add_bos_eos, out);
  return out;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id != bos_id && id != eos_id) {
      fail("[tokenizer] id ", id, " at position ", i, " is outside the byte tokenizer's vocab of ", vocab_size,
           " (0..255 bytes, 256 BOS, 257 EOS): these ids come from a different tokenizer");
    }
  }
  return out;
}

std::vector<int32_t> ByteVocabTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() + 1);
  if (add_special) out.push_back(ByteTokenizer::bos_id);
  ByteTokenizer().encode_append(text, false, out);
  return out;
}

std::vector<int32_t> ByteVocabTokenizer::encode_with_offsets(std::string_view text, bool add_special,
                                                             std::vector<TokenSpan>& spans) const {
  std::vector<int32_t> out = encode(text, add_special);
  spans.clear();
  spans.reserve(out.size());
  if (add_special) spans.push_back({0, 0});
  for (size_t i = 0; i < text.size(); ++i) spans.push_back({i, i + 1});
  return out;
}

std::string ByteVocabTokenizer::decode(std::span<const int32_t> ids, bool) const { return ByteTokenizer().decode(ids); }

}  // namespace rt

