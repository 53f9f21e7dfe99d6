#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "core/error.h"
#include "core/fs.h"

namespace rt {

namespace {

// This process's command line, arguments separated by spaces.
std::string own_command_line() {
  std::string s;
  try {
    s = read_text_file("/proc/self/cmdline");
  } catch (const Error&) {
    return "(unknown)";
  }
  while (!s.empty() && s.back() == '\0') s.pop_back();
  for (char& c : s)
    if (c == '\0') c = ' ';
  if (s.size() > 1000) s = s.substr(0, 1000) + "...";
  return s;
}

std::string now_utc() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// The file's lines "key value" joined into "key value, key value, ...".
std::string describe_holder(int fd) {
  std::string text;
  char buf[4096];
  ssize_t n;
  off_t off = 0;
  while ((n = ::pread(fd, buf, sizeof buf, off)) > 0 && text.size() < 8192) {
    text.append(buf, static_cast<size_t>(n));
    off += n;
  }
  std::string out;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    if (e > b) out += (out.empty() ? "" : ", ") + text.substr(b, e - b);
    b = e + 1;
  }
  return out.empty() ? "its details are not written yet" : out;
}

bool same_file(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

RunLock RunLock::acquire(const std::string& dir, const std::string& where, const std::string& flag) {
  RunLock l;
  const std::string kind = path_kind(dir);
  if (!kind.empty() && kind != "a directory")
    fail(where, " ", flag, " ", dir, " is ", kind, ", not a directory: pick another ", flag);
  if (kind.empty()) {
    try {
      make_dirs(dir);
    } catch (const Error& e) {
      fail(where, " ", flag, " ", dir, " cannot be created (", e.what(), "): pick a writable place");
    }
    l.created_dir_ = true;
  }
  l.dir_ = dir;
  l.path_ = path_join(dir, kRunLockName);
  // Open, lock, and check that the path still names the file locked: a holder
  // that let go in between has removed it, and the lock must be on the new one.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      if (l.created_dir_) ::rmdir(dir.c_str());
      fail(where, " ", flag, " ", dir, " cannot be written (creating ", l.path_, ": ", std::strerror(err),
           "): pick a writable place");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string who = err == EWOULDBLOCK ? describe_holder(fd) : std::string();
      ::close(fd);
      if (err == EWOULDBLOCK)
        fail(where, " ", flag, " ", dir, " is in use by another ramtrain process (", who,
             "): two processes writing one directory would mix their files. Wait for it to finish or stop it",
             flag.rfind("--", 0) == 0 ? ", or pick another " + flag : std::string(), " (the lock is ", l.path_,
             "; it is released when its holder exits)");
      fail(where, " cannot lock ", l.path_, ": ", std::strerror(err));
    }
    if (same_file(fd, l.path_)) {
      l.fd_ = fd;
      break;
    }
    ::close(fd);
    if (attempt == 100) fail(where, " cannot lock ", l.path_, ": it keeps being replaced");
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "(unknown)");
  const std::string info =
      cat("pid ", ::getpid(), "\nhost ", host, "\nstarted ", now_utc(), "\ncommand ", own_command_line(), "\n");
  if (::ftruncate(l.fd_, 0) != 0 || ::pwrite(l.fd_, info.data(), info.size(), 0) != static_cast<ssize_t>(info.size()))
    fail(where, " ", flag, " ", dir, " cannot be written (writing ", l.path_, ": ", std::strerror(errno), ")");
  return l;
}

void RunLock::release() {
  if (fd_ < 0) return;
  // Remove the file while still holding it, and only when the path still names it.
  if (same_file(fd_, path_)) ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
  if (created_dir_) ::rmdir(dir_.c_str());  // only when empty
  created_dir_ = false;
}

RunLock::~RunLock() { release(); }

RunLock::RunLock(RunLock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      dir_(std::move(o.dir_)),
      path_(std::move(o.path_)),
      created_dir_(std::exchange(o.created_dir_, false)) {}

RunLock& RunLock::operator=(RunLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    dir_ = std::move(o.dir_);
    path_ = std::move(o.path_);
    created_dir_ = std::exchange(o.created_dir_, false);
  }
  return *this;
}

}  // namespace rt
