// Tests for state/split_master and adamw_update_split: targeted edge cases of the
// encoding (ties of both parities, NaNs, infinities, denormals, signed zeros),
// bulk encode/decode against the scalar reference at every tie-word alignment,
// concurrent chunks cutting one tie word, and the split AdamW update bit-identical
// to adamw_update (the fp32 path) over many steps, every SIMD level, sub-ranges,
// the delayed-update shadow pair and bad arguments. All 2^32 patterns:
// split_master_exhaustive_test.cpp.
#include "state/split_master.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/muon.h"
#include "testutil.h"

namespace rt {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct OptimEnvGuard {
  ~OptimEnvGuard() {
    set_simd_level(simd_level_detected());
    set_global_threads(0);
  }
};

std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> out{SimdLevel::scalar};
  if (simd_level_detected() >= SimdLevel::avx2) out.push_back(SimdLevel::avx2);
  if (simd_level_detected() >= SimdLevel::avx512) out.push_back(SimdLevel::avx512);
  return out;
}

// Patterns at the edges of the encoding: both tie parities (normal, denormal, at the
// overflow to inf), carries across an exponent, +-0, denormals, +-inf, signalling and
// quiet NaNs with payloads in either half, and their negatives.
std::vector<uint32_t> edge_patterns() {
  const std::vector<uint32_t> base{0x00000000, 0x00000001, 0x00007fff, 0x00008000, 0x00008001, 0x00018000, 0x0000ffff,
                                   0x007fffff, 0x007f8000, 0x00800000, 0x3f7f7fff, 0x3f7f8000, 0x3f7f8001, 0x3f7fffff,
                                   0x3f800000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff,
                                   0x7f7e8000, 0x7f800000, 0x7f800001, 0x7f808000, 0x7fbfffff, 0x7fc00000, 0x7fc00001,
                                   0x7fffffff, 0x7fbf0000, 0x7f810000, 0x7f8f8000};
  std::vector<uint32_t> out;
  for (uint32_t u : base) {
    out.push_back(u);
    out.push_back(u | 0x80000000u);
  }
  return out;
}

// A tie bitmap of `words` words filled with random bits (so tests see whether
// bits outside a range survive).
std::vector<uint64_t> random_words(int64_t words, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<uint64_t> w(static_cast<size_t>(words));
  for (auto& x : w) x = r();
  return w;
}

std::vector<uint32_t> random_patterns(int64_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<uint32_t> u(static_cast<size_t>(n));
  const std::vector<uint32_t> edges = edge_patterns();
  for (auto& x : u) {
    x = static_cast<uint32_t>(r());
    if (r() % 4 == 0) x = (x & 0xffff0000u) | 0x8000u;  // a tie
    if (r() % 16 == 0) x = edges[r() % edges.size()];
  }
  return u;
}

bool tie_bit(const std::vector<uint64_t>& w, int64_t k) { return (w[k / 64] >> (k % 64)) & 1u; }

// ---------------------------------------------------------------- the encoding

TEST(SplitMaster, EdgePatternsRoundTripAndShadowIsBf16) {
  for (uint32_t u : edge_patterns()) {
    uint16_t rem = 0;
    bool tie = false;
    const uint16_t s = split_master_encode_one(float_of(u), &rem, &tie);
    EXPECT_EQ(s, f32_to_bf16(float_of(u))) << std::hex << u;
    EXPECT_EQ(rem, u & 0xffffu) << std::hex << u;
    EXPECT_EQ(bits_of(split_master_decode_one(s, rem, tie)), u) << std::hex << u;
  }
}

// The catch the extra bit exists for: two masters with the same shadow and the same
// low half. Fails if tie is not stored or is derived from rem alone.
TEST(SplitMaster, TiesOfBothParitiesDifferOnlyInTheTieBit) {
  const std::vector<std::pair<uint32_t, uint32_t>> pairs{
      {0x3f7f8000, 0x3f808000},  // hi odd, rounds up to 0x3f80 | hi even, rounds down to it
      {0x00018000, 0x00028000},  // denormals
      {0xbf7f8000, 0xbf808000},  // negative
      {0x7f800001, 0x7fc00001},  // signalling and quiet NaN: both shadow 0x7fc0
  };
  for (auto [a, b] : pairs) {
    uint16_t ra, rb;
    bool ta, tb;
    const uint16_t sa = split_master_encode_one(float_of(a), &ra, &ta);
    const uint16_t sb = split_master_encode_one(float_of(b), &rb, &tb);
    EXPECT_EQ(sa, sb) << std::hex << a << " " << b;
    EXPECT_EQ(ra, rb) << std::hex << a << " " << b;
    EXPECT_NE(ta, tb) << std::hex << a << " " << b;
    EXPECT_EQ(bits_of(split_master_decode_one(sa, ra, ta)), a);
    EXPECT_EQ(bits_of(split_master_decode_one(sb, rb, tb)), b);
  }
}

// Bulk functions against the scalar reference, at every alignment of the span in
// its tie words and at lengths around a word; tie bits outside the span unchanged.
TEST(SplitMaster, BulkMatchesScalarAtEveryAlignment) {
  for (int64_t first : {0, 1, 17, 63, 64, 65, 127, 16384 - 5}) {
    for (int64_t n : {1, 2, 47, 63, 64, 65, 128, 129, 1000, 16384 + 200}) {
      const std::vector<uint32_t> u = random_patterns(n, 1000 * first + n);
      const int64_t words = split_master_tie_words(first + n) + 1;
      std::vector<uint64_t> tie = random_words(words, 7 + n);
      const std::vector<uint64_t> tie0 = tie;
      std::vector<uint16_t> shadow(n), rem(n);
      const SplitMaster p{shadow.data(), rem.data(), tie.data(), first};
      std::vector<float> x(n), back(n);
      std::memcpy(x.data(), u.data(), 4 * n);
      split_master_encode(x.data(), n, p);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t r;
        bool t;
        const uint16_t s = split_master_encode_one(x[i], &r, &t);
        ASSERT_EQ(shadow[i], s) << "first " << first << " n " << n << " i " << i;
        ASSERT_EQ(rem[i], r) << "first " << first << " n " << n << " i " << i;
        ASSERT_EQ(tie_bit(tie, first + i), t) << "first " << first << " n " << n << " i " << i;
      }
      for (int64_t k = 0; k < words * 64; ++k)
        if (k < first || k >= first + n) {
          ASSERT_EQ(tie_bit(tie, k), tie_bit(tie0, k)) << "bit " << k;
        }
      split_master_decode(p, n, back.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(back[i]), u[i]) << "first " << first << " n " << n;
    }
  }
}

// Two threads encode interleaved chunks of 1..8 elements in lockstep (each chunk
// within one kSplitBlock, so every call runs inline on its thread), starting from
// tie words holding the complement of the answer: a lost update on a shared word
// leaves a wrong bit. Repeated, as races need luck to show.
TEST(SplitMaster, ConcurrentChunksCuttingTieWords) {
  OptimEnvGuard guard;
  set_global_threads(1);
  const int64_t n = 16000, first = 13;
  const std::vector<uint32_t> u = random_patterns(n, 99);
  std::vector<float> x(n);
  std::memcpy(x.data(), u.data(), 4 * n);
  std::vector<uint16_t> s_ref(n), r_ref(n), s(n), r(n);
  std::vector<uint64_t> t_ref(split_master_tie_words(first + n)), t(t_ref.size());
  split_master_encode(x.data(), n, SplitMaster{s_ref.data(), r_ref.data(), t_ref.data(), first});
  std::vector<int64_t> cuts{0};
  std::mt19937_64 rng(5);
  while (cuts.back() < n) cuts.push_back(std::min<int64_t>(n, cuts.back() + 1 + rng() % 8));
  for (int rep = 0; rep < 100; ++rep) {
    for (size_t k = 0; k < t.size(); ++k) t[k] = ~t_ref[k];
    const SplitMaster p{s.data(), r.data(), t.data(), first};
    std::atomic<int> ready{0};
    std::vector<std::thread> th;
    for (int k = 0; k < 2; ++k)
      th.emplace_back([&, k] {
        ++ready;
        while (ready.load() < 2) {
        }
        for (size_t c = k; c + 1 < cuts.size(); c += 2)
          split_master_encode(x.data() + cuts[c], cuts[c + 1] - cuts[c], p.at(cuts[c]));
      });
    for (auto& h : th) h.join();
    ASSERT_EQ(s, s_ref);
    ASSERT_EQ(r, r_ref);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(tie_bit(t, first + i), tie_bit(t_ref, first + i)) << rep << " " << i;
  }
}

// Muon's pipelined update of a split master (optim/muon_unit.cpp
// matrix_finish) decodes, applies the bf16 O and encodes back in one pass
// (muon_apply_bf16_split): the bits of split_master_decode, muon_apply_bf16,
// split_master_encode, on every SIMD path and thread count, for ranges that
// start and end inside tie words (the bits outside the range survive), over
// the encoding's edge patterns (ties, NaN, inf, denormals) in both the master
// and O, with and without weight decay.
TEST(SplitMaster, MuonApplyInOnePassIsDecodeApplyEncode) {
  OptimEnvGuard guard;
  const double lr = 0.37;  // large, so the step moves the values visibly
  for (int threads : {1, 3}) {
    set_global_threads(threads);
    for (SimdLevel level : supported_levels()) {
      set_simd_level(level);
      for (int64_t first : {0, 13, 64, 100})
        for (int64_t n : {1, 50, 64, 200, 40000})
          for (double wd : {0.0, 0.1}) {
            const std::vector<uint32_t> u = random_patterns(n, 7 * first + n);
            const std::vector<uint32_t> ou = random_patterns(n, 11 * first + n + 1);
            std::vector<float> x(n);
            std::memcpy(x.data(), u.data(), 4 * n);
            std::vector<uint16_t> o(n);
            for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint16_t>(ou[i] >> 16);
            const int64_t words = split_master_tie_words(first + n) + 1;
            std::vector<uint16_t> s_ref(n), r_ref(n), s(n), r(n);
            std::vector<uint64_t> t_ref = random_words(words, 3 + n), t = t_ref;
            const SplitMaster pr{s_ref.data(), r_ref.data(), t_ref.data(), first},
                p{s.data(), r.data(), t.data(), first};
            split_master_encode(x.data(), n, pr);
            split_master_encode(x.data(), n, p);
            std::vector<float> w(n);
            split_master_decode(pr, n, w.data());
            muon_apply_bf16(w.data(), o.data(), n, 4, 5, lr, wd, nullptr);
            split_master_encode(w.data(), n, pr);
            muon_apply_bf16_split(p, o.data(), n, 4, 5, lr, wd);
            const std::string at = std::string("level ") + simd_level_name(level) + " threads " +
                                   std::to_string(threads) + " first " + std::to_string(first) + " n " +
                                   std::to_string(n) + " wd " + std::to_string(wd);
            ASSERT_EQ(s, s_ref) << at;
            ASSERT_EQ(r, r_ref) << at;
            ASSERT_EQ(t, t_ref) << at;
            int64_t changed = 0;
            for (int64_t i = 0; i < n; ++i) changed += bits_of(w[i]) != u[i];
            if (n >= 64) ASSERT_GT(changed, 0) << "the update changed nothing: " << at;
          }
    }
  }
}

TEST(SplitMaster, RejectsBadArguments) {
  std::vector<uint16_t> s(8), r(8);
  std::vector<uint64_t> t(1);
  std::vector<float> x(8);
  EXPECT_THROW(split_master_encode(x.data(), -1, SplitMaster{s.data(), r.data(), t.data(), 0}), Error);
  EXPECT_THROW(split_master_encode(x.data(), 8, SplitMaster{s.data(), nullptr, t.data(), 0}), Error);
  EXPECT_THROW(split_master_decode(SplitMaster{s.data(), r.data(), t.data(), -3}, 8, x.data()), Error);
  EXPECT_NO_THROW(split_master_decode(SplitMaster{}, 0, nullptr));
}

// ---------------------------------------------------------------- split AdamW

// The fp32 path (p, m, v, shadow) and the split path (shadow, rem, tie, m, v) side
// by side over the same elements.
struct Twin {
  std::vector<float> p, m, v, m2, v2;
  std::vector<uint16_t> shadow_ref, shadow, shadow_other, rem;
  std::vector<uint64_t> tie;
  int64_t first = 0;
  SplitMaster split() { return {shadow.data(), rem.data(), tie.data(), first}; }
};

Twin make_twin(int64_t n, int64_t first, uint64_t seed) {
  Twin w;
  w.first = first;
  w.p = test::random_vec(n, seed, -1.f, 1.f);
  std::mt19937_64 r(seed + 9);
  const std::vector<uint32_t> edges = edge_patterns();
  for (auto& x : w.p) {  // ties of both parities, and now and then an edge pattern
    if (r() % 3 == 0) x = float_of((bits_of(x) & 0xffff0000u) | 0x8000u);
    if (r() % 64 == 0) x = float_of(edges[r() % edges.size()]);
  }
  w.m = test::random_vec(n, seed + 1, -0.1f, 0.1f);
  w.v = test::random_vec(n, seed + 2, 0.f, 0.01f);
  w.m2 = w.m;
  w.v2 = w.v;
  w.shadow_ref.assign(n, 0);
  w.shadow.assign(n, 0);
  w.shadow_other.assign(n, 0);
  w.rem.assign(n, 0);
  w.tie = random_words(split_master_tie_words(first + n), seed + 3);
  split_master_encode(w.p.data(), n, w.split());
  return w;
}

::testing::AssertionResult twin_equal(Twin& w, const std::string& where) {
  const int64_t n = static_cast<int64_t>(w.p.size());
  std::vector<float> dec(n);
  split_master_decode(w.split(), n, dec.data());
  for (int64_t i = 0; i < n; ++i) {
    if (bits_of(dec[i]) != bits_of(w.p[i]))
      return ::testing::AssertionFailure()
             << where << ": master [" << i << "] 0x" << std::hex << bits_of(dec[i]) << " vs fp32 0x" << bits_of(w.p[i]);
    if (w.shadow[i] != w.shadow_ref[i])
      return ::testing::AssertionFailure()
             << where << ": shadow [" << i << "] 0x" << std::hex << w.shadow[i] << " vs 0x" << w.shadow_ref[i];
    if (bits_of(w.m[i]) != bits_of(w.m2[i]) || bits_of(w.v[i]) != bits_of(w.v2[i]))
      return ::testing::AssertionFailure() << where << ": m or v [" << i << "] differ";
  }
  return ::testing::AssertionSuccess();
}

// Many steps, random gradients each step, weight decay, a clipping coefficient and
// bias correction (t = 1..), sizes around the vector widths and a tie word, spans
// starting anywhere in a word, every SIMD level; lengths >= 4096 take the
// streaming stores on aligned buffers.
TEST(AdamWSplit, BitIdenticalToFp32PathOverManySteps) {
  OptimEnvGuard guard;
  const AdamWHyper h{};
  for (SimdLevel level : supported_levels()) {
    set_simd_level(level);
    for (int64_t first : {0, 16, 48, 63}) {
      for (int64_t n : {1, 7, 15, 17, 63, 64, 65, 200, 4096 + 37, 2 * 16384 + 129}) {
        Twin w = make_twin(n, first, 31 * n + first);
        for (int64_t t = 1; t <= 12; ++t) {
          const std::vector<float> g = test::random_vec(n, 1000 + t, -2.f, 2.f);
          const double lr = 1e-3 * (1 + t % 3), wd = t % 4 == 0 ? 0.0 : 0.1;
          const float clip = t % 2 ? 1.0f : 0.37f;
          adamw_update(w.p.data(), w.m.data(), w.v.data(), g.data(), n, h, t, lr, wd, clip, w.shadow_ref.data());
          adamw_update_split(w.split(), w.m2.data(), w.v2.data(), g.data(), n, h, t, lr, wd, clip);
          ASSERT_TRUE(twin_equal(w, std::string(simd_level_name(level)) + " first " + std::to_string(first) + " n " +
                                        std::to_string(n) + " t " + std::to_string(t)));
        }
      }
    }
  }
}

// lr = 0, wd = 0: the master must stay put, so masters that are exact ties stay
// ties step after step; the tie bit is read and written every step.
TEST(AdamWSplit, TieMastersSurviveZeroLearningRate) {
  OptimEnvGuard guard;
  const int64_t n = 1000;
  for (SimdLevel level : supported_levels()) {
    set_simd_level(level);
    Twin w = make_twin(n, 5, 77);
    for (auto& x : w.p) x = float_of((bits_of(x) & 0x7fff0000u) % 0x7f000000u | 0x8000u);  // finite ties
    split_master_encode(w.p.data(), n, w.split());
    const std::vector<float> p0 = w.p;
    const std::vector<float> g = test::random_vec(n, 3, -1.f, 1.f);
    for (int64_t t = 1; t <= 3; ++t) {
      adamw_update(w.p.data(), w.m.data(), w.v.data(), g.data(), n, AdamWHyper{}, t, 0.0, 0.0, 1.0f,
                   w.shadow_ref.data());
      adamw_update_split(w.split(), w.m2.data(), w.v2.data(), g.data(), n, AdamWHyper{}, t, 0.0, 0.0, 1.0f);
      ASSERT_TRUE(twin_equal(w, simd_level_name(level)));
    }
    ASSERT_EQ(0, std::memcmp(p0.data(), w.p.data(), 4 * n));
  }
}

// The engine's pattern: a unit updated chunk by chunk, [b, e) at random, per
// tensor range; every chunk a span at(b) of the unit. Chunks run serially here
// (each internally on the pool, 3 threads) and then concurrently from threads.
TEST(AdamWSplit, ChunksOfAUnitMatchTheWholeUpdate) {
  OptimEnvGuard guard;
  const int64_t n = 3 * 16384 + 777;
  std::mt19937_64 rng(11);
  for (SimdLevel level : supported_levels()) {
    set_simd_level(level);
    for (int concurrent = 0; concurrent < 2; ++concurrent) {
      set_global_threads(concurrent ? 1 : 3);
      Twin w = make_twin(n, 0, 5 + concurrent);
      for (int64_t t = 1; t <= 4; ++t) {
        const std::vector<float> g = test::random_vec(n, 50 + t, -1.f, 1.f);
        adamw_update(w.p.data(), w.m.data(), w.v.data(), g.data(), n, AdamWHyper{}, t, 1e-3, 0.01, 0.9f,
                     w.shadow_ref.data());
        // concurrent: chunk ends stay inside one kSplitBlock so each call runs inline
        std::vector<int64_t> cuts{0};
        while (cuts.back() < n) {
          int64_t e = std::min<int64_t>(n, cuts.back() + 1 + static_cast<int64_t>(rng() % 3000));
          if (concurrent && e / kSplitBlock != cuts.back() / kSplitBlock)
            e = std::min(n, e / kSplitBlock * kSplitBlock);
          cuts.push_back(e);
        }
        auto run_chunk = [&](size_t c) {
          const int64_t b = cuts[c], e = cuts[c + 1];
          adamw_update_split(w.split().at(b), w.m2.data() + b, w.v2.data() + b, g.data() + b, e - b, AdamWHyper{}, t,
                             1e-3, 0.01, 0.9f);
        };
        if (!concurrent) {
          for (size_t c = 0; c + 1 < cuts.size(); ++c) run_chunk(c);
        } else {
          std::vector<std::thread> th;
          for (size_t k = 0; k < 4; ++k)
            th.emplace_back([&, k] {
              for (size_t c = k; c + 1 < cuts.size(); c += 4) run_chunk(c);
            });
          for (auto& x : th) x.join();
        }
        ASSERT_TRUE(twin_equal(w, std::string(simd_level_name(level)) + (concurrent ? " concurrent" : " serial") +
                                      " t " + std::to_string(t)));
      }
    }
  }
}

// Delayed update: step t reads the master's upper half from the shadow of step
// t - 1 and writes the other shadow; rem and tie are updated in place.
TEST(AdamWSplit, DelayedShadowPair) {
  OptimEnvGuard guard;
  const int64_t n = 4096 + 300;
  for (SimdLevel level : supported_levels()) {
    set_simd_level(level);
    Twin w = make_twin(n, 32, 8);
    std::vector<uint16_t> sh[2] = {w.shadow, w.shadow};  // sh[0] holds the master after "step 0"
    for (int64_t t = 1; t <= 6; ++t) {
      const std::vector<float> g = test::random_vec(n, 70 + t, -1.f, 1.f);
      adamw_update(w.p.data(), w.m.data(), w.v.data(), g.data(), n, AdamWHyper{}, t, 1e-3, 0.1, 1.0f,
                   w.shadow_ref.data());
      SplitMaster p = w.split();
      p.shadow = sh[t % 2].data();
      std::fill(sh[t % 2].begin(), sh[t % 2].end(), uint16_t{0xdead});  // stale contents must not matter
      adamw_update_split(p, w.m2.data(), w.v2.data(), g.data(), n, AdamWHyper{}, t, 1e-3, 0.1, 1.0f,
                         sh[(t + 1) % 2].data());
      w.shadow = sh[t % 2];
      ASSERT_TRUE(twin_equal(w, std::string(simd_level_name(level)) + " t " + std::to_string(t)));
    }
  }
}

// 64-byte aligned buffers, as the host arenas and pinned shadows are: the
// streaming stores are taken (the shadow always; rem, m, v on Intel CPUs) and give
// the same bits. A span starting mid-word streams from its first whole word.
TEST(AdamWSplit, AlignedBuffersTakeStreamingStoresWithTheSameBits) {
  OptimEnvGuard guard;
  const int64_t n = 2 * 16384 + 100;
  auto alloc = [](size_t bytes) {
    return std::unique_ptr<void, decltype(&std::free)>(std::aligned_alloc(64, (bytes + 63) / 64 * 64), &std::free);
  };
  for (SimdLevel level : supported_levels()) {
    set_simd_level(level);
    for (int64_t first : {0, 16, 1024}) {
      const bool delayed = first == 1024;  // two shadows: the written one is only written, so it streams
      Twin w = make_twin(n, first, 21);
      auto sh = alloc(2 * n), sh2 = alloc(2 * n), rm = alloc(2 * n), mm = alloc(4 * n), vv = alloc(4 * n);
      uint16_t* s = static_cast<uint16_t*>(sh.get());
      uint16_t* s_other = static_cast<uint16_t*>(sh2.get());
      auto* r = static_cast<uint16_t*>(rm.get());
      auto* m = static_cast<float*>(mm.get());
      auto* v = static_cast<float*>(vv.get());
      std::memcpy(m, w.m2.data(), 4 * n);
      std::memcpy(v, w.v2.data(), 4 * n);
      split_master_encode(w.p.data(), n, SplitMaster{s, r, w.tie.data(), first});
      for (int64_t t = 1; t <= 3; ++t) {
        const std::vector<float> g = test::random_vec(n, 90 + t, -1.f, 1.f);
        adamw_update(w.p.data(), w.m.data(), w.v.data(), g.data(), n, AdamWHyper{}, t, 1e-3, 0.1, 1.0f,
                     w.shadow_ref.data());
        if (delayed) std::swap(s, s_other);  // write the other shadow, read the last one
        adamw_update_split(SplitMaster{s, r, w.tie.data(), first}, m, v, g.data(), n, AdamWHyper{}, t, 1e-3, 0.1, 1.0f,
                           delayed ? s_other : nullptr);
      }
      std::memcpy(w.shadow.data(), s, 2 * n);
      std::memcpy(w.rem.data(), r, 2 * n);
      std::memcpy(w.m2.data(), m, 4 * n);
      std::memcpy(w.v2.data(), v, 4 * n);
      ASSERT_TRUE(twin_equal(w, std::string(simd_level_name(level)) + " first " + std::to_string(first)));
    }
  }
}

TEST(AdamWSplit, RejectsBadArguments) {
  Twin w = make_twin(8, 0, 1);
  std::vector<float> g(8);
  const AdamWHyper h{};
  EXPECT_THROW(adamw_update_split(w.split(), w.m2.data(), w.v2.data(), g.data(), 8, h, 0, 1e-3, 0, 1), Error);
  EXPECT_THROW(adamw_update_split(w.split(), w.m2.data(), w.v2.data(), g.data(), -1, h, 1, 1e-3, 0, 1), Error);
  EXPECT_THROW(adamw_update_split(w.split(), nullptr, w.v2.data(), g.data(), 8, h, 1, 1e-3, 0, 1), Error);
  SplitMaster bad = w.split();
  bad.tie = nullptr;
  EXPECT_THROW(adamw_update_split(bad, w.m2.data(), w.v2.data(), g.data(), 8, h, 1, 1e-3, 0, 1), Error);
  bad = w.split();
  bad.tie_first = -1;
  EXPECT_THROW(adamw_update_split(bad, w.m2.data(), w.v2.data(), g.data(), 8, h, 1, 1e-3, 0, 1), Error);
  EXPECT_THROW(adamw_update_split(w.split(), w.m2.data(), w.v2.data(), g.data(), 8, h, 1, -1e-3, 0, 1), Error);
}

}  // namespace
}  // namespace rt
