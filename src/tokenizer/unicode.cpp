// UTF-8 validation/decoding and NFC. See unicode.h for the contract.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace rt {
namespace {

struct NfcCombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct NfcDecomposition {
  char32_t cp, first, second;  // second == 0: singleton
};
struct NfcComposition {
  char32_t first, second, composite;
};
#include "tokenizer/unicode_nfc_data.inc"

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr char32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount, kHangulSCount = kHangulLCount * kHangulNCount;

// Length of the valid sequence starting at s[i] (ok = true), or the length
// of the maximal invalid subpart there (ok = false, >= 1).
size_t utf8_sequence_at(std::string_view s, size_t i, bool& ok) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    ok = true;
    return 1;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    ok = false;
    return 1;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      ok = false;
      return k;
    }
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      ok = false;
      return k;
    }
  }
  ok = true;
  return need + 1;
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto* end = std::end(kNfcCombiningClass);
  const auto* it = std::lower_bound(std::begin(kNfcCombiningClass), end, c,
                                    [](const NfcCombiningClass& e, char32_t v) { return e.cp < v; });
  return it != end && it->cp == c ? it->ccc : 0;
}

// Appends the full canonical decomposition of c to out, keeping canonical
// order (a stable insertion sort of each run of non-starters).
void decompose_append(char32_t c, std::vector<char32_t>& out) {
  if (c >= kHangulS && c < kHangulS + kHangulSCount) {
    const char32_t si = c - kHangulS;
    out.push_back(kHangulL + si / kHangulNCount);
    out.push_back(kHangulV + (si % kHangulNCount) / kHangulTCount);
    if (si % kHangulTCount) out.push_back(kHangulT + si % kHangulTCount);
    return;
  }
  if (c >= 0xC0) {
    const auto* end = std::end(kNfcDecomposition);
    const auto* it = std::lower_bound(std::begin(kNfcDecomposition), end, c,
                                      [](const NfcDecomposition& e, char32_t v) { return e.cp < v; });
    if (it != end && it->cp == c) {
      decompose_append(it->first, out);
      if (it->second) decompose_append(it->second, out);
      return;
    }
  }
  const uint8_t cc = combining_class(c);
  size_t pos = out.size();
  if (cc != 0) {
    while (pos > 0) {
      const uint8_t prev = combining_class(out[pos - 1]);
      if (prev == 0 || prev <= cc) break;
      --pos;
    }
  }
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(pos), c);
}

// The primary composite of (a, b), or 0.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kHangulL && a < kHangulL + kHangulLCount && b >= kHangulV && b < kHangulV + kHangulVCount)
    return kHangulS + ((a - kHangulL) * kHangulVCount + (b - kHangulV)) * kHangulTCount;
  if (a >= kHangulS && a < kHangulS + kHangulSCount && (a - kHangulS) % kHangulTCount == 0 && b > kHangulT &&
      b < kHangulT + kHangulTCount)
    return a + (b - kHangulT);
  const auto* end = std::end(kNfcComposition);
  const auto* it = std::lower_bound(std::begin(kNfcComposition), end, std::pair{a, b},
                                    [](const NfcComposition& e, std::pair<char32_t, char32_t> v) {
                                      return e.first != v.first ? e.first < v.first : e.second < v.second;
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

size_t utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    bool ok;
    const size_t n = utf8_sequence_at(s, i, ok);
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  char32_t c = b0 & (0x3F >> n);
  for (int k = 1; k <= n; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n + 1;
  return c;
}

char32_t utf8_prev(std::string_view s, size_t& i) {
  size_t j = i - 1;
  while (j > 0 && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) --j;
  size_t k = j;
  const char32_t c = utf8_next(s, k);
  i = j;
  return c;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool ok;
    const size_t n = utf8_sequence_at(bytes, i, ok);
    if (ok)
      out.append(bytes.substr(i, n));
    else
      out.append("\xEF\xBF\xBD");
    i += n;
  }
  return out;
}

std::string nfc_normalize(std::string_view s) {
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b >= 0xCC) break;  // 0xCC lead byte: first code point >= U+0300
  }
  if (i == s.size()) return std::string(s);

  std::vector<char32_t> d;
  d.reserve(s.size());
  for (size_t k = 0; k < s.size();) decompose_append(utf8_next(s, k), d);

  // Canonical composition (UAX #15): a character combines with the last
  // starter unless a character in between blocks it.
  if (!d.empty()) {
    size_t starter_pos = 0;
    int last_class = combining_class(d[0]) ? 256 : 0;
    size_t out_pos = 1;
    for (size_t k = 1; k < d.size(); ++k) {
      const char32_t c = d[k];
      const int cc = combining_class(c);
      const char32_t comp = compose_pair(d[starter_pos], c);
      if (comp && (last_class < cc || last_class == 0)) {
        d[starter_pos] = comp;
        continue;
      }
      if (cc == 0) starter_pos = out_pos;
      last_class = cc;
      d[out_pos++] = c;
    }
    d.resize(out_pos);
  }
  std::string out;
  out.reserve(s.size());
  for (char32_t c : d) utf8_append(out, c);
  return out;
}

const char* nfc_unicode_version() { return kNfcUnicodeVersion; }

}  // namespace rt
