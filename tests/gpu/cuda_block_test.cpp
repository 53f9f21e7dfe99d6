// The decoder block template (model/block.h) on the CUDA backend (CudaOps)
// with MLP token chunks (BlockDims::mlp_chunk_tokens), against the CPU block
// (the specification) and against the unchunked CUDA block. Weights, input
// and output gradient are drawn in fp32 and rounded through bf16 once, so
// both backends see exactly the same values.
//  - a chunk of the whole batch is the same op calls: bit-identical to the
//    unchunked CUDA block;
//  - chunks < N (the recompute forward with y == nullptr and dx aliasing dy,
//    as the engines call it, and an uneven last chunk) against the unchunked
//    CUDA block: per tensor rel_l2 <= 1e-2. What changes is the GEMM row count
//    (cuBLASLt may choose another algorithm: other fp32 summation orders, so
//    an occasional bf16 result one rounding step, 2^-8 relative, apart) and
//    the grouping of the token sums of the MLP weight gradients (fp32). That
//    is ~1e-3 at most; a dropped or misplaced chunk is O(1);
//  - both against the CPU block: per tensor rel_l2 <= 5e-2, the bound of
//    CudaEngine.GradientsMatchTheCpuReference (bf16 activations and
//    activation gradients at every op; 1.3e-2 observed there over 4 layers).
// Without a CUDA device the tests skip; without CUDA at build time this file
// holds one test that skips.
#include <gtest/gtest.h>

#ifdef RAMTRAIN_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/device_info.h"
#include "state/host_state.h"
#include "model/block.h"
#include "testutil.h"

namespace {

using rt::cuda::bf16;
using CudaActs = rt::BlockActs<rt::cuda::CudaOps>;
using CudaScratch = rt::BlockScratch<rt::cuda::CudaOps>;

// GPU-friendly widths (multiples of 8, head_dim 64), Qwen2-style q/k/v bias.
rt::ModelSpec gpu_spec() {
  rt::ModelSpec s;
  s.family = rt::Family::qwen2;
  s.architecture = "Qwen2ForCausalLM";
  s.qkv_bias = true;
  s.hidden = 256;
  s.intermediate = 512;
  s.n_layers = 1;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 264;
  s.rms_eps = 1e-5;
  s.max_positions = 512;
  return s;
}

// OLMo2 on the same widths: post-branch norms, q/k norms over the whole projection.
rt::ModelSpec olmo2_spec() {
  rt::ModelSpec s = gpu_spec();
  s.family = rt::Family::olmo2;
  s.architecture = "Olmo2ForCausalLM";
  s.qkv_bias = false;
  s.qk_norm = s.qk_norm_whole = s.post_norms = true;
  return s;
}

float bf16_round(float v) { return rt::bf16_to_f32(rt::f32_to_bf16(v)); }

std::vector<uint16_t> to_bf16(const float* v, size_t n) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = rt::f32_to_bf16(v[i]);
  return h;
}
std::vector<float> from_bf16_device(const bf16* d, size_t n) {
  std::vector<uint16_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = rt::bf16_to_f32(h[i]);
  return f;
}

// A pointer into a unit's host arena, moved to the same offset of a device copy.
template <class T, class H>
T* rebase(H* p, const float* base, T* dev) {
  return p ? dev + (reinterpret_cast<const float*>(p) - base) : nullptr;
}

struct Out {
  std::vector<float> y, dx, grads;
};

struct Fixture {
  rt::ModelSpec s;
  rt::HostState st{s, true};
  int64_t B = 2, T = 96;
  std::vector<float> x, dy;
  std::vector<int32_t> pos;
  int64_t N() const { return B * T; }
  rt::StateUnit& unit() { return st.units()[1]; }

  explicit Fixture(rt::ModelSpec spec = gpu_spec()) : s(std::move(spec)) {
    st.init_random(5, 0.05f);
    std::mt19937_64 g(3);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (size_t k = 0; k < unit().entries.size(); ++k)  // non-trivial norm weights and biases
      if (unit().entries[k].is_norm_or_bias)
        for (int64_t i = 0; i < unit().entries[k].numel(); ++i) unit().master()[unit().offsets[k] + i] += u(g);
    for (int64_t i = 0; i < unit().numel; ++i) unit().master()[i] = bf16_round(unit().master()[i]);
    x = rt::test::random_vec(N() * s.hidden, 8);
    dy = rt::test::random_vec(N() * s.hidden, 9, -0.1f, 0.1f);
    for (float& v : x) v = bf16_round(v);
    for (float& v : dy) v = bf16_round(v);
    for (int64_t i = 0; i < N(); ++i) pos.push_back(static_cast<int32_t>(i % T));
  }

  Out run_cpu() {
    rt::CpuOps ops(s);
    const rt::BlockDims dm{B, T};
    rt::BlockActs<rt::CpuOps> t(ops, s, dm);
    rt::BlockScratch<rt::CpuOps> d(ops, s, dm);
    st.zero_grads();
    Out o;
    o.y.resize(x.size());
    o.dx.resize(x.size());
    const auto w = st.weights().layers[0];
    rt::block_forward(ops, s, w, dm, x.data(), o.y.data(), pos.data(), t);
    rt::block_backward(ops, s, w, dm, x.data(), dy.data(), o.dx.data(), pos.data(), t, d, st.grads().layers[0]);
    o.grads.assign(unit().grad.p, unit().grad.p + unit().numel);
    return o;
  }

  // The CUDA block with MLP chunk `chunk`; recompute: the backward reads a
  // recompute forward (y == nullptr) into activations poisoned with NaN, and
  // dx aliases dy.
  // matmul / fused_amax: CudaOps::set_matmul and set_fused_amax.
  Out run_cuda(int64_t chunk, bool recompute, rt::MatmulMode matmul = rt::MatmulMode::bf16, bool fused_amax = true) {
    namespace cu = rt::cuda;
    const int64_t NC = N() * s.hidden;
    cu::DeviceAllocator alloc(uint64_t{1} << 32);
    cu::Blas blas;
    cu::Stream stream;
    const std::vector<float> inv = rt::cpu::rope_inv_freq(s.rope, s.head_dim);
    cu::DevBuf<float> inv_freq(alloc, static_cast<int64_t>(inv.size()), "RoPE frequencies");
    CUDA_CHECK(cudaMemcpy(inv_freq.data(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
    const size_t sc = std::max({cu::rms_norm_backward_scratch_bytes(N(), s.hidden),
                                cu::rms_norm_backward_scratch_bytes(N() * s.n_heads, s.head_dim),
                                cu::attention_backward_scratch_bytes(B, T, s.n_heads)});
    cu::DevBuf<uint8_t> scratch(alloc, static_cast<int64_t>(sc), "op scratch");
    cu::CudaOps ops(alloc, blas, stream.get(), inv_freq.data(), cu::Scratch{scratch.data(), sc});
    ops.set_matmul(matmul);
    ops.set_fused_amax(fused_amax);
    const rt::BlockDims dm{B, T, chunk};
    CudaActs t(ops, s, dm);
    CudaScratch d(ops, s, dm);
    auto poison_acts = [&] {
      CudaActs::each_buffer(
          s, dm, [&](auto m, int64_t n) { CUDA_CHECK(cudaMemset((t.*m).data(), 0xff, n * sizeof(bf16))); },
          [&](auto m, int64_t n) { CUDA_CHECK(cudaMemset((t.*m).data(), 0xff, n * sizeof(float))); });
    };
    poison_acts();
    CudaScratch::each_buffer(s, dm, [&](auto m, int64_t n) {
      CUDA_CHECK(cudaMemset((d.*m).data(), 0xff, n * sizeof(bf16)));  // NaN in bf16
    });
    // weights (bf16) and gradients (fp32, zero) at the host arena's offsets
    rt::StateUnit& u = unit();
    const std::vector<uint16_t> wh = to_bf16(u.master(), static_cast<size_t>(u.numel));
    cu::DevBuf<bf16> wd(alloc, u.numel, "layer weights");
    CUDA_CHECK(cudaMemcpy(wd.data(), wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
    cu::DevBuf<float> gd(alloc, u.numel, "layer gradients");
    CUDA_CHECK(cudaMemset(gd.data(), 0, gd.bytes()));
    const rt::BlockWeightsT<float> hw = st.weights().layers[0];
    const float* base = u.master();
    const bf16* wdp = wd.data();
    const rt::BlockWeightsT<bf16> w{
        rebase(hw.attn_norm, base, wdp), rebase(hw.q_proj, base, wdp),   rebase(hw.q_bias, base, wdp),
        rebase(hw.k_proj, base, wdp),    rebase(hw.k_bias, base, wdp),   rebase(hw.v_proj, base, wdp),
        rebase(hw.v_bias, base, wdp),    rebase(hw.q_norm, base, wdp),   rebase(hw.k_norm, base, wdp),
        rebase(hw.o_proj, base, wdp),    rebase(hw.mlp_norm, base, wdp), rebase(hw.gate_proj, base, wdp),
        rebase(hw.up_proj, base, wdp),   rebase(hw.down_proj, base, wdp)};
    float* g = gd.data();
    const rt::BlockGrads gr{rebase(hw.attn_norm, base, g), rebase(hw.q_proj, base, g),   rebase(hw.q_bias, base, g),
                            rebase(hw.k_proj, base, g),    rebase(hw.k_bias, base, g),   rebase(hw.v_proj, base, g),
                            rebase(hw.v_bias, base, g),    rebase(hw.q_norm, base, g),   rebase(hw.k_norm, base, g),
                            rebase(hw.o_proj, base, g),    rebase(hw.mlp_norm, base, g), rebase(hw.gate_proj, base, g),
                            rebase(hw.up_proj, base, g),   rebase(hw.down_proj, base, g)};
    const std::vector<uint16_t> xh = to_bf16(x.data(), x.size()), dyh = to_bf16(dy.data(), dy.size());
    cu::DevBuf<bf16> xd(alloc, NC, "x"), yd(alloc, NC, "y"), dyd(alloc, NC, "dy"), dxd(alloc, NC, "dx");
    cu::DevBuf<int32_t> posd(alloc, N(), "positions");
    CUDA_CHECK(cudaMemcpy(xd.data(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dyd.data(), dyh.data(), dyh.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(posd.data(), pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
    rt::block_forward(ops, s, w, dm, xd.data(), yd.data(), posd.data(), t);
    bf16* dx = dxd.data();
    if (recompute) {
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      poison_acts();
      rt::block_forward(ops, s, w, dm, xd.data(), nullptr, posd.data(), t);
      CUDA_CHECK(cudaMemcpyAsync(dx, dyd.data(), NC * 2, cudaMemcpyDeviceToDevice, stream.get()));
      rt::block_backward(ops, s, w, dm, xd.data(), dx, dx, posd.data(), t, d, gr);
    } else {
      rt::block_backward(ops, s, w, dm, xd.data(), dyd.data(), dx, posd.data(), t, d, gr);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    Out o;
    o.y = from_bf16_device(yd.data(), static_cast<size_t>(NC));
    o.dx = from_bf16_device(dx, static_cast<size_t>(NC));
    o.grads.resize(static_cast<size_t>(u.numel));
    CUDA_CHECK(cudaMemcpy(o.grads.data(), gd.data(), gd.bytes(), cudaMemcpyDeviceToHost));
    return o;
  }

  // Per tensor rel_l2 of got against ref (y, dx, each weight gradient) <= bound; the worst is printed.
  void expect_close(const Out& got, const Out& ref, double bound, const std::string& what) {
    double worst = 0;
    std::string worst_name;
    auto one = [&](const float* a, const float* r, int64_t n, const std::string& name) {
      const double e = rt::test::rel_l2(a, r, n);
      EXPECT_LE(e, bound) << what << ": " << name;
      if (!(e <= worst)) worst = e, worst_name = name;
    };
    one(got.y.data(), ref.y.data(), static_cast<int64_t>(ref.y.size()), "y");
    one(got.dx.data(), ref.dx.data(), static_cast<int64_t>(ref.dx.size()), "dx");
    for (size_t k = 0; k < unit().entries.size(); ++k)
      one(got.grads.data() + unit().offsets[k], ref.grads.data() + unit().offsets[k], unit().entries[k].numel(),
          unit().entries[k].name);
    std::printf("[block] %s: worst rel_l2 %.3e (%s)\n", what.c_str(), worst, worst_name.c_str());
  }
};

bool have_gpu() { return rt::cuda::device_count() > 0; }

TEST(CudaBlock, WholeBatchChunkIsBitIdenticalToUnchunked) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CPU twin is tests/model/block_test.cpp";
  Fixture f;
  const Out a = f.run_cuda(0, false);
  const Out b = f.run_cuda(f.N(), false);
  EXPECT_TRUE(a.y == b.y);
  EXPECT_TRUE(a.dx == b.dx);
  EXPECT_TRUE(a.grads == b.grads);
  const Out c = f.run_cuda(0, true);  // recompute without chunks: the same values as the training forward
  EXPECT_TRUE(a.dx == c.dx);
  EXPECT_TRUE(a.grads == c.grads);
}

TEST(CudaBlock, ChunkedMlpMatchesUnchunkedAndTheCpuBlock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CPU twin is tests/model/block_test.cpp";
  Fixture f;
  const Out cpu = f.run_cpu();
  const Out whole = f.run_cuda(0, false);
  f.expect_close(whole, cpu, 5e-2, "cuda unchunked vs cpu");
  for (const auto& [chunk, recompute] :
       {std::pair<int64_t, bool>{64, true}, std::pair<int64_t, bool>{80, false}, std::pair<int64_t, bool>{80, true}}) {
    const Out o = f.run_cuda(chunk, recompute);
    const std::string tag = "chunk " + std::to_string(chunk) + (recompute ? " recompute" : "");
    f.expect_close(o, whole, 1e-2, tag + " vs cuda unchunked");
    f.expect_close(o, cpu, 5e-2, tag + " vs cpu");
  }
}

// --fp8-scaling tensor: the amaxes the norms and the SwiGLU kernels make as
// they write xn, hn, a and the gate's and up's output gradients
// (CudaOps::amax_tap) are those of the amax passes, so every output and
// gradient has the same bits with and without them: unchunked, recomputed,
// and with MLP chunks (the chunk's recompute taps a; hn's tap then goes
// unused, the chunks being narrower than hn).
TEST(CudaBlock, Fp8TensorFusedAmaxIsBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CPU twin is tests/model/block_test.cpp";
  std::string why;
  if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8_tensor, &why)) GTEST_SKIP() << why;
  Fixture f;
  const Out bf = f.run_cuda(0, false);
  for (const auto& [chunk, recompute] : {std::pair<int64_t, bool>{0, false}, std::pair<int64_t, bool>{0, true},
                                         std::pair<int64_t, bool>{64, true}, std::pair<int64_t, bool>{80, false}}) {
    const std::string tag = "chunk " + std::to_string(chunk) + (recompute ? " recompute" : "");
    const Out passes = f.run_cuda(chunk, recompute, rt::MatmulMode::fp8_tensor, false);
    const Out fused = f.run_cuda(chunk, recompute, rt::MatmulMode::fp8_tensor, true);
    EXPECT_TRUE(fused.y == passes.y) << tag;
    EXPECT_TRUE(fused.dx == passes.dx) << tag;
    EXPECT_TRUE(fused.grads == passes.grads) << tag;
    // and FP8 at all: not bf16's bits, yet within per-tensor quantization noise of them (e4m3's
    // 2^-4 relative step; engine_test measured 0.07-0.22 rel_l2 over 4 layers; garbage is O(1))
    EXPECT_FALSE(fused.grads == bf.grads) << tag;
    f.expect_close(fused, bf, 0.3, tag + " fp8 tensor vs bf16");
  }
}

TEST(CudaBlock, Olmo2PostNormsMatchTheCpuBlock) {
  // The OLMo2 block (no pre-norms; each branch's output normed before its
  // residual add; the recompute runs the MLP's down projection for its norm):
  // the same bounds as the Qwen2 block above, and the recompute equals the
  // training forward bit for bit.
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CPU twin is tests/model/block_test.cpp";
  Fixture f(olmo2_spec());
  const Out cpu = f.run_cpu();
  const Out whole = f.run_cuda(0, false);
  f.expect_close(whole, cpu, 5e-2, "olmo2 cuda unchunked vs cpu");
  const Out again = f.run_cuda(0, true);
  EXPECT_TRUE(whole.dx == again.dx);
  EXPECT_TRUE(whole.grads == again.grads);
  const Out chunked = f.run_cuda(64, true);
  f.expect_close(chunked, whole, 1e-2, "olmo2 chunk 64 recompute vs cuda unchunked");
  f.expect_close(chunked, cpu, 5e-2, "olmo2 chunk 64 recompute vs cpu");
}

}  // namespace

#else

TEST(CudaBlock, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device: built without the CUDA backend (RAMTRAIN_CUDA=OFF)";
}

#endif
