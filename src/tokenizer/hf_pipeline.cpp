// Normalizer and decoder step lists of tokenizer.json; see hf_pipeline.h.
// Each decoder step follows the decode_chain of the HF tokenizers decoder of
// the same name, including its corner cases (noted where they matter).
#include "tokenizer/hf_pipeline.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace rt {
namespace {

using json = nlohmann::json;

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : j.dump(); }

// A Replace pattern: {"String": s} (literal) or {"Regex": r}.
void parse_pattern(const json& p, const std::string& where, std::string& literal, std::unique_ptr<Pcre2Regex>& regex) {
  if (p.contains("String")) {
    literal = p["String"].get<std::string>();
    RT_CHECK(!literal.empty(), where, "Replace with an empty pattern is not supported");
  } else if (p.contains("Regex")) {
    regex = std::make_unique<Pcre2Regex>(p["Regex"].get<std::string>(), false, where);
  } else {
    fail(where, "Replace pattern ", p.dump(), " is neither {\"String\": ...} nor {\"Regex\": ...}");
  }
}

// Single character of a JSON string field (Strip content).
char32_t one_char(const json& v, const std::string& where, const char* what) {
  const std::string s = v.get<std::string>();
  RT_CHECK(utf8_find_invalid(s) == std::string::npos && !s.empty(), where, what, " must be one character");
  size_t i = 0;
  const char32_t c = utf8_next(s, i);
  RT_CHECK(i == s.size(), where, what, " \"", s, "\" must be one character");
  return c;
}

// "<0xAB>" -> 0xAB as ByteFallback reads it (Rust u8::from_str_radix on the two
// characters after "<0x", which also takes a leading '+'); -1 otherwise.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// GPT-2's unicode character -> byte table (the inverse of ByteLevel's mapping).
struct CharBytes {
  std::vector<int> of;  // code point < 512 -> byte, or -1
  CharBytes() : of(512, -1) {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      of[printable ? b : next++] = b;
    }
  }
};

}  // namespace

std::string replace_all(std::string_view s, const std::string& literal, const Pcre2Regex* regex,
                        const std::string& content) {
  std::string out;
  out.reserve(s.size());
  if (regex) {
    std::vector<std::pair<size_t, size_t>> m;
    regex->find_all(s, m);
    size_t prev = 0;
    for (const auto& [b, e] : m) {
      out.append(s.substr(prev, b - prev));
      out += content;
      prev = e;
    }
    out.append(s.substr(prev));
    return out;
  }
  size_t prev = 0;
  for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, prev)) {
    out.append(s.substr(prev, p - prev));
    out += content;
    prev = p + literal.size();
  }
  out.append(s.substr(prev));
  return out;
}

void align_identity(std::string_view s, size_t base, std::vector<TokenSpan>& align) {
  align.resize(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t b = i;
    utf8_next(s, i);
    for (size_t k = b; k < i; ++k) align[k] = {base + b, base + i};
  }
}

std::string replace_all_aligned(std::string_view s, const std::string& literal, const Pcre2Regex* regex,
                                const std::string& content, std::vector<TokenSpan>& align) {
  std::vector<std::pair<size_t, size_t>> m;
  if (regex) {
    regex->find_all(s, m);
  } else {
    for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size()))
      m.emplace_back(p, p + literal.size());
  }
  std::string out;
  std::vector<TokenSpan> na;
  out.reserve(s.size());
  na.reserve(s.size());
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    out.append(s.substr(prev, b - prev));
    na.insert(na.end(), align.begin() + static_cast<std::ptrdiff_t>(prev),
              align.begin() + static_cast<std::ptrdiff_t>(b));
    out += content;
    const TokenSpan span = b < e ? TokenSpan{align[b].begin, align[e - 1].end}
                                 : TokenSpan{b < s.size() ? align[b].begin : (b ? align[b - 1].end : 0),
                                             b < s.size() ? align[b].begin : (b ? align[b - 1].end : 0)};
    na.insert(na.end(), content.size(), span);
    prev = e;
  }
  out.append(s.substr(prev));
  na.insert(na.end(), align.begin() + static_cast<std::ptrdiff_t>(prev), align.end());
  align.swap(na);
  return out;
}

void Normalizer::parse(const json& n, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = n.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) parse(s, where);
    return;
  }
  Step st;
  if (type == "NFC") {
    st.kind = Step::Kind::nfc;
  } else if (type == "Prepend") {
    st.kind = Step::Kind::prepend;
    st.text = n.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    st.kind = Step::Kind::replace;
    parse_pattern(n.at("pattern"), where, st.text, st.regex);
    st.content = n.at("content").get<std::string>();
  } else {
    fail(where, "normalizer ", type_of(n),
         " is not supported; supported: null, NFC, Prepend, Replace, Sequence of those");
  }
  steps_.push_back(std::move(st));
}

bool Normalizer::empty_or_nfc() const {
  for (const Step& st : steps_)
    if (st.kind != Step::Kind::nfc) return false;
  return true;
}

std::string Normalizer::apply(std::string_view s) const {
  std::string cur(s);
  for (const Step& st : steps_) {
    switch (st.kind) {
      case Step::Kind::nfc:
        cur = nfc_normalize(cur);
        break;
      case Step::Kind::prepend:
        if (!cur.empty()) cur.insert(0, st.text);
        break;
      case Step::Kind::replace:
        cur = replace_all(cur, st.text, st.regex.get(), st.content);
        break;
    }
  }
  return cur;
}

std::string Normalizer::apply_aligned(std::string_view s, size_t base, std::vector<TokenSpan>& align) const {
  std::string cur(s);
  align_identity(s, base, align);
  for (const Step& st : steps_) {
    switch (st.kind) {
      case Step::Kind::nfc: {
        if (nfc_normalize(cur) == cur) break;
        std::string out;
        std::vector<TokenSpan> na;
        for (size_t b = 0; b < cur.size();) {
          size_t e = b + 1;
          while (e < cur.size() && static_cast<uint8_t>(cur[e]) >= 0x80) ++e;  // up to the next ASCII byte
          const std::string_view run = std::string_view(cur).substr(b, e - b);
          const std::string n = nfc_normalize(run);
          if (n == run) {
            na.insert(na.end(), align.begin() + static_cast<std::ptrdiff_t>(b),
                      align.begin() + static_cast<std::ptrdiff_t>(e));
          } else {
            na.insert(na.end(), n.size(), TokenSpan{align[b].begin, align[e - 1].end});
          }
          out += n;
          b = e;
        }
        cur.swap(out);
        align.swap(na);
        break;
      }
      case Step::Kind::prepend:
        if (!cur.empty()) {
          cur.insert(0, st.text);
          const TokenSpan first = align[0];
          align.insert(align.begin(), st.text.size(), first);
        }
        break;
      case Step::Kind::replace:
        cur = replace_all_aligned(cur, st.text, st.regex.get(), st.content, align);
        break;
    }
  }
  return cur;
}

void Decoder::parse(const json& d, const std::string& where) {
  if (d.is_null()) {
    null_ = steps_.empty();
    return;
  }
  const std::string type = d.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : d.at("decoders")) parse(s, where);
    return;
  }
  Step st;
  if (type == "ByteLevel") {
    st.kind = Step::Kind::byte_level;
  } else if (type == "Replace") {
    st.kind = Step::Kind::replace;
    parse_pattern(d.at("pattern"), where, st.text, st.regex);
    st.content = d.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    st.kind = Step::Kind::byte_fallback;
  } else if (type == "Fuse") {
    st.kind = Step::Kind::fuse;
  } else if (type == "Strip") {
    st.kind = Step::Kind::strip;
    st.strip_char = one_char(d.at("content"), where, "Strip decoder content");
    st.start = d.at("start").get<size_t>();
    st.stop = d.at("stop").get<size_t>();
  } else if (type == "Metaspace") {
    st.kind = Step::Kind::metaspace;
    st.text = d.at("replacement").get<std::string>();
    one_char(d.at("replacement"), where, "Metaspace replacement");
    std::string scheme = d.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = d.value("add_prefix_space", true) ? "always" : "never";  // older files
    st.prepend_first = scheme != "never";
  } else {
    fail(where, "decoder ", type_of(d),
         " is not supported; supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence of those");
  }
  steps_.push_back(std::move(st));
}

std::string Decoder::apply(std::vector<std::string> tokens) const {
  static const CharBytes char_bytes;
  if (null_) {  // HF without a decoder: the tokens joined by spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  std::vector<std::string> next;
  for (const Step& st : steps_) {
    next.clear();
    switch (st.kind) {
      case Step::Kind::byte_level: {  // all tokens -> one; a token with a non-byte character keeps its bytes
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string b;
          bool ok = true;
          for (size_t i = 0; i < t.size() && ok;) {
            const char32_t c = utf8_next(t, i);
            ok = c < 512 && char_bytes.of[c] >= 0;
            if (ok) b.push_back(static_cast<char>(char_bytes.of[c]));
          }
          bytes += ok ? b : t;
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case Step::Kind::replace:
        for (const std::string& t : tokens) next.push_back(replace_all(t, st.text, st.regex.get(), st.content));
        break;
      case Step::Kind::byte_fallback: {  // runs of <0xXX>: their UTF-8 text, or one U+FFFD per byte when invalid
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
          if (run_len == 0) return;
          if (utf8_find_invalid(run) == std::string::npos)
            next.push_back(run);
          else
            for (size_t k = 0; k < run_len; ++k) next.push_back("\xEF\xBF\xBD");
          run.clear();
          run_len = 0;
        };
        for (const std::string& t : tokens) {
          const int b = byte_token_value(t);
          if (b >= 0) {
            run.push_back(static_cast<char>(b));
            ++run_len;
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case Step::Kind::metaspace:  // replacement -> ' ', except in the first token, where it is dropped
        for (size_t i = 0; i < tokens.size(); ++i)
          next.push_back(replace_all(tokens[i], st.text, nullptr, i == 0 && st.prepend_first ? "" : " "));
        break;
      case Step::Kind::fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Step::Kind::strip:
        for (const std::string& t : tokens) {
          std::vector<size_t> starts;  // byte offset of each character, plus the end
          for (size_t i = 0; i < t.size();) {
            starts.push_back(i);
            utf8_next(t, i);
          }
          const size_t n = starts.size();
          starts.push_back(t.size());
          auto char_at = [&](size_t k) {
            size_t i = starts[k];
            return utf8_next(t, i);
          };
          size_t a = 0, z = n;
          while (a < st.start && a < n && char_at(a) == st.strip_char) ++a;
          for (size_t k = 0; k < st.stop && z > a && char_at(z - 1) == st.strip_char; ++k) --z;
          next.push_back(t.substr(starts[a], starts[z] - starts[a]));
        }
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace rt
