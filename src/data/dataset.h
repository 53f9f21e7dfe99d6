// Training data: a seeded, resumable window dataset over one token stream,
// with a train/validation split, plus the plain-text loader.
//   N tokens, seq_len T. Train part = tokens [0, N_train), validation part =
//   [N_train, N) with N_val = floor(N * val_fraction), N_train = N - N_val.
//   A window is T+1 consecutive tokens from offset o: inputs = [o, o+T),
//   targets = [o+1, o+T+1). Windows never cross the split.
//   Train windows: the fixed grid o = k*T, k in [0, W), W = (N_train-1)/T;
//   epoch e visits them in the order window_order(W, seed, e).
//   Validation windows: o = N_train + k*T, k in [0, (N_val-1)/T), always in order.
// Determinism: window_order uses std::mt19937_64 (its output is fixed by the
// C++ standard) with our own Lemire draw and Fisher-Yates, never std::shuffle
// or std::uniform_int_distribution, so every platform gives the same order.
// Resuming: a DataCursor {epoch, index} names the next train window; a dataset
// set to cursor c yields exactly the batches an uninterrupted run yields after c.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/data_cursor.h"
#include "io/token_file.h"

namespace rt {

constexpr int32_t ignore_target = -100;  // a target position that carries no loss

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs;   // (B, T) row-major
  std::vector<int32_t> targets;  // (B, T); ignore_target where there is no target
  // (B, T) RoPE positions, or empty: position i % T (one document per row).
  // Packed rows (data/finetune.h) restart at 0 for every example.
  std::vector<int32_t> positions;
  // (B, T) document starts for attention masking, or empty: plain causal
  // attention over the row. Packed rows (data/finetune.h) with masking on
  // hold, for each token, the row position of its example's first input
  // token (the attention ops' doc_start contract, cpu/ops.h).
  std::vector<int32_t> doc_start;
};

// Fills pos[0, B*T) with b's positions (b.positions, or i % T when empty).
void batch_positions(const Batch& b, int32_t* pos);
// b.doc_start's data, or nullptr when it is empty (plain causal); throws
// when its size is not B*T.
const int32_t* batch_doc_start(const Batch& b);

struct DatasetOptions {
  int64_t seq_len = 0;        // T >= 1
  double val_fraction = 0.1;  // in [0, 1); 0 = no validation part
  uint64_t seed = 0;
  uint64_t vocab_size = 0;  // > 0: refuse ids >= vocab_size at construction
};

// A permutation of [0, n): Fisher-Yates driven by std::mt19937_64 seeded with
// a splitmix64 hash of (seed, epoch). Identical on every platform.
std::vector<uint64_t> window_order(uint64_t n, uint64_t seed, uint64_t epoch);

// What the trainer draws batches from: the window Dataset below, or the
// fine-tuning dataset of masked examples (data/finetune.h).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next_batch(int64_t B) = 0;
  virtual DataCursor cursor() const = 0;
  virtual void set_cursor(const DataCursor& c) = 0;
  virtual std::vector<Batch> val_batches(int64_t B, int64_t max_batches) const = 0;
  virtual int64_t seq_len() const = 0;
  virtual uint64_t train_token_count() const = 0;
  virtual uint64_t val_token_count() const = 0;
  // Rows of one epoch (Dataset: windows; fine-tuning: packed rows of epoch 0).
  virtual uint64_t train_window_count() const = 0;
  // A sampled hash of the data (checkpoints compare it on resume): catches
  // changed or reordered data in O(1) reads.
  virtual uint64_t fingerprint() const = 0;
};
// The data's fingerprint, as stored in checkpoints (RunIdentity).
inline uint64_t dataset_fingerprint(const BatchSource& data) { return data.fingerprint(); }

class Dataset final : public BatchSource {
 public:
  // Throws "[data] ..." when the train part holds no window, when val_fraction
  // > 0 and the validation part holds no window, or on bad options.
  Dataset(TokenStream tokens, const DatasetOptions& opt);

  // The next B train windows, moving to the next epoch when one is exhausted.
  Batch next_batch(int64_t B) override;
  // Canonical: a finished epoch e reads as {e + 1, 0}.
  DataCursor cursor() const override;
  // Throws when index > the windows per epoch (the data or seq_len changed).
  void set_cursor(const DataCursor& c) override;

  // The first K = min(val windows, B * max_batches) validation windows in
  // order, in batches of B (the last one may have fewer rows); max_batches
  // <= 0 means every validation window. Empty when val_fraction is 0.
  std::vector<Batch> val_batches(int64_t B, int64_t max_batches) const override;

  int64_t seq_len() const override { return T_; }
  uint64_t train_token_count() const override { return n_train_; }
  uint64_t val_token_count() const override { return tokens_.size() - n_train_; }
  uint64_t train_window_count() const override { return n_windows_; }
  uint64_t fingerprint() const override;  // of the token stream (dataset_fingerprint)
  uint64_t val_window_count() const { return n_val_windows_; }
  const TokenStream& tokens() const { return tokens_; }

 private:
  void fill_row(uint64_t offset, int64_t row, Batch& b, std::vector<int32_t>& buf) const;

  TokenStream tokens_;
  int64_t T_ = 0;
  uint64_t seed_ = 0;
  uint64_t n_train_ = 0, n_windows_ = 0, n_val_windows_ = 0;
  uint64_t epoch_ = 0, index_ = 0;
  std::vector<uint64_t> order_;  // window_order for order_epoch_
  uint64_t order_epoch_ = 0;
  bool order_valid_ = false;
};

// Plain text: every path is a file, or a directory searched recursively for
// regular files named *.md *.txt *.cpp *.h *.hpp *.cc *.cu *.py *.sh *.toml
// *.json *.cmake or CMakeLists.txt, skipping hidden entries (names starting
// with '.', e.g. .git) and sorted by path. A file named directly is always
// read, whatever its extension. Throws "[data] ..." when a path is missing or
// a directory has no such files.
std::vector<std::string> text_document_paths(const std::vector<std::string>& paths);
// Each file is one document, byte-tokenized as BOS bytes... EOS, concatenated
// in text_document_paths order. The stream has vocab 258. Throws when the
// files hold no bytes at all.
TokenStream load_text_documents(const std::vector<std::string>& paths);
// One token file (detected as in TokenStream::looks_like_token_file) opens as
// a TokenStream; anything else goes through load_text_documents.
TokenStream data_stream_open(const std::vector<std::string>& paths);

}  // namespace rt
