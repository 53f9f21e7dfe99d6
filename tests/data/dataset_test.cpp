// Dataset: window order against an independent Python implementation
// (tools/window_order_reference.py), determinism, every train window exactly
// once per epoch, no window crossing into validation, exact resume from a
// cursor (mid-epoch and at an epoch boundary), fixed validation batches, the
// refusals, and the plain-text loader.
// Most tests use the identity stream ids[i] = i, so a token's value is its
// position and each window's offset can be read off its first input.
#include "data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "testutil.h"

namespace rt {
namespace {

using test::TempDir;
using test::write_bytes;

using test::expect_error;

TokenStream identity_stream(int32_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  return TokenStream::from_ids(ids, "identity", 0);
}

// N = 1000, T = 7, val 0.1: N_val = 100, N_train = 900, W = 899 / 7 = 128,
// validation windows (100 - 1) / 7 = 14.
constexpr int32_t N = 1000;
constexpr int64_t T = 7;
constexpr uint64_t W = 128;

Dataset make_dataset(uint64_t seed, double val_fraction = 0.1) {
  DatasetOptions o;
  o.seq_len = T;
  o.val_fraction = val_fraction;
  o.seed = seed;
  return Dataset(identity_stream(N), o);
}

// Offsets of the rows of b (identity stream: first input of a row = offset).
std::vector<uint64_t> row_offsets(const Batch& b) {
  std::vector<uint64_t> o;
  for (int64_t r = 0; r < b.B; ++r) o.push_back(uint64_t(b.inputs[size_t(r * b.T)]));
  return o;
}

bool same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].B != b[i].B || a[i].T != b[i].T || a[i].inputs != b[i].inputs || a[i].targets != b[i].targets)
      return false;
  return true;
}

std::vector<Batch> take(Dataset& d, int64_t B, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(d.next_batch(B));
  return out;
}

TEST(WindowOrder, MatchesIndependentPythonReference) {
  // From python3 tools/window_order_reference.py (pure-Python mt19937_64,
  // self-checked against the C++ standard's 10000th-draw value).
  EXPECT_EQ(window_order(10, 0, 0), (std::vector<uint64_t>{5, 2, 9, 6, 1, 8, 7, 3, 0, 4}));
  EXPECT_EQ(window_order(10, 0, 1), (std::vector<uint64_t>{1, 2, 8, 9, 3, 4, 7, 0, 6, 5}));
  EXPECT_EQ(window_order(10, 1234, 0), (std::vector<uint64_t>{7, 3, 9, 4, 0, 2, 1, 6, 5, 8}));
  EXPECT_EQ(window_order(13, 1234, 7), (std::vector<uint64_t>{6, 5, 3, 0, 1, 11, 9, 2, 7, 10, 4, 8, 12}));
}

TEST(WindowOrder, IsAPermutation) {
  for (uint64_t n : {0, 1, 2, 3, 1000}) {
    std::vector<uint64_t> p = window_order(n, 42, 3);
    std::sort(p.begin(), p.end());
    std::vector<uint64_t> ref(n);
    std::iota(ref.begin(), ref.end(), 0);
    EXPECT_EQ(p, ref) << "n=" << n;
  }
}

TEST(Dataset, SplitAndWindowCounts) {
  Dataset d = make_dataset(1);
  EXPECT_EQ(d.train_token_count(), 900u);
  EXPECT_EQ(d.val_token_count(), 100u);
  EXPECT_EQ(d.train_window_count(), W);
  EXPECT_EQ(d.val_window_count(), 14u);
  Dataset all = make_dataset(1, 0.0);
  EXPECT_EQ(all.train_token_count(), 1000u);
  EXPECT_EQ(all.train_window_count(), 999u / 7);
  EXPECT_EQ(all.val_window_count(), 0u);
  EXPECT_TRUE(all.val_batches(4, 0).empty());
}

TEST(Dataset, EveryTrainWindowOncePerEpochInSeededOrder) {
  Dataset d = make_dataset(99);
  // B = 5 does not divide W = 128, so an epoch ends inside a batch.
  std::vector<uint64_t> seen;
  while (seen.size() < 2 * W) {
    Batch b = d.next_batch(5);
    ASSERT_EQ(b.B, 5);
    ASSERT_EQ(b.T, T);
    for (int64_t r = 0; r < b.B; ++r) {
      const int32_t o = b.inputs[size_t(r * T)];
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(b.inputs[size_t(r * T + t)], o + t);       // T consecutive tokens
        EXPECT_EQ(b.targets[size_t(r * T + t)], o + t + 1);  // shifted by one
      }
      EXPECT_LT(o + T, 900) << "target past the train part";  // last target index < N_train
    }
    std::vector<uint64_t> o = row_offsets(b);
    seen.insert(seen.end(), o.begin(), o.end());
  }
  seen.resize(2 * W);
  for (uint64_t e = 0; e < 2; ++e) {
    std::vector<uint64_t> ref = window_order(W, 99, e);
    for (uint64_t& x : ref) x *= uint64_t(T);
    EXPECT_EQ(std::vector<uint64_t>(seen.begin() + long(e * W), seen.begin() + long((e + 1) * W)), ref)
        << "epoch " << e;
    std::vector<uint64_t> sorted = ref;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t k = 0; k < W; ++k) ASSERT_EQ(sorted[k], k * uint64_t(T));  // the grid, each once
  }
}

TEST(Dataset, SameSeedSameBatchesDifferentSeedDifferentOrder) {
  Dataset a = make_dataset(5), b = make_dataset(5), c = make_dataset(6);
  std::vector<Batch> ba = take(a, 8, 40), bb = take(b, 8, 40), bc = take(c, 8, 40);
  EXPECT_TRUE(same_batches(ba, bb));
  EXPECT_FALSE(same_batches(ba, bc));
  // Consecutive epochs use different orders too.
  EXPECT_NE(window_order(W, 5, 0), window_order(W, 5, 1));
}

TEST(Dataset, ResumeMidEpochAndAtEpochBoundary) {
  Dataset ref = make_dataset(11);
  std::vector<Batch> full = take(ref, 8, 40);  // W / 8 = 16 batches per epoch

  for (int cut : {13, 16, 32, 37}) {  // mid-epoch, boundary, boundary, mid-epoch
    Dataset first = make_dataset(11);
    take(first, 8, cut);
    const std::string saved = first.cursor().to_string();
    if (cut % 16 == 0) {
      EXPECT_EQ(first.cursor(), (DataCursor{uint64_t(cut / 16), 0}));
    }
    Dataset resumed = make_dataset(11);
    resumed.set_cursor(DataCursor::parse(saved));
    std::vector<Batch> rest = take(resumed, 8, 40 - cut);
    EXPECT_TRUE(same_batches(rest, std::vector<Batch>(full.begin() + cut, full.end()))) << "cut " << cut;
  }
  // {e, W} is the same place as {e + 1, 0}.
  Dataset x = make_dataset(11), y = make_dataset(11);
  x.set_cursor({0, W});
  y.set_cursor({1, 0});
  EXPECT_EQ(x.cursor(), (DataCursor{1, 0}));
  EXPECT_TRUE(same_batches(take(x, 3, 5), take(y, 3, 5)));
  // A batch size that straddles the boundary (B = 5) resumes exactly too.
  Dataset s1 = make_dataset(3);
  std::vector<Batch> all5 = take(s1, 5, 60);
  Dataset s2 = make_dataset(3);
  take(s2, 5, 26);  // 130 windows: 2 into epoch 1
  EXPECT_EQ(s2.cursor(), (DataCursor{1, 2}));
  Dataset s3 = make_dataset(3);
  s3.set_cursor(s2.cursor());
  EXPECT_TRUE(same_batches(take(s3, 5, 34), std::vector<Batch>(all5.begin() + 26, all5.end())));
}

TEST(Dataset, CursorStrings) {
  EXPECT_EQ((DataCursor{3, 120}).to_string(), "epoch=3 index=120");
  EXPECT_EQ(DataCursor::parse("epoch=3 index=120"), (DataCursor{3, 120}));
  EXPECT_EQ(DataCursor::parse("epoch=18446744073709551615 index=0"), (DataCursor{UINT64_MAX, 0}));
  for (const char* bad : {"", "epoch=3", "epoch=-1 index=2", "epoch=3 index=1x", "epoch=3  index=1",
                          "epoch=18446744073709551616 index=0", "index=1 epoch=3"})
    expect_error([&] { DataCursor::parse(bad); }, {"[data] bad data cursor"});
  Dataset d = make_dataset(1);
  expect_error([&] { d.set_cursor({0, W + 1}); }, {"[data]", "past the 128 train windows", "--seq-len"});
}

TEST(Dataset, ValidationBatchesAreFixedAndInOrder) {
  Dataset d = make_dataset(1);
  std::vector<Batch> v1 = d.val_batches(4, 0);
  take(d, 8, 20);  // train progress must not change them
  std::vector<Batch> v2 = d.val_batches(4, 0);
  EXPECT_TRUE(same_batches(v1, v2));
  EXPECT_TRUE(same_batches(v1, make_dataset(777).val_batches(4, 0)));  // nor the seed
  ASSERT_EQ(v1.size(), 4u);                                            // 14 windows: 4 + 4 + 4 + 2
  EXPECT_EQ(v1[3].B, 2);
  uint64_t k = 0;
  for (const Batch& b : v1)
    for (int64_t r = 0; r < b.B; ++r, ++k)
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(b.inputs[size_t(r * T + t)], int32_t(900 + k * T + t));
        EXPECT_EQ(b.targets[size_t(r * T + t)], int32_t(900 + k * T + t + 1));
      }
  EXPECT_EQ(k, 14u);
  std::vector<Batch> two = d.val_batches(4, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_TRUE(same_batches(two, std::vector<Batch>(v1.begin(), v1.begin() + 2)));
}

TEST(Dataset, MappedFileGivesSameBatchesAsMemory) {
  TempDir dir;
  std::vector<int32_t> ids(N);
  std::iota(ids.begin(), ids.end(), 0);
  token_file_write(dir.file("a.tok"), ids, 0);
  DatasetOptions o;
  o.seq_len = T;
  o.seed = 4;
  Dataset from_file(TokenStream::open(dir.file("a.tok")), o);
  Dataset from_memory = make_dataset(4);
  EXPECT_TRUE(same_batches(take(from_file, 6, 30), take(from_memory, 6, 30)));
  EXPECT_TRUE(same_batches(from_file.val_batches(3, 0), from_memory.val_batches(3, 0)));
}

TEST(Dataset, Refusals) {
  TempDir dir;
  write_bytes(dir.file("tiny.bin"), std::string(16, '\1'));  // 8 nanoGPT tokens
  DatasetOptions o;
  o.seq_len = 8;
  o.val_fraction = 0.0;
  expect_error([&] { Dataset(TokenStream::open(dir.file("tiny.bin")), o); },
               {"[data] file " + dir.file("tiny.bin") + " has 8 tokens", "one window of seq_len 8 needs 9",
                "use a smaller --seq-len or more data"});
  o.seq_len = 7;
  Dataset(TokenStream::open(dir.file("tiny.bin")), o);  // exactly one window fits
  o.val_fraction = 0.5;                                 // train part 4 tokens
  expect_error([&] { Dataset(TokenStream::open(dir.file("tiny.bin")), o); },
               {"has 8 tokens", "train part", "is 4", "needs 8", "--seq-len"});

  o.seq_len = 10;
  o.val_fraction = 0.05;  // 100 tokens: N_val = 5 < 11
  expect_error([&] { Dataset(identity_stream(100), o); },
               {"[data] data identity", "validation part", "last 5 of 100", "--val-fraction 0"});
  o.val_fraction = 1.0;
  expect_error([&] { Dataset(identity_stream(100), o); }, {"--val-fraction must be in [0, 1)"});
  o.val_fraction = 0.1;
  o.seq_len = 0;
  expect_error([&] { Dataset(identity_stream(100), o); }, {"--seq-len must be >= 1"});
  o.seq_len = 4;
  o.vocab_size = 50;  // identity ids reach 99
  expect_error([&] { Dataset(identity_stream(100), o); }, {"[tokens] identity", "token id 50", "position 50"});
}

TEST(TextDocuments, PathsSortedFilteredAndHiddenSkipped) {
  TempDir dir;
  const std::string d = dir.file("corpus");
  make_dirs(d + "/a");
  make_dirs(d + "/sub");
  make_dirs(d + "/.git");
  write_bytes(d + "/a/b.txt", "bb");
  write_bytes(d + "/a.md", "A");
  write_bytes(d + "/sub/CMakeLists.txt", "cm");
  write_bytes(d + "/sub/x.py", "p");
  write_bytes(d + "/c.bin", "skip");
  write_bytes(d + "/noext", "skip");
  write_bytes(d + "/.hidden.txt", "skip");
  write_bytes(d + "/.git/config.txt", "skip");
  write_bytes(dir.file("direct.dat"), "D");
  // Sorted by path string: "a.md" < "a/b.txt" since '.' (0x2E) < '/' (0x2F).
  std::vector<std::string> want = {d + "/a.md", d + "/a/b.txt", d + "/sub/CMakeLists.txt", d + "/sub/x.py"};
  EXPECT_EQ(text_document_paths({d}), want);
  // What ramtrain wrote inside the data (an --out there) is not training text:
  // a run with a checkpoint, a checkpoint or an export on its own, a live run.
  make_dirs(d + "/run/ckpt-00000002");
  write_bytes(d + "/run/ckpt-00000002/manifest.json", "{}");
  write_bytes(d + "/run/ckpt-00000002/config.json", "{}");
  write_bytes(d + "/run/notes.txt", "skip");
  make_dirs(d + "/hf");
  write_bytes(d + "/hf/ramtrain.json", "{}");
  write_bytes(d + "/hf/config.json", "{}");
  make_dirs(d + "/live");
  write_bytes(d + "/live/.ramtrain.lock", "pid 1\n");
  write_bytes(d + "/live/log.txt", "skip");
  EXPECT_EQ(text_document_paths({d}), want);

  // A file named directly is read whatever its extension, in argument order.
  TokenStream s = load_text_documents({dir.file("direct.dat"), d});
  EXPECT_EQ(s.vocab_size(), 258u);
  std::vector<int32_t> got(s.size());
  s.read(0, s.size(), got.data());
  const int32_t bos = ByteTokenizer::bos_id, eos = ByteTokenizer::eos_id;
  std::vector<int32_t> ref = {bos, 'D', eos, bos, 'A', eos, bos, 'b', 'b', eos, bos, 'c', 'm', eos, bos, 'p', eos};
  EXPECT_EQ(got, ref);
  // The same directory through data_stream_open, and a token file through it.
  EXPECT_EQ(data_stream_open({d}).size(), ref.size() - 3);
  token_file_write(dir.file("t.tok"), std::vector<int32_t>{1, 2, 3}, 258);
  EXPECT_EQ(data_stream_open({dir.file("t.tok")}).format(), TokenFormat::ramtrain);
  expect_error([&] { data_stream_open({d, dir.file("t.tok")}); }, {"is a token file"});
}

TEST(TextDocuments, Refusals) {
  TempDir dir;
  make_dirs(dir.file("nothing"));
  write_bytes(dir.file("nothing/data.bin"), "xx");
  expect_error([&] { load_text_documents({dir.file("nothing")}); }, {"[data] " + dir.file("nothing"), "no text files"});
  expect_error([&] { load_text_documents({dir.file("missing")}); }, {"no such file or directory"});
  write_bytes(dir.file("e1.txt"), "");
  write_bytes(dir.file("e2.txt"), "");
  expect_error(
      [&] {
        load_text_documents({dir.file("e1.txt"), dir.file("e2.txt")});
      },
      {"empty", "no text to train on"});
  expect_error([&] { load_text_documents({}); }, {"no data paths"});
}

}  // namespace
}  // namespace rt
