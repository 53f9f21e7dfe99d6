// Internal to the checkpoint files (checkpoint.cpp, checkpoint_meta.cpp): the
// format's name and version and the 16-hex-digit form of a 64-bit checksum.
// Not part of the public API; include only from src/io/checkpoint*.cpp.
#pragma once
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rt::checkpoint_internal {

inline constexpr const char* kFormat = "ramtrain-checkpoint";
inline constexpr int kVersion = 1;

// 16 lowercase hex digits.
inline std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// Exactly 16 lowercase hex digits; false (and *v untouched) otherwise.
inline bool hex64_parse(const std::string& s, uint64_t* v) {
  if (s.size() != 16) return false;
  uint64_t x = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    x = x << 4 | static_cast<uint64_t>(d);
  }
  *v = x;
  return true;
}

}  // namespace rt::checkpoint_internal
