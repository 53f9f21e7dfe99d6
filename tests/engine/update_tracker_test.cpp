// UpdateTracker (the streaming engine's handshake with its optimizer worker)
// and the update order, on the CPU: waiters wake when the worker marks the
// unit, chunk progress is visible before the unit is done, a failed job wakes
// every waiter with its error, and delayed versions trail by one step.
#include "engine/update_tracker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "engine/update_order.h"

TEST(UpdateTracker, WaiterWakesWhenTheWorkerMarksTheUnit) {
  rt::UpdateTracker t(3, false);
  t.next_step();  // step 1: loads need version 1
  EXPECT_FALSE(t.is_updated(1, t.need_version()));
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    t.wait_updated(1, 1);
    woke = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(woke.load());
  t.push([&] { t.mark_updated(1, 1); });
  waiter.join();
  EXPECT_TRUE(woke.load());
  EXPECT_TRUE(t.is_updated(1, 1));
  EXPECT_FALSE(t.is_updated(2, 1));
}

TEST(UpdateTracker, ChunkProgressIsReadyBeforeTheUnitIsDone) {
  rt::UpdateTracker t(2, false);
  t.mark_progress(0, 1, 40);
  EXPECT_EQ(t.wait_ready(0, 1, 100, 0), 40);
  t.mark_progress(0, 1, 80);
  EXPECT_EQ(t.wait_ready(0, 1, 100, 40), 80);
  t.mark_updated(0, 1);
  EXPECT_EQ(t.wait_ready(0, 1, 100, 80), 100);
  // progress of another step's update does not count
  t.mark_progress(0, 2, 10);
  EXPECT_EQ(t.wait_ready(0, 1, 100, 0), 100);
}

TEST(UpdateTracker, AFailedJobWakesWaitersWithItsError) {
  rt::UpdateTracker t(2, false);
  std::thread waiter([&] { EXPECT_THROW(t.wait_updated(0, 1), std::runtime_error); });
  t.push([] { throw std::runtime_error("adamw failed"); });
  waiter.join();
}

TEST(UpdateTracker, DelayedVersionsTrailByOneStepUntilSync) {
  rt::UpdateTracker plain(1, false), delayed(1, true);
  for (int s = 0; s < 3; ++s) {
    plain.next_step();
    delayed.next_step();
  }
  EXPECT_EQ(plain.need_version(), 3);
  EXPECT_EQ(delayed.need_version(), 2);
  delayed.synced();
  EXPECT_EQ(delayed.need_version(), 3);
}

TEST(UpdateOrder, ForwardOrDelayedHeadEmbeddingThenLayersBackward) {
  EXPECT_EQ(rt::update_order(5, false), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rt::update_order(5, true), (std::vector<size_t>{4, 0, 3, 2, 1}));
  const std::vector<rt::GradChunk> c = rt::grad_chunks({5, 8}, {1, 0}, 4);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].u, 1u);
  EXPECT_EQ(c[0].b, 0);
  EXPECT_EQ(c[1].e, 8);
  EXPECT_EQ(c[2].u, 0u);
  EXPECT_EQ(c[3].b, 4);
  EXPECT_EQ(c[3].e, 5);
}
