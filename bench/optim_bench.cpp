// optim_bench: throughput of adamw_update (with the bf16 shadow), of
// adamw_update_split (the master held as shadow + remainder + tie bit, in place:
// state/split_master.h) and of sum_squares, for every SIMD level this CPU has and
// thread counts 1, 2, 4, ... up to --threads.
// Bytes counted per parameter: adamw 30 (p, m, v read + write, g read: 4 B each;
// bf16 shadow write: 2 B); split 28.25 (shadow read + write 4, remainder read +
// write 4, tie bit read + write 0.25, m, v read + write 16, g read 4); sum_squares
// 4. A standalone command, not a test.
//   optim_bench [--params N] [--threads T] [--reps R]
// Default N: 256M, or less so that the 20.125 B/param of buffers take at most a
// quarter of MemAvailable.
// Last, the roofline: a kernel with AdamW's loads and stores (the same 30 B per
// parameter, the same kinds of stores) and almost no arithmetic, on the same
// pool and blocks. AdamW at that figure is bound by memory, not by its maths.
// --lean: then the lean storages (quantized moments, bf16 masters) through
// update_unit against fp32 AdamW on the same path (bench/optim_lean_bench.cpp);
// --lean-only: those alone.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <immintrin.h>

#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "state/split_master.h"

namespace {

template <class T>
struct AlignedBuf {
  T* d = nullptr;
  explicit AlignedBuf(int64_t n) : d(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {
    if (!d) {
      std::fprintf(stderr, "optim_bench: cannot allocate %lld bytes\n", static_cast<long long>(n * sizeof(T)));
      std::exit(1);
    }
  }
  ~AlignedBuf() { std::free(d); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  T& operator[](int64_t i) { return d[i]; }
  const T& operator[](int64_t i) const { return d[i]; }
  T* data() { return d; }
};

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void usage_exit(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--params N] [--threads T] [--reps R] [--lean | --lean-only] [--lean-modes A,B]\n"
               "       [--lean-simd avx512|avx2|scalar]\n",
               argv0);
  std::exit(2);
}

// p += 1e-9 g, m += g, v += g, shadow = bf16 bits of p (truncated): AdamW's
// traffic without its arithmetic, with the stores adamw_update uses on this CPU
// (streaming for the shadow; for p, m, v as adamw_streams_moments() says).
// AVX2: the roofline needs no wider vectors.
__attribute__((target("avx2,fma"))) void traffic_block(float* p, float* m, float* v, const float* g, uint16_t* sh,
                                                       int64_t n) {
  const bool stream_moments = rt::adamw_streams_moments();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gg = _mm256_load_ps(g + i);
    const __m256 pp = _mm256_fmadd_ps(gg, _mm256_set1_ps(1e-9f), _mm256_load_ps(p + i));
    const __m256 mm = _mm256_add_ps(_mm256_load_ps(m + i), gg), vv = _mm256_add_ps(_mm256_load_ps(v + i), gg);
    if (stream_moments) {
      _mm256_stream_ps(p + i, pp);
      _mm256_stream_ps(m + i, mm);
      _mm256_stream_ps(v + i, vv);
    } else {
      _mm256_store_ps(p + i, pp);
      _mm256_store_ps(m + i, mm);
      _mm256_store_ps(v + i, vv);
    }
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(pp), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(hi, hi), 0x08);
    _mm_stream_si128(reinterpret_cast<__m128i*>(sh + i), _mm256_castsi256_si128(packed));
  }
  _mm_sfence();
  for (; i < n; ++i) {
    p[i] += 1e-9f * g[i];
    m[i] += g[i];
    v[i] += g[i];
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    sh[i] = static_cast<uint16_t>(u >> 16);
  }
}

}  // namespace

int optim_lean_bench(int64_t n_target, int max_threads, int reps, const char* modes);  // optim_lean_bench.cpp

int main(int argc, char** argv) {
  int64_t n = 256ll << 20;
  const int64_t avail = mem_available_bytes();
  if (avail > 0 && n * 21 > avail / 4) n = avail / 4 / 21;
  int max_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (max_threads < 1) max_threads = 1;
  int reps = 5;
  int lean = 0;                 // 1: also the lean storages, 2: only them
  const char* lean_modes = "";  // --lean-modes: a comma-separated subset of the lean bench's mode names
  rt::SimdLevel lean_simd = rt::simd_level_detected();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--lean") || !std::strcmp(argv[i], "--lean-only")) {
      lean = argv[i][6] ? 2 : 1;
      continue;
    }
    if (i + 1 >= argc) usage_exit(argv[0]);
    if (!std::strcmp(argv[i], "--params")) {
      n = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--threads")) {
      max_threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps")) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--lean-modes")) {
      lean_modes = argv[++i];
    } else if (!std::strcmp(argv[i], "--lean-simd")) {  // the lean bench's SIMD level, at most the detected one
      const std::string l = argv[++i];
      const rt::SimdLevel want = l == "avx512" ? rt::SimdLevel::avx512
                                 : l == "avx2" ? rt::SimdLevel::avx2
                                 : l == "scalar" ? rt::SimdLevel::scalar
                                                 : (usage_exit(argv[0]), rt::SimdLevel::scalar);
      lean_simd = std::min(want, rt::simd_level_detected());
    } else {
      usage_exit(argv[0]);
    }
  }
  if (n < 1 || max_threads < 1 || reps < 1) usage_exit(argv[0]);
  // the lean states hold up to 12 B/param (+ gradients 4 and a shadow 2)
  if (lean == 2) rt::set_simd_level(lean_simd);
  if (lean == 2) return optim_lean_bench(avail > 0 ? std::min(n, avail / 4 / 18) : n, max_threads, reps, lean_modes);

  std::printf("optim_bench: %lld params (%.2f GB of buffers), reps %d, detected SIMD %s, p/m/v stores %s\n",
              static_cast<long long>(n), n * 20.125 / 1e9, reps, rt::simd_level_name(rt::simd_level_detected()),
              rt::adamw_streams_moments() ? "streaming" : "plain");
  // 64-byte aligned, as the host arenas are (the shadow then takes non-temporal stores).
  AlignedBuf<float> p(n), m(n), v(n), g(n);
  AlignedBuf<uint16_t> shadow(n), split_shadow(n), split_rem(n);
  AlignedBuf<uint64_t> split_tie(rt::split_master_tie_words(n));
  const rt::SplitMaster split{split_shadow.data(), split_rem.data(), split_tie.data(), 0};
  AlignedBuf<float> split_m(n), split_v(n);
  rt::set_global_threads(max_threads);
  rt::parallel_for(n, rt::kOptimBlock, [&](int64_t b, int64_t e) {  // first touch, spread over threads
    for (int64_t i = b; i < e; ++i) {
      p[i] = 0.01f * static_cast<float>((i * 7919) % 1000 - 500);
      g[i] = 0.001f * static_cast<float>((i * 104729) % 1000 - 500);
      m[i] = v[i] = 0.f;
      shadow[i] = 0;
      split_m[i] = split_v[i] = 0.f;
    }
  });
  rt::split_master_encode(p.data(), n, split);  // first touch of the split buffers, spread over threads

  std::vector<int> thread_counts;
  for (int t = 1; t < max_threads; t *= 2) thread_counts.push_back(t);
  thread_counts.push_back(max_threads);
  std::vector<rt::SimdLevel> levels{rt::SimdLevel::scalar};
  if (rt::simd_level_detected() >= rt::SimdLevel::avx2) levels.push_back(rt::SimdLevel::avx2);
  if (rt::simd_level_detected() >= rt::SimdLevel::avx512) levels.push_back(rt::SimdLevel::avx512);

  std::printf("%-8s %7s  %12s %9s  %12s %9s  %14s %9s\n", "simd", "threads", "adamw Gp/s", "GB/s", "split Gp/s", "GB/s",
              "sumsq Gp/s", "GB/s");
  const rt::AdamWHyper h{};
  int64_t step = 1;
  double checksum = 0;
  for (rt::SimdLevel level : levels) {
    rt::set_simd_level(level);
    for (int threads : thread_counts) {
      rt::set_global_threads(threads);
      // The same steps on both states (same t each): they stay bit-identical (checked at the end).
      rt::adamw_update(p.data(), m.data(), v.data(), g.data(), n, h, step, 1e-4, 0.01, 1.0f, shadow.data());
      rt::adamw_update_split(split, split_m.data(), split_v.data(), g.data(), n, h, step++, 1e-4, 0.01, 1.0f);
      double best_adamw = 1e30, best_split = 1e30, best_ss = 1e30;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        rt::adamw_update(p.data(), m.data(), v.data(), g.data(), n, h, step, 1e-4, 0.01, 1.0f, shadow.data());
        best_adamw = std::min(best_adamw, seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        rt::adamw_update_split(split, split_m.data(), split_v.data(), g.data(), n, h, step++, 1e-4, 0.01, 1.0f);
        best_split = std::min(best_split, seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        checksum += rt::sum_squares(g.data(), n);
        best_ss = std::min(best_ss, seconds_since(t0));
      }
      std::printf("%-8s %7d  %12.3f %9.1f  %12.3f %9.1f  %14.3f %9.1f\n", rt::simd_level_name(level), threads,
                  n / best_adamw / 1e9, 30.0 * n / best_adamw / 1e9, n / best_split / 1e9, 28.25 * n / best_split / 1e9,
                  n / best_ss / 1e9, 4.0 * n / best_ss / 1e9);
      std::fflush(stdout);
    }
  }
  {  // the split state against the fp32 one: every step was the same on both (on this CPU's store paths)
    const int64_t piece = 1 << 20;
    std::vector<float> dec(static_cast<size_t>(std::min(n, piece)));
    bool same = true;
    for (int64_t b = 0; b < n && same; b += piece) {
      const int64_t e = std::min(n, b + piece);
      rt::split_master_decode(split.at(b), e - b, dec.data());
      same = !std::memcmp(dec.data(), p.data() + b, 4 * (e - b)) &&
             !std::memcmp(split_m.data() + b, m.data() + b, 4 * (e - b)) &&
             !std::memcmp(split_v.data() + b, v.data() + b, 4 * (e - b)) &&
             !std::memcmp(split_shadow.data() + b, shadow.data() + b, 2 * (e - b));
    }
    std::printf("split master state bit-identical to the fp32 state after %lld steps: %s\n",
                static_cast<long long>(step - 1), same ? "yes" : "NO (a bug: report it)");
    if (!same) return 1;
  }
  if (rt::simd_level_detected() >= rt::SimdLevel::avx2) {
    rt::set_global_threads(max_threads);
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      rt::parallel_for(n, rt::kOptimBlock, [&](int64_t b, int64_t e) {
        traffic_block(p.data() + b, m.data() + b, v.data() + b, g.data() + b, shadow.data() + b, e - b);
      });
      if (r > 0) best = std::min(best, seconds_since(t0));
    }
    std::printf("%-8s %7d  %12.3f %9.1f  (roofline: AdamW's 30 B/param of loads and stores, no maths)\n", "traffic",
                max_threads, n / best / 1e9, 30.0 * n / best / 1e9);
  }
  std::printf("(best of %d; checksum %.6g, p[0] %.6g, shadow[0] 0x%04x)\n", reps, checksum, p[0], shadow[0]);
  if (lean) rt::set_simd_level(lean_simd);
  if (lean) return optim_lean_bench(avail > 0 ? std::min(n, avail / 4 / 18) : n, max_threads, reps, lean_modes);
  return 0;
}
