// The host-gradient landing in pieces (engine/cuda/gradient_sink.h): with
// --grads host or fold the pinned slabs hold the largest layer, and a larger
// unit (the LM head, a tied embedding) lands in slab-sized pieces; fold
// clips such a unit with its sum of squares taken on the device in
// rt::sum_squares's order. Skips (with a message) without a CUDA device.
//  - the device's ordered sum of squares (cuda_ops.h sum_squares_ordered)
//    is rt::sum_squares's double, bit for bit, over sizes around its blocks;
//  - training with the head in pieces (the default slab, on a model whose
//    head is larger than a layer) and with every unit in pieces (a 64 KiB
//    slab, CudaOptions::landing_slab_bytes, the test-only option) gives the
//    losses, gradient norms and final state (master, moments, shadow) of the
//    whole-unit landing (a slab of the largest unit, the landing before
//    issue 31) bit for bit: fold (every step clipped, so the device sum must
//    equal the CPU's; one micro-batch, and layer-major K = 2), host (global
//    clipping; micro-batch-major K = 2, so pieces are added into the arenas),
//    untied and tied embeddings (a tied table lands from the device in
//    pieces; tied: one micro-batch, or host micro-batch-major), fp32 and
//    8-bit moments;
//  - the device plan counts what the engine allocates with pieces in fold
//    (the device sum's block sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/device_plan.h"
#include "optim/adamw.h"
#include "state/host_state.h"
#include "testutil.h"
#ifdef RAMTRAIN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/sum_squares_order.h"
#include "engine/cuda/engine_device.h"
#endif

namespace {

bool have_gpu() { return rt::cuda_backend_available(); }

// 3 layers of width 256 (590,336 elements each); vocab 4096: the head unit
// (4096 x 256 + the final norm, 1,048,832 elements) is larger than a layer,
// so the default slab (the largest layer, rounded up to 16384) lands it in 2
// pieces. Byte data (ids < 258).
rt::ModelSpec landing_spec(bool tied) {
  rt::ModelSpec s = rt::test::llama_spec(256, 512, 3, 4, 2, 64, 4096);
  s.rms_eps = 1e-5;
  s.max_positions = 512;
  s.tie_embeddings = tied;
  return s;
}

struct LandingRun {
  std::vector<double> loss, norm;
  std::vector<uint8_t> state;
  uint64_t peak = 0, planned = 0;
};

// Three steps on fixed batches (K micro-batches of B x T), lr 1e-3, clip
// max_norm; the slab as given (bytes; 0: the default).
LandingRun train(const rt::ModelSpec& s, const char* grads, int64_t K, rt::MomentStorage mo, uint64_t slab_bytes,
                 double clip) {
  const int64_t B = 2, T = 128;
  rt::DatasetOptions dopt;
  dopt.seq_len = T;
  dopt.seed = 4;
  rt::Dataset d(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), dopt);
  std::vector<rt::Batch> batches;
  int64_t nv = 0;
  for (int64_t k = 0; k < K; ++k) {
    batches.push_back(d.next_batch(B));
    nv += static_cast<int64_t>(batches.back().targets.size());
  }
  rt::HostState st(s, false, mo);
  st.init_random(9, 0.05f);
  rt::CudaOptions co;
  co.slots = 2;
  co.grads = grads;
  co.micro_batches = K;
  co.layer_major = std::string(grads) == "fold" && K > 1 ? "on" : "off";
  co.landing_slab_bytes = slab_bytes;
  co.max_gpu_memory = 1ull << 30;
  co.fit = false;
  co.verbose = false;
  auto gpu = rt::make_cuda_backend(st, B, T, co);
  LandingRun r;
  r.peak = gpu->stats().device_peak_bytes;  // nothing is allocated after the engine is built
#ifdef RAMTRAIN_HAVE_CUDA
  rt::CudaOptions po = co;
  po.muon = false;
  r.planned = rt::plan_device(s, B, T, po, co.max_gpu_memory, rt::cuda::op_scratch_bytes).total;
#endif
  rt::OptimStep o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  o.clip = clip;
  for (int i = 0; i < 3; ++i) {
    o.t = i + 1;
    const rt::StepStats x = gpu->train_step(batches, nv, o);
    r.loss.push_back(x.loss_sum);
    r.norm.push_back(x.grad_norm);
  }
  gpu->sync();
  r.state = rt::test::state_bytes(st, /*with_split_and_shadow=*/true);
  return r;
}

}  // namespace

TEST(CudaGradientLanding, TheDeviceSumOfSquaresIsTheCpusDouble) {
  // sum_squares_ordered against rt::sum_squares: sizes below, at and across
  // its 16384-element blocks and its finish kernel's 2048-block chunks;
  // values spread over many binades so any change of order shows.
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
#ifdef RAMTRAIN_HAVE_CUDA
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16383}, int64_t{16384}, int64_t{16385}, int64_t{3 * 16384 + 7},
                    int64_t{2049 * 16384 + 5}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    float* dx = nullptr;
    double* dd = nullptr;
    const uint64_t doubles = rt::cuda::sum_squares_ordered_doubles(n);
    CUDA_CHECK(cudaMalloc(&dx, x.size() * 4));
    CUDA_CHECK(cudaMalloc(&dd, doubles * 8));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    rt::cuda::sum_squares_ordered(dd + doubles - 2, dx, n, dd, 0.0, nullptr);
    double got = 0;
    CUDA_CHECK(cudaMemcpy(&got, dd + doubles - 2, 8, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dd));
    EXPECT_EQ(got, rt::sum_squares(x.data(), n)) << "n = " << n;
  }
#endif
}

TEST(CudaGradientLanding, PiecesTrainBitIdenticallyToWholeUnits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  const uint64_t whole = 1ull << 40;  // clamped to the largest unit: every unit lands whole
  const double clip = 1e-3;           // every step clips: fold's coefficients depend on each sum's last bit
  struct Mode {
    const char* grads;
    int64_t K;
  };
  for (bool tied : {false, true})
    for (const Mode& m : {Mode{"fold", 1}, Mode{"fold", 2}, Mode{"host", 2}})
      for (rt::MomentStorage mo : {rt::MomentStorage::fp32, rt::MomentStorage::q8}) {
        // layer-major with a tied table is on only when asked (equal to micro-batch-major only up to rounding)
        // and no other GPU test runs it: not this test's business
        if (tied && m.K > 1 && std::string(m.grads) == "fold") continue;
        const rt::ModelSpec s = landing_spec(tied);
        const std::string what = std::string(m.grads) + " K " + std::to_string(m.K) + (tied ? " tied " : " untied ") +
                                 rt::moment_storage_name(mo);
        SCOPED_TRACE(what);
        rt::CudaOptions co;
        co.landing_slab_bytes = 0;
        rt::DevicePlacement p;
        p.host_grads = true;
        p.host_embed = !tied;
        p.fold = std::string(m.grads) == "fold";
        // the default slab splits the head (tied: the embedding) and only it
        const size_t lm = tied ? 0 : static_cast<size_t>(s.n_layers + 1);
        ASSERT_EQ(rt::gradient_landing_split_units(s, p, co), std::vector<size_t>{lm});
        const LandingRun a = train(s, m.grads, m.K, mo, whole, clip);
        const LandingRun b = train(s, m.grads, m.K, mo, 0, clip);
        const LandingRun c = train(s, m.grads, m.K, mo, 64 << 10, clip);
        std::printf("[landing] %s: norms %.9g %.9g %.9g, losses %.9g %.9g %.9g\n", what.c_str(), a.norm[0], a.norm[1],
                    a.norm[2], a.loss[0], a.loss[1], a.loss[2]);
        ASSERT_GT(a.norm[0], 10 * clip);  // the steps do clip
        for (const LandingRun* r : {&b, &c}) {
          const char* slab = r == &b ? "default slab (the head in pieces)" : "64 KiB slab (every unit in pieces)";
          EXPECT_EQ(r->loss, a.loss) << slab;
          EXPECT_EQ(r->norm, a.norm) << slab;
          EXPECT_TRUE(r->state == a.state) << slab << ": the final state differs";
          EXPECT_EQ(r->peak, r->planned) << slab << ": the plan counts what the engine allocates";
        }
        EXPECT_EQ(a.peak, a.planned);
      }
}
