// Loss-mask files: the per-token flags `ramtrain tokenize` writes beside a
// token file OUT as OUT.mask when its documents carry loss masks (chat,
// instruction and prompt/completion records); docs/token_format.md.
//   offset  size  field
//   0       8     magic, the ASCII bytes "RTLMASK1"
//   8       N     one byte per token: bit 0 = the token is a trained target,
//                 bit 1 = the token starts a document; other bits 0
//   8+N     8     uint64 N, the token count (equal to the token file's)
// Token 0 always starts a document. Written atomically (AtomicFile).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/fs.h"

namespace rt {

constexpr uint8_t mask_trained = 1, mask_doc_start = 2;

std::string loss_mask_path(const std::string& token_file);  // token_file + ".mask"

class LossMaskWriter {
 public:
  explicit LossMaskWriter(const std::string& path);
  void append(std::span<const uint8_t> flags);  // flags of one document; the first gets mask_doc_start
  void commit();                                // writes the count, then fsync + rename
  uint64_t count() const { return count_; }

 private:
  AtomicFile file_;
  uint64_t count_ = 0;
};

// Maps and checks a mask file against the token count of its token file;
// throws "[tokens] <path>: ..." naming what is wrong.
class LossMaskFile {
 public:
  LossMaskFile(const std::string& path, uint64_t expected_tokens);
  const uint8_t* flags() const { return map_.data() + 8; }
  uint64_t size() const { return count_; }

 private:
  MappedFile map_;
  uint64_t count_ = 0;
};

}  // namespace rt
