#include "data/finetune.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <xxhash.h>

#include "core/error.h"
#include "io/token_file.h"

namespace rt {

static_assert(std::endian::native == std::endian::little, "the example cache is written in host byte order");

Truncation truncation_parse(const std::string& s) {
  if (s == "keep-start") return Truncation::keep_start;
  if (s == "drop") return Truncation::drop;
  if (s == "split") return Truncation::split;
  fail("[data] unknown truncation '", s, "': use keep-start, drop or split");
}

PackAttention pack_attention_parse(const std::string& s) {
  if (s == "masked") return PackAttention::masked;
  if (s == "cross") return PackAttention::cross;
  fail("[data] unknown pack attention '", s, "': use masked or cross");
}

// ---- FinetuneDataset -----------------------------------------------------

namespace {

constexpr uint32_t trained_bit = 0x80000000u;

// An unlinked-on-finish temporary file of uint32 tokens.
class CacheWriter {
 public:
  explicit CacheWriter(std::string dir) {
    if (dir.empty()) {
      const char* t = std::getenv("TMPDIR");
      dir = t && *t ? t : "/tmp";
    }
    path_ = path_join(dir, "ramtrain-data-XXXXXX");
    const int fd = ::mkstemp(path_.data());
    if (fd < 0)
      fail("[data] cannot create a temporary file in ", dir, " for the encoded examples: ", std::strerror(errno),
           " (set TMPDIR to a writable directory)");
    f_ = ::fdopen(fd, "wb");
    RT_CHECK(f_, "[data] fdopen failed for ", path_);
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~CacheWriter() {
    if (f_) std::fclose(f_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  void write(const uint32_t* p, size_t n) {
    if (std::fwrite(p, 4, n, f_) != n)
      fail("[data] writing the encoded examples to ", path_, " failed: ", std::strerror(errno),
           " (disk full? set TMPDIR)");
  }
  // Closes the file, maps it and removes its name (the mapping keeps the data).
  MappedFile finish() {
    const bool ok = std::fflush(f_) == 0 && !std::ferror(f_);
    std::fclose(f_);
    f_ = nullptr;
    if (!ok) fail("[data] writing the encoded examples to ", path_, " failed (disk full? set TMPDIR)");
    MappedFile m(path_);
    ::unlink(path_.c_str());
    path_.clear();
    return m;
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

// Greedy packing: row boundaries (indices into order) of examples of `length`s.
void pack_rows(const std::vector<uint64_t>& order, const std::vector<uint32_t>& lengths_of, int64_t T, bool pack,
               std::vector<uint64_t>& row_begin) {
  row_begin.clear();
  int64_t used = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t need = static_cast<int64_t>(lengths_of[order[i]]) - 1;
    if (i == 0 || !pack || used + need > T) {
      row_begin.push_back(i);
      used = 0;
    }
    used += need;
  }
  row_begin.push_back(order.size());
}

}  // namespace

FinetuneDataset::FinetuneDataset(const std::vector<std::string>& files, const ExampleEncoder& enc,
                                 const FinetuneOptions& opt)
    : T_(opt.seq_len), opt_(opt) {
  RT_CHECK(!files.empty(), "[data] no data files given");
  const std::string name = files.size() == 1 ? files[0] : cat(files[0], " and ", files.size() - 1, " more");
  build(name, [&](const ExampleSink& add_example) {
    // A record may hold several examples (ExampleEncoder::example_start).
    auto sink = [&](const char*, std::vector<int32_t>& ids, std::vector<uint8_t>& trained) {
      RT_CHECK(trained.size() == ids.size(), "[data] internal: the encoder gave ", trained.size(), " mask flags for ",
               ids.size(), " ids");
      size_t b = 0;
      for (size_t k = 1; k <= ids.size(); ++k) {
        if (k < ids.size() && !(trained[k] & ExampleEncoder::example_start)) continue;
        add_example(std::span<const int32_t>(ids).subspan(b, k - b),
                    std::span<const uint8_t>(trained).subspan(b, k - b));
        b = k;
      }
    };
    ExampleEncoder const* e = &enc;
    stats_.records = records_for_each(
        files, opt.records, [e](const RecordPiece& p, EncodedPiece& out) { e->encode(p, out); }, sink);
  });
}

FinetuneDataset::FinetuneDataset(const TokenStream& tokens, const LossMaskFile& mask, const FinetuneOptions& opt)
    : T_(opt.seq_len), opt_(opt) {
  RT_CHECK(mask.size() == tokens.size(), "[data] internal: mask and token counts differ");
  build(tokens.path(), [&](const ExampleSink& add_example) {
    const uint8_t* f = mask.flags();
    std::vector<int32_t> ids;
    const uint64_t n = tokens.size();
    for (uint64_t b = 0; b < n;) {
      uint64_t e = b + 1;
      while (e < n && !(f[e] & mask_doc_start)) ++e;
      ids.resize(e - b);
      tokens.read(b, e - b, ids.data());
      add_example(ids, std::span<const uint8_t>(f + b, e - b));
      ++stats_.records.records;
      b = e;
    }
    stats_.records.kinds["documents"] = stats_.records.records;
    stats_.records.files = 1;
  });
}

void FinetuneDataset::build(const std::string& name, const std::function<void(const ExampleSink&)>& produce) {
  const FinetuneOptions& opt = opt_;
  RT_CHECK(T_ >= 1, "[data] --seq-len must be >= 1 (got ", T_, ")");
  RT_CHECK(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0, "[data] --val-fraction must be in [0, 1) (got ",
           opt.val_fraction, ")");
  const uint64_t T = static_cast<uint64_t>(T_);
  CacheWriter cache(opt.cache_dir);
  std::vector<uint32_t> buf;
  std::vector<uint32_t> trained_count;  // per example
  uint64_t offset = 0;
  auto add_example = [&](std::span<const int32_t> ids, std::span<const uint8_t> trained) {
    const uint64_t L = ids.size();
    if (L < 2) {
      ++stats_.dropped_too_short;
      return;
    }
    std::vector<std::pair<uint64_t, uint64_t>> windows;
    if (L <= T + 1) {
      windows.push_back({0, L});
    } else if (opt.truncation == Truncation::keep_start) {
      windows.push_back({0, T + 1});
      ++stats_.truncated;
      stats_.truncated_tokens += L - (T + 1);
    } else if (opt.truncation == Truncation::drop) {
      ++stats_.dropped_too_long;
      return;
    } else {
      for (uint64_t b = 0; b + 1 < L; b += T) windows.push_back({b, std::min(b + T + 1, L)});
      ++stats_.split;
      stats_.split_windows += windows.size();
    }
    for (auto [b, e] : windows) {
      uint32_t n_trained = 0;
      for (uint64_t j = b + 1; j < e; ++j) n_trained += trained[j] & 1;
      if (n_trained == 0) {
        ++stats_.dropped_untrained;
        continue;
      }
      buf.resize(e - b);
      for (uint64_t j = b; j < e; ++j)
        buf[j - b] = static_cast<uint32_t>(ids[j]) | (j > b && (trained[j] & 1) ? trained_bit : 0u);
      cache.write(buf.data(), buf.size());
      examples_.push_back({offset, static_cast<uint32_t>(e - b)});
      trained_count.push_back(n_trained);
      offset += e - b;
    }
  };
  produce(add_example);
  const uint64_t n = examples_.size();
  stats_.examples = n;
  stats_.val_examples = static_cast<uint64_t>(std::floor(static_cast<double>(n) * opt.val_fraction));
  n_train_ = n - stats_.val_examples;
  if (n_train_ == 0)
    fail("[data] ", name, ": no training example left (", stats_.records.summary(), "; ", n, " examples kept",
         stats_.dropped_untrained ? cat(", ", stats_.dropped_untrained, " dropped with no trained token") : "",
         stats_.dropped_too_long ? cat(", ", stats_.dropped_too_long, " dropped as too long") : "", ")");
  if (opt.val_fraction > 0 && stats_.val_examples == 0)
    fail("[data] ", name, ": --val-fraction ", opt.val_fraction, " of ", n,
         " examples holds no validation example; use more data, a larger --val-fraction, or --val-fraction 0");
  for (uint64_t i = 0; i < n; ++i) {
    (i < n_train_ ? stats_.tokens : stats_.val_tokens) += examples_[i].length - 1;
    if (i < n_train_) stats_.trained_tokens += trained_count[i];
  }
  cache_ = cache.finish();
  val_order_.resize(n - n_train_);
  for (uint64_t i = 0; i < val_order_.size(); ++i) val_order_[i] = n_train_ + i;
  std::vector<uint32_t> lengths(n);
  for (uint64_t i = 0; i < n; ++i) lengths[i] = examples_[i].length;
  pack_rows(val_order_, lengths, T_, opt_.pack, val_row_begin_);
  stats_.val_rows = val_order_.empty() ? 0 : val_row_begin_.size() - 1;
  plan_epoch(0);
  stats_.rows_epoch0 = row_begin_.size() - 1;
}

void FinetuneDataset::plan_epoch(uint64_t epoch) {
  if (plan_valid_ && plan_epoch_ == epoch) return;
  order_ = window_order(n_train_, opt_.seed, epoch);
  std::vector<uint32_t> lengths(n_train_);
  for (uint64_t i = 0; i < n_train_; ++i) lengths[i] = examples_[i].length;
  pack_rows(order_, lengths, T_, opt_.pack, row_begin_);
  plan_epoch_ = epoch;
  plan_valid_ = true;
}

uint64_t FinetuneDataset::rows_in_epoch(uint64_t epoch) {
  plan_epoch(epoch);
  return row_begin_.size() - 1;
}

std::vector<std::vector<uint64_t>> FinetuneDataset::epoch_rows(uint64_t epoch) {
  plan_epoch(epoch);
  std::vector<std::vector<uint64_t>> rows;
  for (size_t r = 0; r + 1 < row_begin_.size(); ++r)
    rows.emplace_back(order_.begin() + static_cast<std::ptrdiff_t>(row_begin_[r]),
                      order_.begin() + static_cast<std::ptrdiff_t>(row_begin_[r + 1]));
  return rows;
}

void FinetuneDataset::fill_row(const uint64_t* ex, size_t n, int64_t row, Batch& b) const {
  const uint32_t* cache = reinterpret_cast<const uint32_t*>(cache_.data());
  int32_t* in = b.inputs.data() + row * T_;
  int32_t* tg = b.targets.data() + row * T_;
  int32_t* pos = b.positions.data() + row * T_;
  int32_t* doc = b.doc_start.empty() ? nullptr : b.doc_start.data() + row * T_;
  int64_t t = 0;
  for (size_t k = 0; k < n; ++k) {
    const Example& e = examples_[ex[k]];
    const uint32_t* tok = cache + e.offset;
    const int64_t t0 = t;
    RT_CHECK(t0 + e.length - 1 <= T_, "[data] internal: a packed row overflows seq_len");
    for (uint32_t j = 0; j + 1 < e.length; ++j, ++t) {
      in[t] = static_cast<int32_t>(tok[j] & ~trained_bit);
      tg[t] = tok[j + 1] & trained_bit ? static_cast<int32_t>(tok[j + 1] & ~trained_bit) : ignore_target;
      pos[t] = static_cast<int32_t>(j);
      if (doc) doc[t] = static_cast<int32_t>(t0);
    }
  }
  for (int64_t p0 = t; t < T_; ++t) {  // the padding tail: a document of its own
    in[t] = opt_.pad_id;
    tg[t] = ignore_target;
    pos[t] = static_cast<int32_t>(t - p0);
    if (doc) doc[t] = static_cast<int32_t>(p0);
  }
}

Batch FinetuneDataset::make_batch(int64_t B) const {
  Batch b;
  b.B = B;
  b.T = T_;
  b.inputs.resize(static_cast<size_t>(B * T_));
  b.targets.resize(b.inputs.size());
  b.positions.resize(b.inputs.size());
  if (opt_.pack && opt_.pack_attention == PackAttention::masked) b.doc_start.resize(b.inputs.size());
  return b;
}

Batch FinetuneDataset::next_batch(int64_t B) {
  RT_CHECK(B >= 1, "[data] batch size must be >= 1 (got ", B, ")");
  Batch b = make_batch(B);
  for (int64_t r = 0; r < B; ++r) {
    plan_epoch(epoch_);
    if (row_ >= row_begin_.size() - 1) {
      ++epoch_;
      row_ = 0;
      plan_epoch(epoch_);
    }
    fill_row(order_.data() + row_begin_[row_], row_begin_[row_ + 1] - row_begin_[row_], r, b);
    ++row_;
  }
  return b;
}

uint64_t FinetuneDataset::fingerprint() const {
  const uint8_t* p = cache_.data();
  const uint64_t n = cache_.size(), chunk = uint64_t(1) << 20;
  XXH3_state_t* st = XXH3_createState();
  if (!st) fail("[checkpoint] out of memory creating a hash state");
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &n, sizeof n);
  for (uint64_t begin : {uint64_t(0), n > chunk ? (n - chunk) / 2 : 0, n > chunk ? n - chunk : 0})
    if (n) XXH3_64bits_update(st, p + begin, std::min(chunk, n - begin));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

DataCursor FinetuneDataset::cursor() const {
  // rows per epoch can differ between epochs; the plan held is epoch_'s
  if (plan_valid_ && plan_epoch_ == epoch_ && row_ >= row_begin_.size() - 1) return {epoch_ + 1, 0};
  return {epoch_, row_};
}

void FinetuneDataset::set_cursor(const DataCursor& c) {
  const uint64_t rows = rows_in_epoch(c.epoch);
  if (c.index > rows)
    fail("[data] data cursor '", c.to_string(), "' is past the ", rows, " packed rows of epoch ", c.epoch,
         ": the data, --seq-len, --seed or the packing options differ from the run that saved it");
  epoch_ = c.epoch;
  row_ = c.index;
  if (row_ == rows) {
    ++epoch_;
    row_ = 0;
  }
}

std::vector<Batch> FinetuneDataset::val_batches(int64_t B, int64_t max_batches) const {
  RT_CHECK(B >= 1, "[data] validation batch size must be >= 1 (got ", B, ")");
  std::vector<Batch> out;
  if (val_order_.empty()) return out;
  uint64_t k = val_row_begin_.size() - 1;
  if (max_batches > 0) k = std::min<uint64_t>(k, static_cast<uint64_t>(B) * static_cast<uint64_t>(max_batches));
  for (uint64_t r0 = 0; r0 < k; r0 += static_cast<uint64_t>(B)) {
    const int64_t rows = static_cast<int64_t>(std::min<uint64_t>(static_cast<uint64_t>(B), k - r0));
    Batch b = make_batch(B);  // rows past the last validation row stay padding: no targets, no loss
    for (int64_t r = 0; r < B; ++r) {
      const uint64_t row = r0 + static_cast<uint64_t>(r);
      if (r < rows)
        fill_row(val_order_.data() + val_row_begin_[row], val_row_begin_[row + 1] - val_row_begin_[row], r, b);
      else
        fill_row(nullptr, 0, r, b);
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::string FinetuneStats::summary() const {
  std::string s = cat("data: ", records.summary(), "\n");
  s += cat("examples: ", examples, " kept (", examples - val_examples, " train, ", val_examples, " validation)");
  if (truncated)
    s += cat("; truncated ", truncated, " longer than seq_len+1 (", truncated_tokens,
             " tokens cut off; --truncate split keeps them)");
  if (split) s += cat("; split ", split, " long examples into ", split_windows, " windows");
  if (dropped_too_long) s += cat("; dropped ", dropped_too_long, " longer than seq_len+1 (--truncate drop)");
  if (dropped_too_short) s += cat("; dropped ", dropped_too_short, " with fewer than 2 tokens");
  if (dropped_untrained) s += cat("; dropped ", dropped_untrained, " with no trained token (after truncation)");
  s += "\n";
  s += cat("train: ", tokens, " predicted tokens, ", trained_tokens, " with loss, in ", rows_epoch0, " rows (epoch 0)");
  if (val_examples) s += cat("; validation: ", val_tokens, " predicted tokens in ", val_rows, " rows");
  return s;
}

}  // namespace rt
