#include "data/loss_mask_file.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace rt {

namespace {
constexpr char kMagic[8] = {'R', 'T', 'L', 'M', 'A', 'S', 'K', '1'};
}

std::string loss_mask_path(const std::string& token_file) { return token_file + ".mask"; }

LossMaskWriter::LossMaskWriter(const std::string& path) : file_(path) { file_.write(kMagic, sizeof kMagic); }

void LossMaskWriter::append(std::span<const uint8_t> flags) {
  if (flags.empty()) return;
  std::vector<uint8_t> f(flags.begin(), flags.end());
  for (uint8_t& x : f) x &= mask_trained;
  f[0] |= mask_doc_start;
  file_.write(f.data(), f.size());
  count_ += f.size();
}

void LossMaskWriter::commit() {
  uint8_t n[8];
  for (int k = 0; k < 8; ++k) n[k] = static_cast<uint8_t>(count_ >> (8 * k));
  file_.write(n, sizeof n);
  file_.commit();
}

LossMaskFile::LossMaskFile(const std::string& path, uint64_t expected_tokens) : map_(path) {
  const uint8_t* d = map_.data();
  const uint64_t size = map_.size();
  if (size < 16 || std::memcmp(d, kMagic, 8) != 0)
    fail("[tokens] ", path,
         ": not a ramtrain loss-mask file (no RTLMASK1 header); remove it or re-run ramtrain tokenize");
  uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= uint64_t(d[size - 8 + uint64_t(k)]) << (8 * k);
  if (n != size - 16)
    fail("[tokens] ", path, ": truncated or corrupt (its count says ", n, " tokens, its size holds ", size - 16,
         "); re-run ramtrain tokenize to write the token file and its masks again");
  if (n != expected_tokens)
    fail("[tokens] ", path, ": has ", n, " flags but its token file has ", expected_tokens,
         " tokens: they were not written together; re-run ramtrain tokenize");
  if (n > 0 && !(d[8] & mask_doc_start))
    fail("[tokens] ", path, ": the first token does not start a document (a damaged file); re-run ramtrain tokenize");
  for (uint64_t i = 0; i < n; ++i)
    if (d[8 + i] & ~(mask_trained | mask_doc_start))
      fail("[tokens] ", path, ": flag byte ", i, " is ", int(d[8 + i]),
           " (only bits 0 and 1 may be set: a damaged file); re-run ramtrain tokenize");
  count_ = n;
}

}  // namespace rt
