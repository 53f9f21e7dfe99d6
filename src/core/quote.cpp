#include "core/quote.h"

#include "core/error.h"

namespace rt {

std::string quote_input(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes;
  // Back up over UTF-8 continuation bytes so the cut falls between characters.
  for (int k = 0; k < 3 && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80; ++k) --n;
  return cat(s.substr(0, n), "... (", s.size(), " bytes in all)");
}

}  // namespace rt
