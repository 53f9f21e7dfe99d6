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

std::string fixture_dir();      // tests/fixtures
std::string shared_data_dir();  // ../shared/data

void write_bytes(const std::string& path, const std::string& bytes);

// One 8-bit moment of n elements (m: sgn) in the dynamic tree code that
// ramtrain stored before the minifloat codes (state/moment_quant.h): absmax per
// block, each element's nearest level by brute force (ties down), as the old
// table lookup gave. For tests of loading such checkpoints.
void encode_dynamic8(bool sgn, const float* x, int64_t n, uint8_t* codes, float* scales);

}  // namespace rt::test
