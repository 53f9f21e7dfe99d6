// DirectFile: one preallocated file of large, aligned reads and writes (the
// state tier's home on a local SSD, state/state_tier.h). O_DIRECT when the
// file system takes it (the page cache would otherwise hold a second copy of
// what --max-host-memory keeps out of RAM); buffered, with a one-line note,
// where it does not (tmpfs). Requests: offsets, lengths and buffers aligned to
// kDirectAlign; moved in chunks of at most 64 MiB, short transfers continued.
// The whole size is reserved at open (posix_fallocate), so a full disk fails
// there, naming the path, before anything was written. An exclusive flock
// refuses a second process on the same file. No fsync: the owner decides what
// is durable (the tier's file never is: docs/architecture.md, State tier).
#pragma once
#include <cstdint>
#include <string>

namespace rt {

constexpr uint64_t kDirectAlign = 4096;
inline uint64_t direct_round(uint64_t b) { return (b + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

class DirectFile {
 public:
  DirectFile() = default;
  // Creates (or truncates) path and reserves bytes. what/flag name it in errors,
  // e.g. "[train]" and "--state-dir". Throws rt::Error naming path and the fix.
  DirectFile(const std::string& path, uint64_t bytes, const std::string& where, const std::string& flag);
  ~DirectFile();
  DirectFile(DirectFile&& o) noexcept;
  DirectFile& operator=(DirectFile&& o) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  void read(uint64_t off, void* buf, uint64_t len) const;
  void write(uint64_t off, const void* buf, uint64_t len) const;
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  const std::string& note() const { return note_; }  // why not O_DIRECT ("" when it is)

 private:
  void check(uint64_t off, const void* buf, uint64_t len) const;
  int fd_ = -1;
  bool direct_ = false;
  std::string path_, where_, flag_, note_;
};

}  // namespace rt
