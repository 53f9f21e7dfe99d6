#include "testutil.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "state/moment_quant.h"
#include "state/split_master.h"

extern char** environ;

namespace rt::test {

::testing::AssertionResult expect_near(const std::string& name, const float* got, const float* ref, int64_t n,
                                       double atol, double rtol) {
  int64_t worst = -1, n_bad = 0;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    double g = got[i], r = ref[i];
    double tol = atol + rtol * std::fabs(r);
    double err = std::fabs(g - r);
    bool bad = !(err <= tol) || (std::isfinite(r) && !std::isfinite(g));
    if (bad) {
      ++n_bad;
      double excess = std::isfinite(err) ? err / (tol > 0 ? tol : 1e-30) : INFINITY;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << name << ": " << n_bad << " of " << n << " elements outside atol=" << atol << " rtol=" << rtol << "; worst at ["
    << worst << "]: got " << got[worst] << " ref " << ref[worst] << " (|err|/tol = " << worst_excess
    << "); rel_l2=" << rel_l2(got, ref, n) << "; first pairs:";
  for (int64_t i = 0; i < n && i < 4; ++i) s << " (" << got[i] << ", " << ref[i] << ")";
  return ::testing::AssertionFailure() << s.str();
}

::testing::AssertionResult expect_regrouped(const std::string& name, const float* got, const float* ref,
                                            const double* twin, int64_t n, int64_t terms, double c) {
  // the smallest normal float: below it, the rounding of the products is absolute
  const double floor = c * terms * 1.1754943508222875e-38;
  int64_t worst = -1, n_bad = 0;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    const double tol = c * static_cast<double>(terms) * kFp32Unit * twin[i] + floor;
    const double err = std::fabs(g - r);
    if (!(err <= tol) || (std::isfinite(r) && !std::isfinite(g))) {
      ++n_bad;
      const double excess = std::isfinite(err) ? err / tol : INFINITY;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  static const bool report = [] {
    const char* r = getenv("RAMTRAIN_TEST_REGROUP_REPORT");
    return r && *r && std::string(r) != "0";
  }();
  if (report) {
    double mx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double tol = c * static_cast<double>(terms) * kFp32Unit * twin[i] + floor;
      mx = std::max(mx, std::fabs(static_cast<double>(got[i]) - ref[i]) / tol);
    }
    std::fprintf(stderr, "[regroup] %s: max |err|/tol %.3g\n", name.c_str(), mx);
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << name << ": " << n_bad << " of " << n << " elements beyond " << c << " * " << terms
    << " * u * twin (fp32 regrouping of " << terms << "-term sums); worst at [" << worst << "]: got " << got[worst]
    << " ref " << ref[worst] << " twin " << twin[worst] << " (|err|/tol = " << worst_excess
    << "); rel_l2=" << rel_l2(got, ref, n);
  return ::testing::AssertionFailure() << s.str();
}

::testing::AssertionResult expect_regrouped_norm(const std::string& name, const float* got, const float* ref,
                                                 int64_t n, double bound) {
  const double e = rel_l2(got, ref, n);
  bool finite = true;
  int64_t worst = 0;
  double worst_err = -1, ref_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(ref[i]) && !std::isfinite(got[i])) finite = false;
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= worst_err)) {
      worst = i;
      worst_err = err;
    }
    ref_max = std::max(ref_max, std::fabs(static_cast<double>(ref[i])));
  }
  static const bool report = [] {
    const char* r = getenv("RAMTRAIN_TEST_REGROUP_REPORT");
    return r && *r && std::string(r) != "0";
  }();
  if (report) std::fprintf(stderr, "[regroup] %s: rel_l2 %.3g (bound %.3g)\n", name.c_str(), e, bound);
  if (finite && e <= bound) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << name << ": rel_l2 " << e << " > " << bound << " (norm-wise bound on fp32 regrouping)"
    << (finite ? "" : "; non-finite values where the reference is finite") << "; worst at [" << worst << "]: got "
    << got[worst] << " ref " << ref[worst] << " (max |ref| " << ref_max << ")";
  return ::testing::AssertionFailure() << s.str();
}

::testing::AssertionResult expect_grads_regrouped(const std::string& name, const HostState& st,
                                                  const std::vector<float>& got, const std::vector<float>& ref,
                                                  double bound) {
  int64_t total = 0;
  for (const auto& u : st.units()) total += u.numel;
  if (static_cast<int64_t>(got.size()) != total || static_cast<int64_t>(ref.size()) != total)
    return ::testing::AssertionFailure() << name << ": sizes " << got.size() << ", " << ref.size() << " vs the "
                                         << total << " gradient elements of the state";
  ::testing::AssertionResult all = ::testing::AssertionSuccess();
  bool ok = true;
  std::ostringstream fails;
  int64_t base = 0;
  for (const auto& u : st.units()) {
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t off = base + u.offsets[k];
      auto r = expect_regrouped_norm(name + " " + u.entries[k].name, got.data() + off, ref.data() + off,
                                     u.entries[k].numel(), bound);
      if (!r) {
        ok = false;
        fails << "\n  " << r.message();
      }
    }
    base += u.numel;
  }
  if (ok) return all;
  return ::testing::AssertionFailure() << name << ": tensors beyond the regrouping bound:" << fails.str();
}

double rel_l2(const float* got, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_rel_to_scale(const float* got, const float* ref, int64_t n) {
  double mx = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return mx / std::max(scale, 1e-30);
}

std::vector<float> random_vec(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(g);
  return v;
}

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ramtrain_test_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = mkdtemp(buf.data());
  if (!p) throw std::runtime_error("mkdtemp failed");
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

RunResult run_ramtrain(const std::string& args) {
  // RAMTRAIN_BINARY in the environment overrides the build-time path (staged GPU runs)
  const char* bin = getenv("RAMTRAIN_BINARY");
  std::string cmd = std::string(bin && *bin ? bin : RAMTRAIN_BINARY) + " " + args + " 2>&1";
  RunResult r{-1, ""};
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) r.output.append(buf, k);
  int st = pclose(f);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

Child::Child(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env) {
  std::vector<std::string> argv_s = {RAMTRAIN_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s(env);
  for (char** e = environ; *e; ++e) env_s.push_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (posix_spawn(&pid, RAMTRAIN_BINARY, &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
}

Child::~Child() {
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

int Child::wait() {
  int st = 0;
  if (pid < 0 || ::waitpid(pid, &st, 0) != pid) return -1;
  pid = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int Child::wait_for(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    const pid_t w = ::waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      pid = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

int Child::kill_and_wait(int sig) {
  if (pid < 0) return -1;
  ::kill(pid, sig);
  return wait();
}

std::string random_words(size_t min_bytes, uint64_t seed) {
  std::mt19937_64 g(seed);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far"};
  std::string text;
  while (text.size() < min_bytes) text += std::string(words[g() % 12]) + " ";
  return text;
}

void make_byte_model_dir(const std::string& dir, int hidden) {
  std::filesystem::create_directories(dir);
  write_bytes(dir + "/config.json",
              "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": " +
                  std::to_string(hidden) +
                  ", \"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                  "\"num_key_value_heads\": 2, \"vocab_size\": 258, \"rms_norm_eps\": 1e-5, "
                  "\"max_position_embeddings\": 64, \"bos_token_id\": 256, \"eos_token_id\": 257}");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << (parts.empty() ? "" : parts.front()) << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
  }
}

ModelSpec tiny_spec() {
  ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 16;
  s.intermediate = 24;
  s.n_layers = 2;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.vocab = 40;
  s.max_positions = 32;
  return s;
}

ModelSpec llama_spec(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, int64_t vocab, bool qkv_bias) {
  ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = hidden;
  s.intermediate = intermediate;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.vocab = vocab;
  s.max_positions = 64;
  s.qkv_bias = qkv_bias;
  return s;
}

std::vector<float> all_masters(const HostState& st) {
  std::vector<float> w;
  for (auto& u : st.units()) {
    std::vector<float> x(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, x.data());
    w.insert(w.end(), x.begin(), x.end());
  }
  return w;
}

std::vector<uint8_t> state_bytes(const HostState& s, bool with_split_and_shadow) {
  std::vector<uint8_t> b;
  auto add = [&](const void* p, size_t n) {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    b.insert(b.end(), q, q + n);
  };
  for (const StateUnit& u : s.units()) {
    std::vector<float> x(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, x.data());
    add(x.data(), x.size() * 4);
    if (u.quantized()) {
      add(u.qm(), static_cast<size_t>(quant_code_bytes(u.moments, u.numel)));
      add(u.qv(), static_cast<size_t>(quant_code_bytes(u.moments, u.v_len())));
      add(u.scale_m(), static_cast<size_t>(quant_blocks(u.numel) + quant_blocks(u.v_len())) * 4);
    } else {
      add(u.m(), static_cast<size_t>(u.numel + u.v_len()) * 4);
    }
    if (with_split_and_shadow && u.split()) {
      add(u.rem(), static_cast<size_t>(u.numel) * 2);
      add(u.tie(), static_cast<size_t>(split_master_tie_words(u.numel)) * 8);
    }
    if (u.master_kind == MasterStorage::bf16_kahan) add(u.comp(), static_cast<size_t>(u.numel) * 2);
    if (with_split_and_shadow && u.shadow_master()) add(u.shadow(u.cur_shadow), static_cast<size_t>(u.numel) * 2);
  }
  return b;
}

std::string simd_path_unavailable(SimdLevel level) {
  if (level <= simd_level_detected()) return "";
  return std::string("the ") + simd_level_name(level) + " path is not run: this CPU has at most " +
         simd_level_name(simd_level_detected()) + " (" +
         (level == SimdLevel::avx512 ? "AVX-512F" : "AVX2 and FMA") + " missing)";
}

std::string fixture_dir() { return RAMTRAIN_FIXTURE_DIR; }
std::string shared_data_dir() {
  // RAMTRAIN_SHARED_DATA_DIR in the environment overrides the build-time path
  // (the GPU machine gets the data in a carried folder).
  const char* e = getenv("RAMTRAIN_SHARED_DATA_DIR");
  return e && *e ? e : RAMTRAIN_SHARED_DATA_DIR;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void encode_dynamic8(bool sgn, const float* x, int64_t n, uint8_t* codes, float* scales) {
  const QuantCode& c = sgn ? quant_code_m8_dynamic() : quant_code_v8_dynamic();
  auto nearest = [&](float y) {
    int best = 0;
    for (int k = 1; k < c.n; ++k)
      if (y > 0.5f * (c.level[k - 1] + c.level[k])) best = k;
    return best;
  };
  for (int64_t b = 0; b < quant_blocks(n); ++b) {
    const int64_t f = b * kQuantBlock, k = std::min(kQuantBlock, n - f);
    float amax = 0;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[f + i]));
    scales[b] = amax;
    for (int64_t i = 0; i < k; ++i) {
      const float a = std::fabs(x[f + i]);
      const int q = nearest(a == amax ? 1.0f : amax > 0 ? a / amax : 0.0f);
      codes[f + i] = static_cast<uint8_t>(q | (sgn && std::signbit(x[f + i]) ? 0x80 : 0));
    }
  }
}

namespace {
// Finite-difference tolerance. The central difference with step h has
// truncation error h^2/6 * |L'''| (~1e-5 here: h = 1e-2, third derivatives O(1))
// plus fp32 forward noise: L is a sum of O(100-1000) fp32 outputs of size O(1),
// each off by ~1 ulp (6e-8), so |dL| <~ 1e-6 and the quotient is off by
// <~ 1e-6 / (2h) = 5e-5. atol 2e-3 / rtol 2e-2 covers both with margin, while a
// wrong formula (missing term, wrong sign, wrong head mapping) is off by O(0.1-1).
constexpr double kFdStep = 1e-2;
constexpr double kFdAtol = 2e-3;
constexpr double kFdRtol = 2e-2;
}  // namespace

// sum_i out[i] * r[i] in double.
double dot_d(const std::vector<float>& out, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

// Central-difference check of analytic = dL/dx on all elements of x, or on a
// random subset of max_samples. The difference quotient divides by the step
// actually stored in fp32 ((float)(v+h) - (float)(v-h)), not by 2h.
void check_fd_grad(const std::string& name, std::vector<float>& x, const std::vector<float>& analytic,
                   const std::function<double()>& loss, int64_t max_samples, uint64_t seed) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  if (static_cast<int64_t>(idx.size()) > max_samples) {
    std::mt19937_64 g(seed);
    std::shuffle(idx.begin(), idx.end(), g);
    idx.resize(static_cast<size_t>(max_samples));
  }
  std::vector<float> got, ref;
  double max_abs = 0;
  for (int64_t i : idx) {
    const float v = x[i];
    x[i] = static_cast<float>(v + kFdStep);
    const double xp = x[i], lp = loss();
    x[i] = static_cast<float>(v - kFdStep);
    const double xm = x[i], lm = loss();
    x[i] = v;
    const double num = (lp - lm) / (xp - xm);
    got.push_back(analytic[i]);
    ref.push_back(static_cast<float>(num));
    max_abs = std::max(max_abs, std::fabs(num));
  }
  EXPECT_TRUE(expect_near(name + " (analytic vs finite difference)", got, ref, kFdAtol, kFdRtol));
  // Guard against a vacuous check: the sampled gradients must not all be ~0.
  EXPECT_GT(max_abs, 0.05) << name << ": finite-difference gradients are all tiny; the check proves nothing";
}

}  // namespace rt::test
