#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>

#include "core/error.h"

TEST(ThreadPool, RunsEveryTaskOnce) {
  rt::ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  pool.run(1000, [&](int64_t t) { hits[t]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, FixedBlockReductionIsIdenticalForAnyThreadCount) {
  std::vector<float> x(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / static_cast<float>(i + 1);
  auto reduce = [&](int threads) {
    rt::ThreadPool pool(threads);
    const int64_t grain = 1000, n_tasks = 100;
    std::vector<float> part(n_tasks, 0.f);
    pool.run(n_tasks, [&](int64_t t) {
      for (int64_t i = t * grain; i < (t + 1) * grain; ++i) part[t] += x[i];
    });
    float s = 0;
    for (float p : part) s += p;
    return s;
  };
  float a = reduce(1), b = reduce(3), c = reduce(8);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
}

TEST(ThreadPool, PropagatesExceptions) {
  rt::ThreadPool pool(3);
  EXPECT_THROW(pool.run(50,
                        [](int64_t t) {
                          if (t == 17) rt::fail("[test] boom");
                        }),
               rt::Error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  pool.run(10, [&](int64_t) { n++; });
  EXPECT_EQ(n.load(), 10);
}
