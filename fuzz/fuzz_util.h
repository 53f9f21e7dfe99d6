// Helpers shared by the libFuzzer targets: the fuzz input as a file on tmpfs
// (the readers under test take paths), and one thread for the pool.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace rt::fuzz {

// Writes data to /dev/shm/ramtrain_fuzz_<pid><suffix> (or $TMPDIR) and returns the path.
inline std::string input_file(const uint8_t* data, size_t n, const std::string& suffix) {
  static const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  const std::string path = dir + "/ramtrain_fuzz_" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (n && std::fwrite(data, 1, n, f) != n) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace rt::fuzz
