#include "io/data_cursor.h"

#include <cstdint>

#include "core/error.h"

namespace rt {

std::string DataCursor::to_string() const { return cat("epoch=", epoch, " index=", index); }

DataCursor DataCursor::parse(const std::string& s) {
  // Strict: exactly "epoch=<digits> index=<digits>", each value < 2^64.
  auto bad = [&]() { fail("[data] bad data cursor '", s, "': expected 'epoch=E index=I' with non-negative integers"); };
  size_t pos = 0;
  auto field = [&](const char* key) {
    const std::string k(key);
    if (s.compare(pos, k.size(), k) != 0) bad();
    pos += k.size();
    const size_t start = pos;
    uint64_t v = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      const uint64_t d = uint64_t(s[pos] - '0');
      if (v > (UINT64_MAX - d) / 10) bad();
      v = v * 10 + d;
      ++pos;
    }
    if (pos == start) bad();
    return v;
  };
  DataCursor c;
  c.epoch = field("epoch=");
  c.index = field(" index=");
  if (pos != s.size()) bad();
  return c;
}

}  // namespace rt
