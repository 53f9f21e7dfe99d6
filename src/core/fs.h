// Files: read whole files, map them read-only, and write them atomically.
// Every write that a user keeps goes through AtomicFile: data goes to a
// temporary file beside the target, is fsync'ed, renamed over the target and
// the directory is fsync'ed. An AtomicFile destroyed before commit() removes
// its temporary, so a failed write never leaves a half-written output.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace rt {

std::string read_text_file(const std::string& path);  // throws rt::Error naming the path
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
uint64_t file_size(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p
void fsync_dir(const std::string& dir);
std::string path_join(const std::string& a, const std::string& b);
std::string path_dirname(const std::string& p);

// What is at path, for messages: "a regular file", "a directory", "a FIFO (named
// pipe)", "a character device", "a block device", "a socket", "a symbolic link
// to a missing target"; "" when nothing is there.
std::string path_kind(const std::string& path);
// Throws "<where> <path>: no such file or directory" or "<where> <path>: is a FIFO
// (named pipe), not a regular file ..." unless path is a regular file (or, with
// dir_ok, a directory). Data is memory-mapped: pipes and devices cannot be read.
void require_regular_file(const std::string& path, const std::string& where, bool dir_ok = false);
// An output directory's checks before a long run writes into it: creates it
// (mkdir -p), then creates, writes, fsyncs and removes a probe file; throws
// "<where> <flag> <dir> ..." when the path is not a directory or cannot be
// written. Returns a warning ("" none) when the file system has less free
// space than need_bytes.
std::string check_out_writable(const std::string& dir, uint64_t need_bytes, const std::string& where = "[train]",
                               const std::string& flag = "--out");
// Free bytes for an unprivileged writer on the file system holding path (UINT64_MAX when unknown).
uint64_t fs_free_bytes(const std::string& path);

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws rt::Error
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // opens "<path>.tmp.<pid>"
  ~AtomicFile();                                 // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // throws rt::Error (e.g. disk full) naming the path
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();  // fsync, close, rename over the target, fsync the directory
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
};

// Writes a whole string atomically.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace rt
