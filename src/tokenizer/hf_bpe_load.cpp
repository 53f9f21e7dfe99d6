// HfBpeTokenizer's loading: tokenizer.json (model, normalizer, pre-tokenizer,
// added tokens, post-processor, decoder) and tokenizer_config.json (bos/eos).
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/hf_bpe_internal.h"

namespace rt::hf_bpe_detail {

HfBpeTokenizer::HfBpeTokenizer(const std::string& json_path, const std::string& config_path)
    : path_(json_path), where_("[tokenizer " + json_path + "] ") {
  json j;
  try {
    j = json::parse(read_text_file(json_path));
  } catch (const json::exception& e) {
    fail(where_, "not valid JSON: ", e.what());
  }
  RT_CHECK(j.is_object() && j.contains("model"), where_, "no \"model\" object: not a HF tokenizer.json");
  try {
    parse_model(j["model"]);
    parse_normalizer(j.value("normalizer", json()));
    parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    parse_added_tokens(j.value("added_tokens", json::array()));
    parse_post_processor(j.value("post_processor", json()));
    parse_decoder(j.value("decoder", json()));
  } catch (const json::exception& e) {
    fail(where_, "unexpected JSON layout: ", e.what());
  }
  parse_config(config_path);
}

void HfBpeTokenizer::parse_model(const json& m) {
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : (m.contains("merges") ? "BPE" : "?");
  RT_CHECK(type == "BPE", where_, "model type \"", type,
           "\" is not supported; supported: BPE (GPT-2, Llama-2, Llama-3, Qwen2, DeepSeek layouts), "
           "or put a SentencePiece tokenizer.model in the directory instead");
  RT_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0, where_,
           "BPE dropout is set; ramtrain tokenizes deterministically: set \"dropout\" to null");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    RT_CHECK(!m.contains(k) || m[k].is_null() || m[k].get<std::string>().empty(), where_, "model.", k,
             " is not supported (byte-level BPE files leave it null)");
  ignore_merges_ = json_bool(m, "ignore_merges", false);
  byte_fallback_ = json_bool(m, "byte_fallback", false);
  fuse_unk_ = json_bool(m, "fuse_unk", false);

  const auto& table = byte_level_table();
  int32_t max_id = -1;
  std::string raw;
  for (const auto& [tok, idj] : m.at("vocab").items()) {
    const auto id = idj.get<int32_t>();
    RT_CHECK(id >= 0, where_, "vocab entry \"", tok, "\" has negative id ", id);
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
    if (table.to_bytes(tok, raw)) raw_vocab_[raw] = id;
  }
  decode_bytes_.resize(static_cast<size_t>(max_id + 1));
  id_defined_.assign(decode_bytes_.size(), 0);
  id_special_.assign(decode_bytes_.size(), 0);
  id_token_.resize(decode_bytes_.size());
  for (const auto& [tok, id] : vocab_) {
    id_token_[id] = tok;
    id_defined_[id] = 1;
    decode_bytes_[id] = table.to_bytes(tok, raw) ? raw : tok;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(table.byte_to_utf8[b]);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const auto u = m["unk_token"].get<std::string>();
    const auto it = vocab_.find(u);
    RT_CHECK(it != vocab_.end(), where_, "unk_token \"", u, "\" is not in the vocab");
    unk_id_ = it->second;
  }

  const json& merges = m.at("merges");
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& e : merges) {
    std::string a, b;
    if (e.is_string()) {
      const auto s = e.get<std::string>();
      const size_t sp = s.find(' ');
      RT_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where_, "merge ", rank, " \"", s,
               "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      RT_CHECK(e.is_array() && e.size() == 2, where_, "merge ", rank, " is neither \"a b\" nor [a, b]: ", e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    RT_CHECK(ia != vocab_.end() && ib != vocab_.end(), where_, "merge ", rank, " (", a, ", ", b,
             ") uses a token missing from the vocab");
    RT_CHECK(ic != vocab_.end(), where_, "merge ", rank, " produces \"", a + b, "\", which is not in the vocab");
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.emplace(key, Merge{rank, ic->second});  // the first (lowest-rank) entry wins
    ++rank;
  }
}

void HfBpeTokenizer::parse_normalizer(const json& n) { normalizer_.parse(n, where_); }

void HfBpeTokenizer::parse_pre_tokenizer(const json& p) {
  if (p.is_null()) return;  // the whole normalized text is one word (Llama-2's tokenizer.json)
  const std::string type = p.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) parse_pre_tokenizer(s);
    return;
  }
  RT_CHECK(steps_.empty() || steps_.back().kind != PreTokenizeStep::Kind::byte_level, where_, "pre-tokenizer ",
           json_type(p), " after ByteLevel is not supported (ByteLevel must come last)");
  PreTokenizeStep st;
  if (type == "ByteLevel") {
    st.kind = PreTokenizeStep::Kind::byte_level;
    st.add_prefix_space = json_bool(p, "add_prefix_space", true);
    if (json_bool(p, "use_regex", true)) st.regex = std::make_unique<Pcre2Regex>(kGpt2Regex, false, where_);
  } else if (type == "Digits") {  // HF splits on char::is_numeric (Nd, Nl, No = \p{N}): each digit, or each run
    st.kind = PreTokenizeStep::Kind::split;
    st.regex =
        std::make_unique<Pcre2Regex>(json_bool(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", false, where_);
  } else if (type == "Metaspace") {
    st.kind = PreTokenizeStep::Kind::metaspace;
    st.replacement = p.at("replacement").get<std::string>();
    size_t k = 0;
    RT_CHECK(!st.replacement.empty() && utf8_find_invalid(st.replacement) == std::string::npos &&
                 (utf8_next(st.replacement, k), k == st.replacement.size()),
             where_, "Metaspace replacement must be one character");
    std::string scheme = p.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = json_bool(p, "add_prefix_space", true) ? "always" : "never";  // older files
    RT_CHECK(scheme == "always" || scheme == "never" || scheme == "first", where_, "Metaspace prepend_scheme \"",
             scheme, "\" is not one of always, never, first");
    st.prepend = scheme == "always"  ? PreTokenizeStep::Prepend::always
                 : scheme == "never" ? PreTokenizeStep::Prepend::never
                                     : PreTokenizeStep::Prepend::first;
    st.metaspace_split = json_bool(p, "split", true);
  } else if (type == "Split") {
    st.kind = PreTokenizeStep::Kind::split;
    const json& pat = p.at("pattern");
    if (pat.contains("Regex"))
      st.regex = std::make_unique<Pcre2Regex>(pat["Regex"].get<std::string>(), false, where_);
    else
      st.regex = std::make_unique<Pcre2Regex>(pat.at("String").get<std::string>(), true, where_);
    const std::string behavior = p.at("behavior").get<std::string>();
    RT_CHECK(behavior == "Isolated" || behavior == "Removed", where_, "Split behavior \"", behavior,
             "\" is not supported; supported: Isolated, Removed");
    st.remove_matches = behavior == "Removed";
    st.invert = json_bool(p, "invert", false);
  } else {
    fail(where_, "pre_tokenizer ", json_type(p),
         " is not supported; supported: ByteLevel, Split (Isolated/Removed), Digits, Metaspace, Sequence of those "
         "(ByteLevel last)");
  }
  byte_level_ |= st.kind == PreTokenizeStep::Kind::byte_level;
  steps_.push_back(std::move(st));
}

void HfBpeTokenizer::parse_added_tokens(const json& a) {
  added_.reserve(a.size());  // stable addresses for the matchers
  for (const auto& t : a) {
    AddedToken tok{t.at("content").get<std::string>(), t.at("id").get<int32_t>(),     json_bool(t, "special", false),
                   json_bool(t, "single_word", false), json_bool(t, "lstrip", false), json_bool(t, "rstrip", false),
                   json_bool(t, "normalized", true)};
    RT_CHECK(tok.id >= 0, where_, "added token \"", tok.content, "\" has negative id");
    added_by_name_[tok.content] = tok.id;
    if (static_cast<size_t>(tok.id) >= decode_bytes_.size()) {
      decode_bytes_.resize(tok.id + 1);
      id_defined_.resize(tok.id + 1, 0);
      id_special_.resize(tok.id + 1, 0);
      id_token_.resize(tok.id + 1);
    }
    std::string raw;
    decode_bytes_[tok.id] = byte_level_table().to_bytes(tok.content, raw) ? raw : tok.content;
    id_token_[tok.id] = tok.content;
    id_defined_[tok.id] = 1;
    id_special_[tok.id] = tok.special;
    // HF matches a normalized token in the normalized text as the normalizer spells it.
    if (tok.normalized) tok.content = normalizer_.apply(tok.content);
    added_.push_back(std::move(tok));
  }
  for (const auto& t : added_) (t.normalized ? normalized_matcher_ : raw_matcher_).add(&t);
}

void HfBpeTokenizer::parse_post_processor(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& s : p.at("processors")) parse_post_processor(s);
    return;
  }
  RT_CHECK(type == "TemplateProcessing", where_, "post_processor ", json_type(p),
           " is not supported; supported: null, ByteLevel, TemplateProcessing, Sequence of those");
  RT_CHECK(prefix_.empty() && suffix_.empty(), where_, "more than one TemplateProcessing post-processor");
  bool seen_sequence = false;
  for (const auto& item : p.at("single")) {
    if (item.contains("Sequence")) {
      RT_CHECK(!seen_sequence, where_, "the single template holds the sequence twice");
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& st = p.at("special_tokens");
    RT_CHECK(st.contains(name), where_, "template token \"", name, "\" missing from special_tokens");
    for (const auto& id : st[name].at("ids")) (seen_sequence ? suffix_ : prefix_).push_back(id.get<int32_t>());
  }
  RT_CHECK(seen_sequence, where_, "the single template has no $A sequence");
  if (!prefix_.empty()) template_bos_ = prefix_.front();
}

void HfBpeTokenizer::parse_decoder(const json& d) { decoder_.parse(d, where_); }

void HfBpeTokenizer::parse_config(const std::string& config_path) {
  bos_ = template_bos_;
  if (config_path.empty()) return;
  const std::string where = "[tokenizer " + config_path + "] ";
  json c;
  try {
    c = json::parse(read_text_file(config_path));
  } catch (const json::exception& e) {
    fail(where, "not valid JSON: ", e.what());
  }
  auto resolve = [&](const char* key, std::optional<int32_t>& out) {
    if (!c.contains(key)) return;
    const json& v = c[key];
    if (v.is_null()) {
      out.reset();
      return;
    }
    const std::string name = v.is_object() ? v.at("content").get<std::string>() : v.get<std::string>();
    const auto id = token_to_id(name);
    RT_CHECK(id, where, key, " \"", name, "\" is not a token of ", path_);
    out = id;
  };
  try {
    resolve("bos_token", bos_);
    resolve("eos_token", eos_);
  } catch (const json::exception& e) {
    fail(where, "unexpected bos_token/eos_token layout: ", e.what());
  }
}

}  // namespace rt::hf_bpe_detail
