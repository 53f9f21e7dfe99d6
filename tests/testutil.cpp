#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

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

}  // namespace rt::test
