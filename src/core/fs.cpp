#include "core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace rt {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("[file] cannot open ", path, ": ", std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) fail("[file] error reading ", path);
  return s.str();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail("[file] cannot stat ", path, ": ", std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void make_dirs(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  std::string parent = path_dirname(path);
  if (!parent.empty() && parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    fail("[file] cannot create directory ", path, ": ", std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string path_join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (!b.empty() && b[0] == '/') return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string path_dirname(const std::string& p) {
  auto pos = p.find_last_of('/');
  if (pos == std::string::npos) return "";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}

std::string path_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return "a symbolic link to a missing target";
    return "";
  }
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

void require_regular_file(const std::string& path, const std::string& where, bool dir_ok) {
  const std::string kind = path_kind(path);
  if (kind == "a regular file" || (dir_ok && kind == "a directory")) return;
  if (kind.empty()) fail(where, " ", path, ": no such file", dir_ok ? " or directory" : "", " (check the path)");
  if (kind == "a directory") fail(where, " ", path, ": is a directory, not a file");
  fail(where, " ", path, ": is ", kind, ", not a regular file", dir_ok ? " or directory" : "", ": give data files",
       dir_ok ? " or directories of them" : "",
       " (ramtrain maps its input files, so pipes and devices cannot be read; copy the data into a file)");
}

uint64_t fs_free_bytes(const std::string& path) {
  struct statvfs sv;
  if (::statvfs(path.c_str(), &sv) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(sv.f_bavail) * static_cast<uint64_t>(sv.f_frsize);
}

std::string check_out_writable(const std::string& dir, uint64_t need_bytes, const std::string& where,
                               const std::string& flag) {
  const std::string kind = path_kind(dir);
  if (!kind.empty() && kind != "a directory")
    fail(where, " ", flag, " ", dir, " is ", kind, ", not a directory: pick another ", flag);
  if (kind.empty()) {
    try {
      make_dirs(dir);
    } catch (const Error& e) {
      fail(where, " ", flag, " ", dir, " cannot be created (", e.what(), "): pick a writable place");
    }
  }
  const std::string probe = path_join(dir, ".ramtrain-probe." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(where, " ", flag, " ", dir, " cannot be written (creating ", probe, ": ", std::strerror(errno),
         "): pick a writable place");
  const std::string block(4096, '\0');
  const bool ok = ::write(fd, block.data(), block.size()) == static_cast<ssize_t>(block.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok)
    fail(where, " ", flag, " ", dir, " cannot be written (writing ", probe, ": ", std::strerror(err), ")",
         err == ENOSPC ? ": the disk is full; free space or pick another place" : "");
  const uint64_t free = fs_free_bytes(dir);
  if (free < need_bytes)
    return cat(flag, " ", dir, " has ", free >> 20, " MiB free, less than one checkpoint (", need_bytes >> 20,
               " MiB): saving it will fail unless space is freed");
  return "";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("[file] cannot open ", path, ": ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("[file] cannot stat ", path, ": ", std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("[file] cannot map ", path, ": ", std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  tmp_ = path + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("[file] cannot create ", tmp_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("[file] writing ", path_, " failed: ", std::strerror(errno),
           errno == ENOSPC ? " (the disk is full: free space and retry; the previous file is untouched)" : "");
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("[file] fsync of ", tmp_, " failed: ", std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("[file] close of ", tmp_, " failed: ", std::strerror(errno));
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("[file] cannot rename ", tmp_, " to ", path_, ": ", std::strerror(errno));
  committed_ = true;
  fsync_dir(path_dirname(path_));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

}  // namespace rt
