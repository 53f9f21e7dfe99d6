// SentencePiece wrapper with HF's added-token handling; see sentencepiece.h.
#include "tokenizer/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/unicode.h"

namespace rt {
namespace {

using json = nlohmann::json;

json read_json_or_null(const std::string& path) {
  if (path.empty() || !file_exists(path)) return json();
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("[tokenizer ", path, "] not valid JSON: ", e.what());
  }
}

const char* const kSpecialKeys[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                    "sep_token", "cls_token", "mask_token"};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& dir) : path_(path) {
    RT_CHECK(file_exists(path), "[tokenizer ", path, "] file not found");
    const auto st = sp_.Load(path);
    RT_CHECK(st.ok(), "[tokenizer ", path, "] SentencePiece cannot load it: ", st.ToString(),
             " (is it a SentencePiece model? a HF tokenizer.json would be read instead when present)");
    bos_ = id_or_none(sp_.bos_id());
    eos_ = id_or_none(sp_.eos_id());
    for (int id : {sp_.unk_id(), sp_.bos_id(), sp_.eos_id()})
      if (id >= 0) add_token({sp_.IdToPiece(id), id, true, false, false, false, false});
    if (!dir.empty()) read_configs(dir);
    matcher_ = AddedTokenMatcher(StripSpace::python);  // transformers strips with Python's str.strip
    for (const AddedToken& t : added_) matcher_.add(&t);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    if (const size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
      fail("[tokenizer] input text is not valid UTF-8: byte 0x", std::hex,
           static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at byte offset ", bad,
           " starts an invalid sequence; convert the data to UTF-8 first");
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && add_bos_ && bos_) out.push_back(*bos_);
    std::vector<Segment> segs;
    matcher_.split(text, segs);
    std::vector<int> ids;
    for (const Segment& s : segs) {
      if (s.added_id >= 0) {
        out.push_back(s.added_id);
        continue;
      }
      ids.clear();
      const auto st = sp_.Encode(s.text, &ids);
      RT_CHECK(st.ok(), "[tokenizer ", path_, "] SentencePiece encode failed: ", st.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (add_special && add_eos_ && eos_) out.push_back(*eos_);
    return out;
  }

  // SentencePiece reports each piece's bytes in the text it was given (its
  // normalizer's alignment; the dummy prefix "▁" belongs to the first piece).
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special,
                                           std::vector<TokenSpan>& spans) const override {
    if (const size_t bad = utf8_find_invalid(text); bad != std::string_view::npos)
      fail("[tokenizer] input text is not valid UTF-8: byte 0x", std::hex,
           static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at byte offset ", bad,
           " starts an invalid sequence; convert the data to UTF-8 first");
    std::vector<int32_t> out;
    spans.clear();
    if (add_special && add_bos_ && bos_) {
      out.push_back(*bos_);
      spans.push_back({0, 0});
    }
    std::vector<Segment> segs;
    matcher_.split(text, segs);
    for (const Segment& s : segs) {
      const auto base = static_cast<size_t>(s.text.data() - text.data());
      if (s.added_id >= 0) {
        out.push_back(s.added_id);
        spans.push_back({base, base + s.text.size()});
        continue;
      }
      const auto spt = sp_.EncodeAsImmutableProto(s.text);
      for (const auto& piece : spt.pieces()) {
        out.push_back(static_cast<int32_t>(piece.id()));
        spans.push_back({base + piece.begin(), base + piece.end()});
      }
    }
    if (add_special && add_eos_ && eos_) {
      out.push_back(*eos_);
      spans.push_back({text.size(), text.size()});
    }
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      std::string text;
      const auto st = sp_.Decode(run, &text);
      RT_CHECK(st.ok(), "[tokenizer ", path_, "] SentencePiece decode failed: ", st.ToString());
      // SentencePiece drops the leading "▁" of a decode's first piece (its dummy
      // prefix); after emitted text HF keeps it as a space.
      if (!out.empty() && sp_.IdToPiece(run[0]).rfind("\xE2\x96\x81", 0) == 0) out += ' ';
      out += text;
      run.clear();
    };
    for (int32_t id : ids) {
      if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        const AddedToken& t = added_[it->second];
        if (skip_special && t.special) continue;
        flush();
        out += t.content;
      } else if (id >= 0 && id < sp_.GetPieceSize()) {
        run.push_back(id);
      }
    }
    flush();
    return out;
  }

  int32_t vocab_size() const override { return std::max<int32_t>(sp_.GetPieceSize(), max_added_ + 1); }

  std::optional<int32_t> token_to_id(std::string_view name) const override {
    if (const auto it = added_by_name_.find(std::string(name)); it != added_by_name_.end())
      return added_[it->second].id;
    const int id = sp_.PieceToId(name);  // unknown pieces map to unk
    if (id < 0 || (id == sp_.unk_id() && sp_.IdToPiece(id) != name)) return std::nullopt;
    return id;
  }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::string describe() const override { return "sentencepiece " + path_; }

 private:
  static std::optional<int32_t> id_or_none(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

  // A later entry for the same text replaces the flags of an earlier one.
  void add_token(AddedToken t) {
    if (const auto it = added_by_name_.find(t.content); it != added_by_name_.end()) {
      RT_CHECK(added_[it->second].id == t.id, "[tokenizer ", path_, "] added token \"", t.content, "\" has two ids, ",
               added_[it->second].id, " and ", t.id);
      added_[it->second] = std::move(t);
      return;
    }
    added_by_name_[t.content] = added_.size();
    added_by_id_[t.id] = added_.size();
    max_added_ = std::max(max_added_, t.id);
    added_.push_back(std::move(t));
  }

  // The id of a special token named in a config file: an added token or a piece.
  int32_t resolve(const std::string& name, const std::string& where, const std::string& key) const {
    const auto id = token_to_id(name);
    RT_CHECK(id, where, key, " \"", name, "\" is neither a piece of ", path_,
             " nor an added token (added_tokens_decoder / added_tokens.json)");
    return *id;
  }

  void read_configs(const std::string& dir) {
    const std::string cfg_path = path_join(dir, "tokenizer_config.json");
    const std::string added_path = path_join(dir, "added_tokens.json");
    const std::string map_path = path_join(dir, "special_tokens_map.json");
    const json cfg = read_json_or_null(cfg_path), added = read_json_or_null(added_path),
               smap = read_json_or_null(map_path);
    std::string where;
    try {
      where = "[tokenizer " + cfg_path + "] ";
      if (cfg.is_object() && cfg.contains("added_tokens_decoder")) {
        for (const auto& [key, t] : cfg["added_tokens_decoder"].items()) {
          const int32_t id = std::stoi(key);
          RT_CHECK(id >= 0, where, "added_tokens_decoder id ", key, " is negative");
          add_token({t.at("content").get<std::string>(), id, t.value("special", false), t.value("single_word", false),
                     t.value("lstrip", false), t.value("rstrip", false), t.value("normalized", false)});
        }
      }
      where = "[tokenizer " + added_path + "] ";
      if (added.is_object()) {
        for (const auto& [content, idj] : added.items()) {
          const auto id = idj.get<int32_t>();
          RT_CHECK(id >= 0, where, "added token \"", content, "\" has negative id ", id);
          if (!added_by_name_.count(content)) add_token({content, id, false, false, false, false, true});
        }
      }
      // Special tokens named by the two maps (tokenizer_config.json last: it wins).
      for (const auto& [path, m] : {std::pair{map_path, &smap}, std::pair{cfg_path, &cfg}}) {
        where = "[tokenizer " + path + "] ";
        if (!m->is_object()) continue;
        auto mark = [&](const json& v, const std::string& key) -> std::optional<int32_t> {
          if (v.is_null()) return std::nullopt;
          const std::string name = v.is_object() ? v.at("content").get<std::string>() : v.get<std::string>();
          const int32_t id = resolve(name, where, key);
          AddedToken t{name, id, true, false, false, false, false};
          if (const auto it = added_by_name_.find(name); it != added_by_name_.end()) t = added_[it->second];
          t.special = true;
          if (v.is_object()) {
            t.single_word = v.value("single_word", t.single_word);
            t.lstrip = v.value("lstrip", t.lstrip);
            t.rstrip = v.value("rstrip", t.rstrip);
          }
          add_token(t);
          return id;
        };
        for (const char* key : kSpecialKeys) {
          if (!m->contains(key)) continue;
          const auto id = mark((*m)[key], key);
          if (std::string(key) == "bos_token") bos_ = id;
          if (std::string(key) == "eos_token") eos_ = id;
        }
        if (m->contains("additional_special_tokens"))
          for (const json& v : (*m)["additional_special_tokens"]) mark(v, "additional_special_tokens");
      }
      where = "[tokenizer " + cfg_path + "] ";
      if (cfg.is_object()) {
        add_bos_ = cfg.value("add_bos_token", true);
        add_eos_ = cfg.value("add_eos_token", false);
        if (cfg.contains("legacy") && cfg["legacy"].is_boolean() && !cfg["legacy"].get<bool>())
          std::fprintf(stderr,
                       "warning: %s sets \"legacy\": false, which ramtrain's SentencePiece path does not implement: "
                       "text right after a special token is encoded with SentencePiece's dummy \"\xE2\x96\x81\" "
                       "prefix (transformers' legacy behaviour)\n",
                       cfg_path.c_str());
      }
    } catch (const json::exception& e) {
      fail(where, "unexpected layout: ", e.what());
    } catch (const std::logic_error& e) {  // std::stoi on a non-numeric key
      fail(where, "added_tokens_decoder keys must be token ids: ", e.what());
    }
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::optional<int32_t> bos_, eos_;
  bool add_bos_ = true, add_eos_ = false;
  std::vector<AddedToken> added_;  // stable once the constructor ends (the matcher points into it)
  std::unordered_map<std::string, size_t> added_by_name_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  int32_t max_added_ = -1;
  AddedTokenMatcher matcher_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_load(const std::string& model_path, const std::string& model_dir) {
  return std::make_unique<SentencePieceTokenizer>(model_path, model_dir);
}

}  // namespace rt
