// Block memory sizing (model/block_memory.h) against what the BlockActs and
// BlockScratch constructors actually allocate (an ops type that counts bytes
// instead of allocating), and the planner's chunk choice against those sizes.
#include <gtest/gtest.h>

#include "cpu/cpu_ops.h"
#include "model/block_memory.h"
#include "model/spec.h"

namespace {

// Counts the bytes of every alloc (rounded up to align) and allocates nothing.
template <class E>
struct CountOps {
  using act_t = E;
  using weight_t = E;
  template <class T>
  struct Buffer {
    T* data() const { return nullptr; }
  };
  uint64_t align = 1, bytes = 0;
  int64_t calls = 0;
  template <class T>
  Buffer<T> alloc(int64_t n) {
    bytes += (static_cast<uint64_t>(n) * sizeof(T) + align - 1) / align * align;
    ++calls;
    return {};
  }
};

template <class E>
std::pair<uint64_t, uint64_t> allocated(const rt::ModelSpec& s, const rt::BlockDims& dm, uint64_t align) {
  CountOps<E> a{align}, b{align};
  rt::BlockActs<CountOps<E>> t(a, s, dm);
  rt::BlockScratch<CountOps<E>> d(b, s, dm);
  // every buffer once (15 activations incl. OLMo2's mlp_out and Gemma's attn_out; 9 statistics incl.
  // Gemma's rstd_pa, rstd_pm)
  EXPECT_EQ(a.calls, 24);
  EXPECT_EQ(b.calls, 13);
  return {a.bytes, b.bytes};
}

std::vector<rt::ModelSpec> specs() {
  std::vector<rt::ModelSpec> v{rt::spec_preset("qwen2.5-7b"), rt::spec_preset("qwen3-8b"),
                               rt::spec_preset("tiny-byte")};
  return v;
}

TEST(BlockMemory, SizesAreWhatTheConstructorsAllocate) {
  for (const rt::ModelSpec& s : specs())
    for (const rt::BlockDims dm : {rt::BlockDims{1, 16384}, rt::BlockDims{1, 32768, 1024}, rt::BlockDims{3, 100, 7},
                                   rt::BlockDims{2, 64, 500}, rt::BlockDims{1, 1, 1}})
      for (uint64_t align : {uint64_t{1}, uint64_t{256}}) {
        const std::string tag = s.architecture + " " + std::to_string(dm.B) + "x" + std::to_string(dm.T) + " chunk " +
                                std::to_string(dm.mlp_chunk_tokens) + " align " + std::to_string(align);
        const auto [a2, d2] = allocated<uint16_t>(s, dm, align);
        EXPECT_EQ(rt::block_acts_bytes(s, dm, 2, align), a2) << tag;
        EXPECT_EQ(rt::block_scratch_bytes(s, dm, 2, align), d2) << tag;
        const auto [a4, d4] = allocated<float>(s, dm, align);
        EXPECT_EQ(rt::block_acts_bytes(s, dm, 4, align), a4) << tag;
        EXPECT_EQ(rt::block_scratch_bytes(s, dm, 4, align), d4) << tag;
        if (align == 1) {
          EXPECT_EQ(rt::BlockActs<rt::CpuOps>::bytes(s, dm), a4) << tag;
          EXPECT_EQ(rt::BlockScratch<rt::CpuOps>::bytes(s, dm), d4) << tag;
        }
      }
}

TEST(BlockMemory, ChunkingShrinksOnlyTheMlpTensors) {
  // Per MLP buffer (g, u, a; d_a, d_g, d_u) the chunk saves (N - R) * F
  // elements; nothing else changes.
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  const int64_t N = 16384, R = 1024, F = s.intermediate;
  const uint64_t saved = 3ull * static_cast<uint64_t>((N - R) * F) * 2;
  EXPECT_EQ(rt::block_acts_bytes(s, {1, N}, 2) - rt::block_acts_bytes(s, {1, N, R}, 2), saved);
  EXPECT_EQ(rt::block_scratch_bytes(s, {1, N}, 2) - rt::block_scratch_bytes(s, {1, N, R}, 2), saved);
  EXPECT_EQ(rt::block_acts_bytes(s, {1, N, N}, 2), rt::block_acts_bytes(s, {1, N}, 2));
  EXPECT_EQ(rt::block_acts_bytes(s, {1, N, 4 * N}, 2), rt::block_acts_bytes(s, {1, N}, 2));
}

TEST(BlockMemory, ChunkCandidatesArePowersOfTwoBelowN) {
  EXPECT_EQ(rt::mlp_chunk_candidates(16384), (std::vector<int64_t>{8192, 4096, 2048, 1024, 512, 256}));
  EXPECT_EQ(rt::mlp_chunk_candidates(1000), (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(rt::mlp_chunk_candidates(257), (std::vector<int64_t>{256}));
  EXPECT_TRUE(rt::mlp_chunk_candidates(256).empty());
  EXPECT_TRUE(rt::mlp_chunk_candidates(1).empty());
}

TEST(BlockMemory, PickUsesNoChunkWhenTheBlockFitsElseTheLargestThatFits) {
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  const int64_t T = 16384;
  for (int64_t sets : {int64_t{1}, int64_t{3}}) {
    auto need = [&](int64_t chunk) {
      const rt::BlockDims dm{1, T, chunk};
      return static_cast<uint64_t>(sets) * rt::block_acts_bytes(s, dm, 2, 256) + rt::block_scratch_bytes(s, dm, 2, 256);
    };
    EXPECT_EQ(rt::pick_mlp_chunk_tokens(s, 1, T, 2, need(0), sets, 256), 0);
    EXPECT_EQ(rt::pick_mlp_chunk_tokens(s, 1, T, 2, 1ull << 40, sets, 256), 0);
    const std::vector<int64_t> cand = rt::mlp_chunk_candidates(T);
    uint64_t prev = need(0);
    for (size_t i = 0; i < cand.size(); ++i) {
      ASSERT_LT(need(cand[i]), prev);  // smaller chunks need less
      prev = need(cand[i]);
      EXPECT_EQ(rt::pick_mlp_chunk_tokens(s, 1, T, 2, need(cand[i]), sets, 256), cand[i]);
      // one byte short of a chunk's need: the next smaller one (or nothing)
      EXPECT_EQ(rt::pick_mlp_chunk_tokens(s, 1, T, 2, need(cand[i]) - 1, sets, 256),
                i + 1 < cand.size() ? cand[i + 1] : -1);
    }
    EXPECT_EQ(rt::pick_mlp_chunk_tokens(s, 1, T, 2, need(0) - 1, sets, 256), cand[0]);
  }
}

TEST(BlockMemory, BadArgumentsAreRefused) {
  const rt::ModelSpec s = rt::spec_preset("tiny-byte");
  EXPECT_THROW(rt::block_acts_bytes(s, {1, 8}, 3), rt::Error);
  EXPECT_THROW(rt::block_scratch_bytes(s, {1, 8, -2}, 2), rt::Error);
  EXPECT_THROW(rt::block_acts_bytes(s, {0, 8}, 2), rt::Error);
  EXPECT_THROW(rt::pick_mlp_chunk_tokens(s, 1, 8, 2, 1000, 0), rt::Error);
}

}  // namespace
