// LoopbackWorld (dist/loopback.h): the collectives' results against serial
// loops over ranks written out here (sums in rank order, so bit-identical),
// for worlds of 1 to 4; a rank's failure stops the others with the first
// error; mismatched calls are refused.
#include <gtest/gtest.h>

#include <mutex>

#include "core/error.h"
#include "dist/loopback.h"
#include "testutil.h"

namespace {

std::vector<float> rank_data(int r, int64_t n) { return rt::test::random_vec(n, 100 + static_cast<uint64_t>(r)); }

TEST(Loopback, ReduceScatterSumsInRankOrder) {
  for (int world : {1, 2, 3, 4}) {
    const int64_t count = 37;
    std::vector<std::vector<float>> out(static_cast<size_t>(world));
    rt::LoopbackWorld w(world);
    w.run([&](rt::Collective& c) {
      EXPECT_EQ(c.world(), world);
      std::vector<float> in = rank_data(c.rank(), world * count), o(count);
      c.reduce_scatter_sum(in.data(), o.data(), count);
      out[static_cast<size_t>(c.rank())] = o;
    });
    for (int r = 0; r < world; ++r) {
      std::vector<float> want(count, 0.0f);
      for (int q = 0; q < world; ++q) {
        const std::vector<float> in = rank_data(q, world * count);
        for (int64_t i = 0; i < count; ++i) want[i] += in[r * count + i];
      }
      EXPECT_TRUE(out[static_cast<size_t>(r)] == want) << "world " << world << " rank " << r;
    }
  }
}

TEST(Loopback, AllGatherAndAllReduce) {
  const int world = 3;
  const int64_t count = 5;
  rt::LoopbackWorld w(world);
  std::mutex mu;
  std::vector<std::vector<float>> gf(world);
  std::vector<std::vector<uint16_t>> gh(world);
  std::vector<std::vector<double>> red(world);
  w.run([&](rt::Collective& c) {
    const int r = c.rank();
    std::vector<float> f(count), fo(world * count);
    std::vector<uint16_t> h(count), ho(world * count);
    for (int64_t i = 0; i < count; ++i) {
      f[i] = static_cast<float>(r * 10 + i);
      h[i] = static_cast<uint16_t>(1000 * r + i);
    }
    c.all_gather(f.data(), fo.data(), count);
    c.all_gather(h.data(), ho.data(), count);
    std::vector<double> d{0.1 * (r + 1), 1e16, -1e16 + r};
    c.all_reduce_sum(d.data(), 3);
    c.barrier();
    std::lock_guard<std::mutex> g(mu);
    gf[r] = fo;
    gh[r] = ho;
    red[r] = d;
  });
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q)
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_EQ(gf[r][q * count + i], static_cast<float>(q * 10 + i));
        EXPECT_EQ(gh[r][q * count + i], 1000 * q + i);
      }
    double s0 = 0, s1 = 0, s2 = 0;  // rank order
    for (int q = 0; q < world; ++q) {
      s0 += 0.1 * (q + 1);
      s1 += 1e16;
      s2 += -1e16 + q;
    }
    EXPECT_EQ(red[r], (std::vector<double>{s0, s1, s2})) << "rank " << r;
  }
}

TEST(Loopback, AFailingRankStopsTheWorldWithItsError) {
  rt::LoopbackWorld w(3);
  rt::test::expect_error(
      [&] {
        w.run([&](rt::Collective& c) {
          if (c.rank() == 1) rt::fail("[test] rank one broke");
          c.barrier();  // the others would wait forever without the abort
          c.barrier();
        });
      },
      {"rank one broke"});
  // the world is usable again afterwards
  int calls = 0;
  std::mutex mu;
  w.run([&](rt::Collective& c) {
    c.barrier();
    std::lock_guard<std::mutex> g(mu);
    ++calls;
  });
  EXPECT_EQ(calls, 3);
}

TEST(Loopback, MismatchedCallsAreRefused) {
  rt::LoopbackWorld w(2);
  rt::test::expect_error(
      [&] {
        w.run([&](rt::Collective& c) {
          std::vector<float> in(8), out(8);
          c.all_gather(in.data(), out.data(), c.rank() == 0 ? 4 : 3);
        });
      },
      {"collective mismatch", "all_gather(fp32) with 4 elements", "every rank must make the same calls"});
  EXPECT_THROW(rt::LoopbackWorld(0), rt::Error);
}

}  // namespace
