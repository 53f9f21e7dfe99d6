#include "core/direct_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace rt {

namespace {
constexpr uint64_t kChunk = uint64_t(64) << 20;

// Test hooks (environment): a write past this many bytes (of this process's
// DirectFiles) fails as on a full disk; a write past the second SIGKILLs the
// process, as kill -9 in the middle of a tiered step.
uint64_t env_u64(const char* k) {
  const char* s = std::getenv(k);
  if (!s || !*s) return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  return *end ? 0 : static_cast<uint64_t>(v);
}
std::atomic<uint64_t> g_written{0};
std::string gib(uint64_t b) { return cat(b / (1 << 20), " MiB"); }
}  // namespace

DirectFile::DirectFile(const std::string& path, uint64_t bytes, const std::string& where, const std::string& flag)
    : path_(path), where_(where), flag_(flag) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  direct_ = fd >= 0;
  if (fd < 0 && errno == EINVAL) {  // tmpfs and a few others refuse O_DIRECT
    note_ = "the file system under " + path + " does not take O_DIRECT: buffered I/O (the page cache may hold a copy)";
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0)
    fail(where, " ", flag, ": cannot create ", path, ": ", std::strerror(errno),
         "; give a writable directory on a local SSD");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    fail(where, " ", flag, ": ", path, " is in use by another ramtrain process; give each run its own directory");
  }
  fd_ = fd;
  int e = ::ftruncate(fd_, 0) != 0 ? errno : 0;
  if (!e && bytes) e = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));  // returns the error, not errno
  if (e) {
    const uint64_t free_b = fs_free_bytes(path_dirname(path));
    if (::ftruncate(fd_, 0) != 0) {  // nothing more to undo
    }
    fail(where, " ", flag, ": cannot reserve ", gib(bytes), " for ", path, " (",
         free_b == UINT64_MAX ? std::string("free space unknown") : cat(gib(free_b), " free"), "): ", std::strerror(e),
         "; free space there, give a larger disk, or raise --max-host-memory so fewer units page");
  }
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) ::close(fd_);
}

DirectFile::DirectFile(DirectFile&& o) noexcept { *this = std::move(o); }

DirectFile& DirectFile::operator=(DirectFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    direct_ = o.direct_;
    path_ = std::move(o.path_);
    where_ = std::move(o.where_);
    flag_ = std::move(o.flag_);
    note_ = std::move(o.note_);
    o.fd_ = -1;
  }
  return *this;
}

void DirectFile::check(uint64_t off, const void* buf, uint64_t len) const {
  RT_CHECK(fd_ >= 0, "[io] ", path_, ": not open");
  RT_CHECK(off % kDirectAlign == 0 && len % kDirectAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kDirectAlign == 0,
           "[io] internal: a request to ", path_, " not aligned to ", kDirectAlign, " bytes");
}

void DirectFile::read(uint64_t off, void* buf, uint64_t len) const {
  check(off, buf, len);
  char* p = static_cast<char*>(buf);
  for (uint64_t done = 0; done < len;) {
    const ssize_t r =
        ::pread(fd_, p + done, static_cast<size_t>(std::min(kChunk, len - done)), static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(where_, " ", flag_, ": reading ", len, " bytes at ", off, " of ", path_,
           " failed: ", r < 0 ? std::strerror(errno) : "unexpected end of file",
           " (the state file is damaged or was truncated; ", "resume from the last checkpoint)");
    done += static_cast<uint64_t>(r);
  }
}

void DirectFile::write(uint64_t off, const void* buf, uint64_t len) const {
  check(off, buf, len);
  const char* p = static_cast<const char*>(buf);
  static const uint64_t fail_after = env_u64("RAMTRAIN_INJECT_STATE_WRITE_FAIL_AFTER_BYTES");
  static const uint64_t kill_after = env_u64("RAMTRAIN_INJECT_STATE_KILL_AFTER_BYTES");
  const uint64_t before = g_written.fetch_add(len);
  if (kill_after && before + len > kill_after) ::raise(SIGKILL);
  const bool inject = fail_after && before + len > fail_after;
  for (uint64_t done = 0; done < len;) {
    errno = inject ? ENOSPC : 0;
    const ssize_t r = inject ? -1
                             : ::pwrite(fd_, p + done, static_cast<size_t>(std::min(kChunk, len - done)),
                                        static_cast<off_t>(off + done));
    const int e = errno;
    if (r < 0 && e == EINTR) continue;
    if (r <= 0)
      fail(where_, " ", flag_, ": writing ", len, " bytes at ", off, " of ", path_,
           " failed: ", r < 0 ? std::strerror(e) : "no progress", e == ENOSPC ? " (the disk under it is full)" : "",
           inject ? " (injected by RAMTRAIN_INJECT_STATE_WRITE_FAIL_AFTER_BYTES, a test hook)" : "",
           "; the run stops here, its checkpoints are untouched: resume from the last one");
    done += static_cast<uint64_t>(r);
  }
}

}  // namespace rt
