#include "core/worker.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

TEST(Worker, RunsJobsInPushOrderOnOneThread) {
  std::vector<int> order;
  std::vector<std::thread::id> ids;
  {
    rt::Worker w;
    for (int i = 0; i < 100; ++i)
      w.push([&, i] {
        order.push_back(i);  // unsynchronised on purpose: one thread runs every job
        ids.push_back(std::this_thread::get_id());
      });
    w.drain();
    ASSERT_EQ(order.size(), 100u);
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  for (auto& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_NE(ids[0], std::this_thread::get_id());
}

TEST(Worker, DrainWaitsForTheRunningJob) {
  rt::Worker w;
  bool done = false;
  w.push([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
  });
  w.drain();
  EXPECT_TRUE(done);
}

TEST(Worker, AFailedJobSkipsTheRestAndRethrowsOnce) {
  rt::Worker w;
  int ran = 0;
  w.push([&] { ++ran; });
  w.push([] { throw std::runtime_error("job failed"); });
  w.push([&] { ++ran; });  // skipped: the queue stopped at the error
  EXPECT_THROW(w.drain(), std::runtime_error);
  EXPECT_EQ(ran, 1);
  EXPECT_NO_THROW(w.drain());  // reported once
  EXPECT_NO_THROW(w.rethrow_if_failed());
}

TEST(Worker, DestructorRunsWhatIsQueued) {
  int ran = 0;
  {
    rt::Worker w;
    for (int i = 0; i < 10; ++i) w.push([&] { ++ran; });
  }
  EXPECT_EQ(ran, 10);
}
