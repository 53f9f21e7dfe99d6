// NcclCollective (dist/nccl_collective.h) on real GPUs, for the GPU machine
// (tests/gpu/run.sh part "nccl"):
//  - a world of one on GPU 0 (the 1-GPU kind): every collective is the
//    identity, the id exchange needs no store;
//  - a world of every visible GPU (2 or more; skipped otherwise): one thread
//    per rank joins through the TCP store on 127.0.0.1 and the results equal
//    the host's sums. The inputs are small integers, so every sum is exact
//    in any order: compared bit for bit.
// NCCL_NVLS_ENABLE must read 0 afterwards. Without NCCL at build time this
// file holds one test that skips.
#include <gtest/gtest.h>

#ifdef RAMTRAIN_HAVE_NCCL

#include <cuda_runtime.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "dist/nccl_collective.h"
#include "dist/tcp_store.h"

namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 997); }

// Rank c.rank()'s side of the checks, on its own GPU.
void check_rank(rt::Collective& c, int64_t count) {
  const int W = c.world(), r = c.rank();
  std::vector<float> in(static_cast<size_t>(W * count));
  for (int64_t i = 0; i < W * count; ++i) in[i] = value(r, i);
  float* din = to_device(in);
  float* dout = to_device(std::vector<float>(static_cast<size_t>(count)));
  c.reduce_scatter_sum(din, dout, count);
  float* dg = to_device(std::vector<float>(static_cast<size_t>(W * count)));
  c.all_gather(dout, dg, count);
  std::vector<uint16_t> h16(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) h16[i] = static_cast<uint16_t>(r * 100 + i % 100);
  uint16_t* d16 = to_device(h16);
  uint16_t* dg16 = to_device(std::vector<uint16_t>(static_cast<size_t>(W * count)));
  c.all_gather(d16, dg16, count);
  std::vector<double> d{1.0 + r, 0.5};
  c.all_reduce_sum(d.data(), 2);
  c.barrier();  // waits for everything enqueued before it
  const std::vector<float> got = to_host(dg, static_cast<size_t>(W * count));
  for (int q = 0; q < W; ++q)
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int s = 0; s < W; ++s) want += value(s, q * count + i);
      ASSERT_EQ(got[q * count + i], want) << "rank " << r << " chunk " << q << " element " << i;
    }
  const std::vector<uint16_t> g16 = to_host(dg16, static_cast<size_t>(W * count));
  for (int q = 0; q < W; ++q)
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(g16[q * count + i], q * 100 + i % 100);
  EXPECT_EQ(d[0], W * (W + 1) / 2.0);
  EXPECT_EQ(d[1], 0.5 * W);
  for (void* p : {static_cast<void*>(din), static_cast<void*>(dout), static_cast<void*>(dg), static_cast<void*>(d16),
                  static_cast<void*>(dg16)})
    cudaFree(p);
}

TEST(Nccl, WorldOfOneIsTheIdentity) {
  if (device_count() < 1) GTEST_SKIP() << "no CUDA device";
  rt::LaunchConfig c;  // rank 0 of 1
  auto coll = rt::make_nccl_collective(c, 30);
  ASSERT_EQ(coll->world(), 1);
  check_rank(*coll, 4099);
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
}

TEST(Nccl, EveryVisibleGpuThroughTheTcpStore) {
  const int W = device_count();
  if (W < 2) GTEST_SKIP() << "needs 2 or more GPUs, " << W << " visible";
  int port = 0;
  {
    rt::TcpStoreServer probe("127.0.0.1", 0);
    port = probe.port();
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < W; ++r)
    ranks.emplace_back([=] {
      rt::LaunchConfig c;
      c.rank = c.local_rank = r;
      c.world = W;
      c.master_addr = "127.0.0.1";
      c.master_port = port;
      auto coll = rt::make_nccl_collective(c, 60);
      check_rank(*coll, 3 * 4096 + 5);
    });
  for (auto& t : ranks) t.join();
}

}  // namespace

#else  // !RAMTRAIN_HAVE_NCCL

TEST(Nccl, SkippedWithoutNccl) { GTEST_SKIP() << "built without NCCL (a CPU build, or CUDA without nccl.h/libnccl)"; }

#endif
