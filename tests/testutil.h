// Test helpers: tolerance checks that report the worst element, temp dirs,
// running the ramtrain binary (in the foreground or as a background Child),
// a tiny byte-vocab model directory, and the paths of fixtures and shared data.
#pragma once
#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/spec.h"
#include "optim/adamw.h"
#include "state/host_state.h"

namespace rt::test {

// Checks |got - ref| <= atol + rtol * |ref| elementwise. On failure, the
// assertion message names the tensor, the worst element, its index and a few
// pairs. Also fails on any NaN/Inf in got where ref is finite.
::testing::AssertionResult expect_near(const std::string& name, const float* got, const float* ref, int64_t n,
                                       double atol, double rtol);
inline ::testing::AssertionResult expect_near(const std::string& name, const std::vector<float>& got,
                                              const std::vector<float>& ref, double atol, double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " vs " << ref.size();
  return expect_near(name, got.data(), ref.data(), static_cast<int64_t>(got.size()), atol, rtol);
}
// Checks for two fp32 evaluations of the same maths that differ only in the
// order of their sums (chunked vs whole batch, micro-batches, threads, SIMD
// widths, BLAS kernels: OPENBLAS_CORETYPE picks another one). An element-wise
// rtol is no bound on that: a small element that is the difference of large
// terms moves by much more than rtol of itself (issue 37: three such checks
// failed with OpenBLAS's AVX2 kernels). What regrouping can do:
//
//   A sum s = p_1 + ... + p_K of fp32 terms, added in any order, is within
//   gamma_{K-1} * sum_k |p_k| of the exact sum (Higham, Accuracy and Stability
//   of Numerical Algorithms, 2nd ed., eq. 3.4; gamma_m = m u / (1 - m u),
//   u = 2^-24). Two orders of the same terms are thus within
//   2 gamma_{K-1} sum_k |p_k| <= 2 K u sum_k |p_k| (for K u < 1/2: gamma_{K-1}
//   <= (K-1) u / (1 - K u) <= K u) of each other.
//
// expect_regrouped applies that per element: |got - ref| <= c K u twin, where
// twin is the same maths on the absolute values (for a weight gradient
// dW = dY^T X over K tokens: twin = |dY|^T |X|) and c = 2 for exactly the same
// summands. Where the summands themselves come from regrouped sums (a chain
// of GEMMs), each is off by the same kind of bound relative to its own
// absolute twin, and c grows by about 2 per stage; the caller states its c.
// Also fails on any NaN/Inf in got where ref is finite.
constexpr double kFp32Unit = 5.9604644775390625e-8;  // u = 2^-24
::testing::AssertionResult expect_regrouped(const std::string& name, const float* got, const float* ref,
                                            const double* twin, int64_t n, int64_t terms, double c = 2);
inline ::testing::AssertionResult expect_regrouped(const std::string& name, const std::vector<float>& got,
                                                   const std::vector<float>& ref, const std::vector<double>& twin,
                                                   int64_t terms, double c = 2) {
  if (got.size() != ref.size() || twin.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": sizes " << got.size() << ", " << ref.size() << ", "
                                         << twin.size();
  return expect_regrouped(name, got.data(), ref.data(), twin.data(), static_cast<int64_t>(got.size()), terms, c);
}

// Norm-wise, one tensor, for compositions whose absolute twin a test cannot
// form (a whole decoder block or model): ||got - ref||_2 <= bound ||ref||_2.
// Summing the element bound above over a tensor C = A B of K-term sums gives
// ||dC||_2 <= 2 K u || |A||B| ||_2, and || |A||B| ||_2 / ||C||_2, the tensor's
// cancellation ratio, is about sqrt(K) for the zero-mean random data of these
// tests. Rounding errors add up like a random walk rather than in the worst
// case (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019: sqrt(K) u with
// overwhelming probability), so a regrouped stage moves a tensor by about
// sqrt(K) u * sqrt(K) = K u of its norm: <= 4e-6 for the K <= 64 of these
// tests, and a few stages feeding one another stay within kRegroupRelL2. A
// dropped, doubled or misplaced term is off by O(1e-2..1) of the norm; one
// wrong element of n comparable ones by ~n^-1/2.
// RAMTRAIN_TEST_REGROUP_REPORT=1 prints every such check's error (rel_l2, or
// the worst |err|/tol of expect_regrouped) to stderr: how to see the margins
// under another BLAS kernel (OPENBLAS_CORETYPE=Haswell, Zen, SkylakeX).
constexpr double kRegroupRelL2 = 1e-5;
::testing::AssertionResult expect_regrouped_norm(const std::string& name, const float* got, const float* ref,
                                                 int64_t n, double bound = kRegroupRelL2);
inline ::testing::AssertionResult expect_regrouped_norm(const std::string& name, const std::vector<float>& got,
                                                        const std::vector<float>& ref,
                                                        double bound = kRegroupRelL2) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " vs " << ref.size();
  return expect_regrouped_norm(name, got.data(), ref.data(), static_cast<int64_t>(got.size()), bound);
}

// expect_regrouped_norm for each tensor of two flat gradient vectors laid out
// as st's units are (each unit's gradient arena, units in order).
::testing::AssertionResult expect_grads_regrouped(const std::string& name, const HostState& st,
                                                  const std::vector<float>& got, const std::vector<float>& ref,
                                                  double bound = kRegroupRelL2);

// Relative error ||got - ref|| / ||ref|| (L2), the per-tensor summary number.
double rel_l2(const float* got, const float* ref, int64_t n);
// Max |got - ref| / max(|ref|_max, tiny): relative to the tensor's scale.
double max_rel_to_scale(const float* got, const float* ref, int64_t n);

// Uniform random in [lo, hi), seeded (std::mt19937_64).
std::vector<float> random_vec(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);

// A fresh directory under $TMPDIR removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code;
  std::string output;  // stdout + stderr
};
// Runs the ramtrain binary with the given shell-quoted argument string.
RunResult run_ramtrain(const std::string& args);

// The ramtrain binary (RAMTRAIN_BINARY of the build) running in the
// background, its stdout and stderr appended to log; env entries "K=V" are
// added before the inherited environment (so they win). pid is -1 when the
// spawn failed. The destructor SIGKILLs and reaps a process still running.
struct Child {
  pid_t pid = -1;
  Child(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {});
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Blocks until it exits: its exit code, 128 + the signal that ended it, or -1 (none running).
  int wait();
  // The same, or -1 when it is still running after `seconds` (0: just look).
  int wait_for(double seconds);
  // Sends sig, then wait().
  int kill_and_wait(int sig);
};

// The message of the rt::Error that f throws; "" when it throws none.
std::string error_of(const std::function<void()>& f);
// Runs f and expects an rt::Error whose message contains every part (a test failure otherwise).
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts);

// s contains sub.
inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// At least min_bytes of words, each followed by a space, drawn from twelve
// common English words by std::mt19937_64(seed): text a byte model learns fast.
std::string random_words(size_t min_bytes, uint64_t seed);

// Creates dir with the config.json of a tiny byte-vocab Llama (258 tokens,
// BOS 256, EOS 257; 2 layers of the given width, MLP 64, 4 heads and 2 KV
// heads, 64 positions) for `train --init random`: a run takes well under a second.
void make_byte_model_dir(const std::string& dir, int hidden = 32);

// Bound on rel_l2 between a parameter gradient of ours and transformers' (both
// fp32, only the summation order differs): 1e-5, except the key-projection
// bias. Softmax ignores a shift of a row's scores, so the exact key-bias
// gradient would vanish but for RoPE rotating the bias per position: it is a
// sum of terms that mostly cancel, and its rounding relative to its own size
// is amplified (1.35e-5 on qwen2_bias_tied with the AVX-512 OpenBLAS kernels
// of an AMD Zen 4, below 1e-5 with AVX2; the absolute error, 3e-7, is 2e-6 of
// the layer's largest gradient). Its bound is 1e-4.
inline double hf_grad_rel_bound(const std::string& tensor, double base = 1e-5) {
  return tensor.find("k_proj.bias") != std::string::npos ? std::max(base, 1e-4) : base;
}

// A tiny Llama (width 16, MLP 24, 2 layers, 2 heads of 8, 1 KV head, vocab
// 40, 32 positions, untied) for tests of state, checkpoints and I/O.
ModelSpec tiny_spec();
// A Llama of the given widths (64 positions, untied, the default rms_eps).
ModelSpec llama_spec(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, int64_t vocab, bool qkv_bias = false);
// Every unit's current master as fp32, units in order (split / bf16 masters decoded).
std::vector<float> all_masters(const HostState& st);
// Every byte of the state an update reads or writes, units in order: the master
// (decoded), the moments as stored (fp32, or codes and scales), a bf16-kahan
// compensation; with_split_and_shadow: also a split master's remainder and tie
// bits and the current bf16 shadow.
std::vector<uint8_t> state_bytes(const HostState& s, bool with_split_and_shadow);

// Tests of the SIMD dispatch (optim/adamw.h SimdLevel: the optimizer and,
// following it, the moment codecs) run each path as a test of its own; a path
// this CPU cannot run is skipped with this message, so a CI log shows which
// ran (scalar and AVX2 run on every x86-64 CPU with AVX2 and FMA):
//   if (auto why = rt::test::simd_path_unavailable(level); !why.empty()) GTEST_SKIP() << why;
std::string simd_path_unavailable(SimdLevel level);
// The paths in a parameter name: scalar, avx2, avx512.
inline std::string simd_param_name(const ::testing::TestParamInfo<SimdLevel>& i) { return simd_level_name(i.param); }

std::string fixture_dir();      // tests/fixtures
std::string shared_data_dir();  // ../shared/data

void write_bytes(const std::string& path, const std::string& bytes);

// One 8-bit moment of n elements (m: sgn) in the dynamic tree code that
// ramtrain stored before the minifloat codes (state/moment_quant.h): absmax per
// block, each element's nearest level by brute force (ties down), as the old
// table lookup gave. For tests of loading such checkpoints.
void encode_dynamic8(bool sgn, const float* x, int64_t n, uint8_t* codes, float* scales);

// sum_i out[i] * r[i] in double (a random projection of an op's output: the
// scalar loss of a finite-difference check).
double dot_d(const std::vector<float>& out, const std::vector<float>& r);

// Central-difference check of analytic = dL/dx on all elements of x, or on a
// random subset of max_samples; step 1e-2, atol 2e-3, rtol 2e-2 (derivation
// in testutil.cpp). Also fails when every sampled gradient is below 0.05 (a
// check that proves nothing).
void check_fd_grad(const std::string& name, std::vector<float>& x, const std::vector<float>& analytic,
                   const std::function<double()>& loss, int64_t max_samples = 60, uint64_t seed = 7);

}  // namespace rt::test
