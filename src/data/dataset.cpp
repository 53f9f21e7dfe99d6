#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/fs.h"
#include "data/byte_tokenizer.h"
#include "io/checkpoint.h"

namespace rt {
namespace {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, n), n >= 1: Lemire's multiply-shift with rejection.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::string data_name(const TokenStream& t) {
  return (t.format() == TokenFormat::memory ? "data " : "file ") + t.path();
}

}  // namespace

void batch_positions(const Batch& b, int32_t* pos) {
  const size_t n = static_cast<size_t>(b.B * b.T);
  if (!b.positions.empty()) {
    RT_CHECK(b.positions.size() == n, "[data] batch has ", b.positions.size(), " positions for ", b.B, " x ", b.T,
             " tokens");
    std::copy(b.positions.begin(), b.positions.end(), pos);
    return;
  }
  for (size_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i % static_cast<size_t>(b.T));
}

const int32_t* batch_doc_start(const Batch& b) {
  if (b.doc_start.empty()) return nullptr;
  RT_CHECK(b.doc_start.size() == static_cast<size_t>(b.B * b.T), "[data] batch has ", b.doc_start.size(),
           " document starts for ", b.B, " x ", b.T, " tokens");
  return b.doc_start.data();
}

std::vector<uint64_t> window_order(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(splitmix64(splitmix64(seed) ^ epoch));
  for (uint64_t i = n; i > 1; --i) {
    uint64_t j = uniform_below(rng, i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

Dataset::Dataset(TokenStream tokens, const DatasetOptions& opt)
    : tokens_(std::move(tokens)), T_(opt.seq_len), seed_(opt.seed) {
  RT_CHECK(T_ >= 1, "[data] --seq-len must be >= 1 (got ", T_, ")");
  RT_CHECK(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0, "[data] --val-fraction must be in [0, 1) (got ",
           opt.val_fraction, ")");
  if (opt.vocab_size > 0) tokens_.validate_ids(opt.vocab_size);
  const uint64_t n = tokens_.size();
  const uint64_t T = uint64_t(T_);
  const uint64_t n_val = static_cast<uint64_t>(std::floor(static_cast<double>(n) * opt.val_fraction));
  n_train_ = n - std::min(n_val, n);
  if (n_train_ < T + 1) {
    if (opt.val_fraction > 0.0)
      fail("[data] ", data_name(tokens_), " has ", n, " tokens, of which the train part (all but --val-fraction ",
           opt.val_fraction, ") is ", n_train_, "; one window of seq_len ", T, " needs ", T + 1,
           "; use a smaller --seq-len or more data");
    fail("[data] ", data_name(tokens_), " has ", n, " tokens; one window of seq_len ", T, " needs ", T + 1,
         "; use a smaller --seq-len or more data");
  }
  n_windows_ = (n_train_ - 1) / T;
  const uint64_t val_tokens = n - n_train_;
  if (opt.val_fraction > 0.0 && val_tokens < T + 1)
    fail("[data] ", data_name(tokens_), ": the validation part (the last ", val_tokens, " of ", n,
         " tokens, --val-fraction ", opt.val_fraction, ") is shorter than one window of seq_len ", T, " (", T + 1,
         " tokens); use a larger --val-fraction, a smaller --seq-len, or --val-fraction 0 for no validation");
  n_val_windows_ = val_tokens >= T + 1 ? (val_tokens - 1) / T : 0;
}

void Dataset::fill_row(uint64_t offset, int64_t row, Batch& b, std::vector<int32_t>& buf) const {
  tokens_.read(offset, uint64_t(T_) + 1, buf.data());
  std::copy(buf.begin(), buf.begin() + T_, b.inputs.begin() + row * T_);
  std::copy(buf.begin() + 1, buf.end(), b.targets.begin() + row * T_);
}

Batch Dataset::next_batch(int64_t B) {
  RT_CHECK(B >= 1, "[data] batch size must be >= 1 (got ", B, ")");
  Batch b;
  b.B = B;
  b.T = T_;
  b.inputs.resize(size_t(B * T_));
  b.targets.resize(size_t(B * T_));
  std::vector<int32_t> buf(size_t(T_) + 1);
  for (int64_t r = 0; r < B; ++r) {
    if (index_ >= n_windows_) {
      ++epoch_;
      index_ = 0;
    }
    if (!order_valid_ || order_epoch_ != epoch_) {
      order_ = window_order(n_windows_, seed_, epoch_);
      order_epoch_ = epoch_;
      order_valid_ = true;
    }
    fill_row(order_[index_] * uint64_t(T_), r, b, buf);
    ++index_;
  }
  return b;
}

uint64_t Dataset::fingerprint() const { return dataset_fingerprint(tokens_); }

DataCursor Dataset::cursor() const {
  if (index_ >= n_windows_) return {epoch_ + 1, 0};
  return {epoch_, index_};
}

void Dataset::set_cursor(const DataCursor& c) {
  if (c.index > n_windows_)
    fail("[data] data cursor '", c.to_string(), "' is past the ", n_windows_, " train windows of an epoch of ",
         data_name(tokens_), ": the data or --seq-len differ from the run that saved it");
  epoch_ = c.epoch;
  index_ = c.index;
  if (index_ == n_windows_) {
    ++epoch_;
    index_ = 0;
  }
}

std::vector<Batch> Dataset::val_batches(int64_t B, int64_t max_batches) const {
  RT_CHECK(B >= 1, "[data] validation batch size must be >= 1 (got ", B, ")");
  uint64_t k = n_val_windows_;
  if (max_batches > 0) k = std::min<uint64_t>(k, uint64_t(B) * uint64_t(max_batches));
  std::vector<Batch> out;
  std::vector<int32_t> buf(size_t(T_) + 1);
  for (uint64_t w = 0; w < k; w += uint64_t(B)) {
    Batch b;
    b.B = int64_t(std::min<uint64_t>(uint64_t(B), k - w));
    b.T = T_;
    b.inputs.resize(size_t(b.B * T_));
    b.targets.resize(size_t(b.B * T_));
    for (int64_t r = 0; r < b.B; ++r) fill_row(n_train_ + (w + uint64_t(r)) * uint64_t(T_), r, b, buf);
    out.push_back(std::move(b));
  }
  return out;
}

namespace {

bool is_text_name(const std::filesystem::path& p) {
  static const char* const exts[] = {".md", ".txt", ".cpp", ".h",    ".hpp",  ".cc",
                                     ".cu", ".py",  ".sh",  ".toml", ".json", ".cmake"};
  if (p.filename() == "CMakeLists.txt") return true;
  const std::string e = p.extension().string();
  return std::any_of(std::begin(exts), std::end(exts), [&](const char* x) { return e == x; });
}

// A directory ramtrain wrote: a run's --out (its lock file or checkpoints),
// a checkpoint, or an exported model (ramtrain.json). Its JSON and text files
// are not training data.
bool is_ramtrain_output(const std::filesystem::path& d) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto has = [&](const char* f) { return fs::exists(d / f, ec); };
  return has(".ramtrain.lock") || has("ramtrain.json") || (has("manifest.json") && has("trainer.json")) ||
         !checkpoint_list(d.string()).empty();
}

}  // namespace

std::vector<std::string> text_document_paths(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  RT_CHECK(!paths.empty(), "[data] no data paths given");
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    if (file_exists(p)) {
      out.push_back(p);
      continue;
    }
    if (!is_directory(p)) fail("[data] ", p, ": no such file or directory");
    std::vector<std::string> found;
    int outputs = 0;
    try {
      for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator(); ++it) {
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_directory() && is_ramtrain_output(it->path())) {  // e.g. an --out inside the data
          it.disable_recursion_pending();
          ++outputs;
          continue;
        }
        if (it->is_regular_file() && is_text_name(it->path())) found.push_back(it->path().string());
      }
    } catch (const fs::filesystem_error& e) {
      fail("[data] ", p, ": cannot list the directory: ", e.what());
    }
    if (found.empty())
      fail("[data] ", p,
           ": no text files found (looked for *.md *.txt *.cpp *.h *.hpp *.cc *.cu *.py *.sh *.toml *.json *.cmake "
           "CMakeLists.txt, hidden entries skipped)");
    if (outputs > 0)
      std::printf("note: --data %s: skipped %d ramtrain output director%s inside it (runs, checkpoints, exports)\n",
                  p.c_str(), outputs, outputs == 1 ? "y" : "ies");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

TokenStream load_text_documents(const std::vector<std::string>& paths) {
  const std::vector<std::string> files = text_document_paths(paths);
  ByteTokenizer tok;
  std::vector<int32_t> ids;
  uint64_t text_bytes = 0;
  for (const std::string& f : files) {
    std::string text;
    try {
      text = read_text_file(f);
    } catch (const Error& e) {
      fail("[data] ", f, ": ", e.what());
    }
    text_bytes += text.size();
    tok.encode_append(text, /*add_bos_eos=*/true, ids);
  }
  const std::string name = paths.size() == 1 ? paths[0] : cat(paths[0], " and ", paths.size() - 1, " more");
  if (text_bytes == 0)
    fail("[data] ", name, ": all ", files.size(), " text file(s) are empty; there is no text to train on");
  return TokenStream::from_ids(ids, name, ByteTokenizer::vocab_size);
}

TokenStream data_stream_open(const std::vector<std::string>& paths) {
  RT_CHECK(!paths.empty(), "[data] no data paths given");
  if (paths.size() == 1 && TokenStream::looks_like_token_file(paths[0])) return TokenStream::open(paths[0]);
  for (const std::string& p : paths)
    if (TokenStream::looks_like_token_file(p))
      fail("[data] ", p, ": is a token file; give one token file on its own, or only text files and directories");
  return load_text_documents(paths);
}

}  // namespace rt
