// The lean part of optim_bench (optim_bench --lean): update_unit over a whole
// HostState (a synthetic Llama of ~N params, the real unit layout), with the
// bf16 shadow written as the CUDA engine asks, per storage mode and thread
// count, in Gparam/s and against fp32 AdamW through the same path.
// Bytes per parameter moved by one update (g read 4, shadow written 2):
//   adamw (fp32 master, fp32 m v)   30      adamw8bit (fp32 master)  18.06
//   adamw4bit (fp32 master)          16.06  adamw8bit + bf16-sr       12.06
//   bf16-kahan + fp32 moments        28     adamw4bit + bf16-kahan    14.06
//   adamw8bit + split master         14.31  adamw4bit + bf16-sr       10.06
// (master read + write 8 fp32, 4 bf16 or bf16 + compensation 8, split 8.25;
// codes 2 or 1 per moment pair each way; scales 2 x 8 / 256 each way.)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "optim/adamw_math.h"
#include "optim/unit_update.h"
#include "state/host_state.h"

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Mode {
  const char* name;
  rt::MomentStorage moments;
  rt::MasterStorage master;
  rt::QuantRounding rounding;
  double bytes;  // per parameter and update
};

// Whether mode `name` is in the comma-separated list (empty: every mode).
bool mode_selected(const std::string& list, const char* name) {
  if (list.empty()) return true;
  size_t b = 0;
  while (b <= list.size()) {
    const size_t e = std::min(list.find(',', b), list.size());
    if (list.compare(b, e - b, name) == 0) return true;
    b = e + 1;
  }
  return false;
}

// The per-block kernels on one L1-resident block, single thread, ns per
// element: what the update costs with no memory traffic (the compute ceiling).
void kernel_times() {
  constexpr int64_t k = rt::kQuantBlock;
  alignas(64) float p[k], m[k], v[k], g[k];
  alignas(64) uint8_t qm[k], qv[k];
  for (int64_t i = 0; i < k; ++i) {
    p[i] = 0.01f * static_cast<float>(i % 17);
    m[i] = 1e-3f * static_cast<float>(i % 13 - 6);
    v[i] = 1e-6f * static_cast<float>(i % 11 + 1);
    g[i] = 1e-3f * static_cast<float>((i * 104729) % 1000 - 500);
  }
  rt::AdamWHyper h;
  const rt::AdamWConsts c = rt::adamw_consts(h, 10, 1e-4, 0.01, 1.0f);
  // short windows (~0.3 ms), best of many: on shared cores a longer window
  // is rarely left uninterrupted
  const int reps = 1000;
  auto time = [&](const char* what, auto&& fn) {
    double best = 1e30;
    for (int r = 0; r < 60; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int j = 0; j < reps; ++j) fn(j);
      best = std::min(best, seconds_since(t0));
    }
    std::printf("  %-34s %6.3f ns/element\n", what, best / reps / k * 1e9);
  };
  std::printf("\nper-block kernels, one L1-resident block of %lld, 1 thread:\n", static_cast<long long>(k));
  uint16_t sh[k];
  time("adamw math (adamw_span + shadow)", [&](int) { rt::adamw_span(p, m, v, g, k, c, sh); });
  float sm = 0, sv = 0;
  for (auto st : {rt::MomentStorage::q8, rt::MomentStorage::q4}) {
    const bool q8 = st == rt::MomentStorage::q8;
    for (auto r : {rt::QuantRounding::nearest, rt::QuantRounding::stochastic}) {
      const std::string what = std::string(q8 ? "q8" : "q4") + " encode m + v, " + rt::quant_rounding_name(r);
      time(what.c_str(), [&](int j) {
        rt::quant_block_encode(st, true, r, j, m, k, qm, 0, &sm);
        rt::quant_block_encode(st, false, r, j, v, k, qv, 0, &sv);
      });
    }
    time(q8 ? "q8 decode m + v" : "q4 decode m + v", [&](int) {
      rt::quant_block_decode(st, true, qm, 0, sm, k, m);
      rt::quant_block_decode(st, false, qv, 0, sv, k, v);
    });
  }
}

// The whole update (update_unit) of one small unit that stays in L2, one
// thread, ns per element and mode: the compute per element and core with
// little memory traffic. cores / (this) bounds a mode's Gparam/s on a host
// whose cores match this one's.
void cached_update_times(const std::vector<Mode>& modes, const std::string& modes_arg) {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 64;
  s.intermediate = 128;
  s.n_heads = 4;
  s.n_kv_heads = 4;
  s.head_dim = 16;
  s.vocab = 64;
  s.max_positions = 64;
  s.n_layers = 1;
  rt::set_global_threads(1);
  std::printf("\nwhole update of one L2-resident unit, 1 thread (ns/element):\n");
  for (const Mode& m : modes) {
    if (std::string(m.name) != "adamw" && !mode_selected(modes_arg, m.name)) continue;
    rt::HostState st(s, false);
    st.init_random(1);
    st.set_moment_storage(m.moments);
    st.set_master_storage(m.master);
    rt::StateUnit& u = st.units()[1];
    std::vector<float> g(static_cast<size_t>(u.numel));
    for (int64_t i = 0; i < u.numel; ++i) g[i] = 1e-3f * static_cast<float>((i * 104729) % 1000 - 500);
    std::vector<uint16_t> shadow(u.shadow_master() ? 0 : static_cast<size_t>(u.numel));
    rt::OptimStep o;
    o.lr = 1e-4;
    o.weight_decay = 0.01;
    o.moment_rounding = m.rounding;
    double best = 1e30;
    for (int r = 0; r < 200; ++r) {
      o.t = r + 1;
      const auto t0 = std::chrono::steady_clock::now();
      rt::update_unit(u, g.data(), o, 1.0f, u.shadow_master() ? u.shadow(u.cur_shadow) : shadow.data());
      if (r > 0) best = std::min(best, seconds_since(t0));
    }
    std::printf("  %-24s %6.3f ns/element (%lld elements)\n", m.name, best / static_cast<double>(u.numel) * 1e9,
                static_cast<long long>(u.numel));
  }
}

}  // namespace

// modes: --lean-modes, a comma-separated subset of the names below and
// "kernels" (the per-block kernel times and the whole update of an
// L2-resident unit per selected mode); fp32 "adamw" always runs: it is the
// baseline of the ratios.
int optim_lean_bench(int64_t n_target, int max_threads, int reps, const char* modes_arg) {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 1024;
  s.intermediate = 4096;
  s.n_heads = 16;
  s.n_kv_heads = 16;
  s.head_dim = 64;
  s.vocab = 1024;
  s.max_positions = 64;
  s.n_layers = 1;
  const int64_t per_layer = rt::HostState(s, false).units()[1].numel;
  s.n_layers = std::max<int64_t>(1, n_target / per_layer);
  const double scales = 2.0 * 8 / rt::kQuantBlock;
  using MO = rt::MomentStorage;
  using MS = rt::MasterStorage;
  const rt::QuantRounding SR = rt::QuantRounding::stochastic, RN = rt::QuantRounding::nearest;
  const std::vector<Mode> modes = {
      {"adamw", MO::fp32, MS::fp32, SR, 30},
      {"adamw8bit", MO::q8, MS::fp32, SR, 18 + scales},
      {"adamw8bit-nearest", MO::q8, MS::fp32, RN, 18 + scales},
      {"adamw4bit", MO::q4, MS::fp32, SR, 16 + scales},
      {"adamw4bit-nearest", MO::q4, MS::fp32, RN, 16 + scales},
      {"adamw8bit+split", MO::q8, MS::split, SR, 14.25 + scales},
      {"adamw8bit+bf16-sr", MO::q8, MS::bf16_sr, SR, 12 + scales},
      {"adamw4bit+bf16-kahan", MO::q4, MS::bf16_kahan, SR, 14 + scales},
      {"adamw4bit+bf16-sr", MO::q4, MS::bf16_sr, SR, 10 + scales},
      {"bf16-kahan (fp32 m v)", MO::fp32, MS::bf16_kahan, SR, 28},
  };
  if (mode_selected(modes_arg, "kernels")) {
    kernel_times();
    cached_update_times(modes, modes_arg);
  }
  std::vector<int> thread_counts;
  for (int t = 1; t < max_threads; t *= 2) thread_counts.push_back(t);
  thread_counts.push_back(max_threads);
  std::printf("\nlean storages: update_unit over a %lld-layer synthetic Llama (%lld params), SIMD %s\n",
              static_cast<long long>(s.n_layers), static_cast<long long>(s.params_total()),
              rt::simd_level_name(rt::simd_level_active()));
  // Gparam/cpu-s: parameters per second of CPU time of all threads (robust to
  // other processes on shared cores; with T threads, T times a thread's rate
  // when none waits)
  std::printf("%-24s %7s  %10s %8s  %-8s  %10s  %s\n", "mode", "threads", "Gparam/s", "GB/s", "vs adamw",
              "Gparam/cpu-s", "vs adamw");
  std::vector<double> base(thread_counts.size(), 0), base_cpu(thread_counts.size(), 0);
  struct Last {
    const Mode* mode;
    double cpu_ns;  // CPU time of all threads per element at the most threads
  };
  std::vector<Last> last;
  for (const Mode& m : modes) {
    if (std::string(m.name) != "adamw" && !mode_selected(modes_arg, m.name)) continue;
    rt::HostState st(s, false);
    st.init_random(1);
    st.set_moment_storage(m.moments);
    st.set_master_storage(m.master);
    std::vector<std::vector<float>> g;
    std::vector<std::vector<uint16_t>> shadow;
    for (auto& u : st.units()) {
      g.emplace_back(static_cast<size_t>(u.numel));
      for (int64_t i = 0; i < u.numel; ++i) g.back()[i] = 1e-3f * static_cast<float>((i * 104729) % 1000 - 500);
      shadow.emplace_back(u.shadow_master() ? 0 : static_cast<size_t>(u.numel));
    }
    rt::OptimStep o;
    o.lr = 1e-4;
    o.weight_decay = 0.01;
    o.moment_rounding = m.rounding;
    int64_t t = 1;
    const double n = static_cast<double>(st.n_params());
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      rt::set_global_threads(thread_counts[ti]);
      double best = 1e30, best_cpu = 1e30;
      for (int r = 0; r < reps + 1; ++r) {
        o.t = t++;
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_seconds();
        for (size_t k = 0; k < st.units().size(); ++k) {
          rt::StateUnit& u = st.units()[k];
          rt::update_unit(u, g[k].data(), o, 1.0f, u.shadow_master() ? u.shadow(u.cur_shadow) : shadow[k].data());
        }
        if (r > 0) {  // the first one warms up
          best = std::min(best, seconds_since(t0));
          best_cpu = std::min(best_cpu, process_cpu_seconds() - c0);
        }
      }
      const double gps = n / best / 1e9, cpu = n / best_cpu / 1e9;
      if (m.moments == MO::fp32 && m.master == MS::fp32) base[ti] = gps, base_cpu[ti] = cpu;
      std::printf("%-24s %7d  %10.3f %8.1f  %.2fx  %10.3f  %.2fx\n", m.name, thread_counts[ti], gps, m.bytes * gps,
                  base[ti] > 0 ? gps / base[ti] : 0.0, cpu, base_cpu[ti] > 0 ? cpu / base_cpu[ti] : 0.0);
      std::fflush(stdout);
      if (ti + 1 == thread_counts.size()) last.push_back({&m, 1.0 / cpu});
    }
  }
  // The issue-20 bound: 2x fp32 AdamW's Gparam/s at T threads leaves each
  // thread T / (2 x fp32's Gparam/s) ns per element. A mode that spends more
  // CPU time per element than that cannot reach 2x on these cores, and none
  // can beat fp32's bytes / its bytes where fp32 AdamW is memory-bound.
  const int tmax = thread_counts.back();
  const double fp32_gps = base.back();
  if (fp32_gps > 0) {
    const double budget = tmax / (2.0 * fp32_gps);
    std::printf("\n2x fp32 AdamW at %d threads (%.3f Gparam/s) needs <= %.2f ns of a thread per element:\n", tmax,
                fp32_gps, budget);
    std::printf("%-24s %14s %10s %22s\n", "mode", "CPU ns/element", "vs budget", "traffic bound vs fp32");
    for (const Last& l : last)
      std::printf("%-24s %14.2f %9.2fx %21.2fx\n", l.mode->name, l.cpu_ns, l.cpu_ns / budget, 30.0 / l.mode->bytes);
  }
  return 0;
}
