// RunLock: one writer per output directory. A process that writes into a
// directory (train --out, export --out) holds an exclusive flock(2) on
// DIR/.ramtrain.lock for as long as it writes; a second process is refused
// with the holder's pid, host, start time and command line, which the holder
// writes into the file. The lock, not the file, is what counts: the kernel
// releases a flock when its holder dies (kill -9 included), so a file left by
// a dead process never blocks, whatever it says. The holder removes the file
// when it lets go (after checking that the path still names its own file), and
// removes DIR too when it created it and DIR is empty. Local file systems:
// flock over NFS depends on the server.
#pragma once
#include <string>

namespace rt {

class RunLock {
 public:
  RunLock() = default;
  // Creates dir (mkdir -p) when missing and locks it. Throws "<where> <flag> <dir>
  // is in use by another ramtrain process (pid ..., host ..., ...)" when held,
  // and "<where> <flag> <dir> ..." when dir is not a directory or cannot be written.
  static RunLock acquire(const std::string& dir, const std::string& where = "[train]",
                         const std::string& flag = "--out");
  ~RunLock();
  RunLock(RunLock&& o) noexcept;
  RunLock& operator=(RunLock&& o) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }  // DIR/.ramtrain.lock
  void release();

 private:
  int fd_ = -1;
  std::string dir_, path_;
  bool created_dir_ = false;
};

constexpr const char* kRunLockName = ".ramtrain.lock";

}  // namespace rt
