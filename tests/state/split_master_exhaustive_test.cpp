// Every one of the 2^32 fp32 bit patterns through the split-master encoding:
// the scalar reference (shadow == f32_to_bf16, rem == low half, decode == input)
// and the bulk functions (same shadow, rem and tie bits; decode == input); then
// every pattern as a master through adamw_update_split against adamw_update at the
// detected SIMD level. Labelled `slow` (tests/CMakeLists.txt): the sanitizer run
// skips it.
// The work is spread over std::threads with the global pool at one thread, so
// each call runs inline on its own thread (the pool is not reentrant).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "state/split_master.h"

namespace rt {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;
constexpr int64_t kChunks = (int64_t{1} << 32) / kChunk;

// Runs fn(first_pattern, worker_state) for every chunk on all cores; returns
// the number of chunks whose fn returned false, and the lowest one in *bad.
template <class State, class Fn>
int64_t for_all_chunks(Fn fn, int64_t* bad) {
  set_global_threads(1);
  std::atomic<int64_t> next{0}, failed{0}, first_bad{-1};
  unsigned n_threads = std::thread::hardware_concurrency();
  if (n_threads < 1) n_threads = 1;
  std::vector<std::thread> th;
  for (unsigned k = 0; k < n_threads; ++k)
    th.emplace_back([&] {
      State st;
      for (int64_t c; (c = next.fetch_add(1)) < kChunks;) {
        if (!fn(static_cast<uint32_t>(c * kChunk), st)) {
          ++failed;
          int64_t seen = first_bad.load();
          while ((seen < 0 || c < seen) && !first_bad.compare_exchange_weak(seen, c)) {
          }
        }
      }
    });
  for (auto& t : th) t.join();
  set_global_threads(0);
  *bad = first_bad.load();
  return failed.load();
}

struct Buffers {
  std::vector<uint32_t> u = std::vector<uint32_t>(kChunk);
  std::vector<float> x = std::vector<float>(kChunk), back = std::vector<float>(kChunk);
  std::vector<uint16_t> shadow = std::vector<uint16_t>(kChunk), rem = std::vector<uint16_t>(kChunk);
  std::vector<uint64_t> tie = std::vector<uint64_t>(kChunk / 64 + 1);
};

TEST(SplitMasterExhaustive, AllPatternsRoundTrip) {
  int64_t bad = -1;
  const int64_t failed = for_all_chunks<Buffers>(
      [](uint32_t base, Buffers& b) {
        for (int64_t i = 0; i < kChunk; ++i) b.u[i] = base + static_cast<uint32_t>(i);
        std::memcpy(b.x.data(), b.u.data(), 4 * kChunk);
        // tie_first 0 or, in every other chunk, 37: the partial tie words at the ends too
        const int64_t first = (base / kChunk) % 2 ? 37 : 0;
        const SplitMaster p{b.shadow.data(), b.rem.data(), b.tie.data(), first};
        split_master_encode(b.x.data(), kChunk, p);
        // branch-free, so the compiler vectorises the check
        uint32_t wrong = 0;
        for (int64_t i = 0; i < kChunk; ++i) {
          uint16_t r;
          bool t;
          const uint16_t s = split_master_encode_one(b.x[i], &r, &t);
          const float y = split_master_decode_one(s, r, t);
          uint32_t yb;
          std::memcpy(&yb, &y, 4);
          const bool t_bulk = ((b.tie[(first + i) / 64] >> ((first + i) % 64)) & 1u) != 0;
          wrong |= (s != f32_to_bf16(b.x[i])) | (r != (b.u[i] & 0xffffu)) | (yb != b.u[i]) | (b.shadow[i] != s) |
                   (b.rem[i] != r) | (t_bulk != t);
        }
        const bool ok = wrong == 0;
        split_master_decode(p, kChunk, b.back.data());
        return ok && std::memcmp(b.back.data(), b.u.data(), 4 * kChunk) == 0;
      },
      &bad);
  EXPECT_EQ(failed, 0) << "lowest failing chunk starts at pattern 0x" << std::hex << bad * kChunk;
}

struct UpdateBuffers : Buffers {
  std::vector<float> m0 = std::vector<float>(kChunk), v0 = m0, g = m0, m = m0, v = m0, m2 = m0, v2 = m0;
  std::vector<uint16_t> shadow_ref = std::vector<uint16_t>(kChunk);
  UpdateBuffers() {
    for (int64_t i = 0; i < kChunk; ++i) {
      const float f = static_cast<float>((i * 7919) % 2001 - 1000);
      g[i] = 1e-3f * f;
      m0[i] = 1e-4f * f;
      v0[i] = 1e-6f * static_cast<float>((i * 104729) % 1000);
    }
  }
};

// Every pattern as a master (NaNs, infinities, denormals, ties included), one step
// with weight decay and a clip coefficient; m, v, g vary with the element.
TEST(SplitMasterExhaustive, AllPatternsUpdateLikeTheFp32Path) {
  int64_t bad = -1;
  const int64_t failed = for_all_chunks<UpdateBuffers>(
      [](uint32_t base, UpdateBuffers& b) {
        for (int64_t i = 0; i < kChunk; ++i) b.u[i] = base + static_cast<uint32_t>(i);
        b.m = b.m2 = b.m0;
        b.v = b.v2 = b.v0;
        std::memcpy(b.x.data(), b.u.data(), 4 * kChunk);
        const SplitMaster p{b.shadow.data(), b.rem.data(), b.tie.data(), 0};
        split_master_encode(b.x.data(), kChunk, p);
        const AdamWHyper h{};
        adamw_update(b.x.data(), b.m.data(), b.v.data(), b.g.data(), kChunk, h, 3, 1e-3, 0.1, 0.5f,
                     b.shadow_ref.data());
        adamw_update_split(p, b.m2.data(), b.v2.data(), b.g.data(), kChunk, h, 3, 1e-3, 0.1, 0.5f);
        split_master_decode(p, kChunk, b.back.data());
        return std::memcmp(b.back.data(), b.x.data(), 4 * kChunk) == 0 && b.shadow == b.shadow_ref &&
               std::memcmp(b.m.data(), b.m2.data(), 4 * kChunk) == 0 &&
               std::memcmp(b.v.data(), b.v2.data(), 4 * kChunk) == 0;
      },
      &bad);
  EXPECT_EQ(failed, 0) << "lowest failing chunk starts at pattern 0x" << std::hex << bad * kChunk << " ("
                       << simd_level_name(simd_level_active()) << ")";
}

}  // namespace
}  // namespace rt
