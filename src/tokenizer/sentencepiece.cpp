// SentencePiece wrapper; see sentencepiece.h.
#include "tokenizer/sentencepiece.h"

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/unicode.h"

namespace rt {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    RT_CHECK(file_exists(path), "[tokenizer ", path, "] file not found");
    const auto st = sp_.Load(path);
    RT_CHECK(st.ok(), "[tokenizer ", path, "] SentencePiece cannot load it: ", st.ToString(),
             " (is it a SentencePiece model? a HF tokenizer.json would be read instead when present)");
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    if (const size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
      fail("[tokenizer] input text is not valid UTF-8: byte 0x", std::hex,
           static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at byte offset ", bad,
           " starts an invalid sequence; convert the data to UTF-8 first");
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    RT_CHECK(st.ok(), "[tokenizer ", path_, "] SentencePiece encode failed: ", st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_special && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::vector<int> in;
    in.reserve(ids.size());
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize()) in.push_back(id);
    std::string out;
    const auto st = sp_.Decode(in, &out);
    RT_CHECK(st.ok(), "[tokenizer ", path_, "] SentencePiece decode failed: ", st.ToString());
    return out;
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }

  std::optional<int32_t> token_to_id(std::string_view name) const override {
    const int id = sp_.PieceToId(name);  // unknown pieces map to unk
    if (id < 0 || (id == sp_.unk_id() && sp_.IdToPiece(id) != name)) return std::nullopt;
    return id;
  }
  std::optional<int32_t> bos_id() const override { return id_or_none(sp_.bos_id()); }
  std::optional<int32_t> eos_id() const override { return id_or_none(sp_.eos_id()); }
  std::string describe() const override { return "sentencepiece " + path_; }

 private:
  static std::optional<int32_t> id_or_none(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_load(const std::string& model_path) {
  return std::make_unique<SentencePieceTokenizer>(model_path);
}

}  // namespace rt
