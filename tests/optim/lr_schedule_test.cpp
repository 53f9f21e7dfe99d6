// Tests for optim/lr_schedule: warm-up endpoints, cosine and linear decay against
// their closed forms, the floor after total_steps, constant, and validation.
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace rt {
namespace {

LrSchedule make(LrSchedule::Kind kind, double peak, int64_t warmup, int64_t total, double ratio = 0.1) {
  LrSchedule s;
  s.kind = kind;
  s.peak = peak;
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.min_lr_ratio = ratio;
  return s;
}

// Values are a handful of double ops: compare to the closed form within a few
// double ulps (1e-15 relative).
constexpr double kRel = 1e-15;

TEST(LrSchedule, WarmupEndpoints) {
  const auto s = make(LrSchedule::Kind::cosine, 3e-4, 100, 1000);
  EXPECT_NEAR(s.at(1), 3e-4 / 100, 3e-6 * kRel);
  EXPECT_NEAR(s.at(50), 3e-4 * 0.5, 3e-4 * kRel);
  EXPECT_EQ(s.at(100), 3e-4);  // peak * 100 / 100 is exact
}

TEST(LrSchedule, CosineMidAndEnd) {
  const double peak = 1e-3, floor = 1e-4;
  const auto s = make(LrSchedule::Kind::cosine, peak, 100, 1100);
  // Half-way through the decay (step 600), cos(pi/2) = 0: the mean of peak and floor.
  EXPECT_NEAR(s.at(600), 0.5 * (peak + floor), peak * kRel);
  // A quarter of the way: floor + (peak - floor) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(s.at(350), floor + (peak - floor) * 0.5 * (1 + std::sqrt(0.5)), peak * kRel);
  EXPECT_NEAR(s.at(101), floor + (peak - floor) * 0.5 * (1 + std::cos(std::numbers::pi / 1000)), peak * kRel);
  EXPECT_NEAR(s.at(1100), floor, peak * kRel);
  EXPECT_NEAR(s.at(5000), floor, peak * kRel);  // clamped after total_steps
  // Monotone non-increasing over the decay.
  for (int64_t t = 101; t <= 1100; ++t) ASSERT_LE(s.at(t), s.at(t - 1)) << t;
}

TEST(LrSchedule, LinearDecay) {
  const auto s = make(LrSchedule::Kind::linear, 2e-3, 10, 110, 0.25);
  EXPECT_EQ(s.at(10), 2e-3);
  EXPECT_NEAR(s.at(60), 0.5e-3 + 1.5e-3 * 0.5, 2e-3 * kRel);
  EXPECT_NEAR(s.at(110), 0.5e-3, 2e-3 * kRel);
  EXPECT_NEAR(s.at(200), 0.5e-3, 2e-3 * kRel);
}

TEST(LrSchedule, ConstantAndNoWarmup) {
  const auto c = make(LrSchedule::Kind::constant, 5e-4, 4, 10);
  EXPECT_NEAR(c.at(1), 5e-4 / 4, 5e-4 * kRel);
  EXPECT_EQ(c.at(4), 5e-4);
  EXPECT_EQ(c.at(5), 5e-4);
  EXPECT_EQ(c.at(1000), 5e-4);
  const auto nw = make(LrSchedule::Kind::cosine, 1e-3, 0, 10, 0.0);
  EXPECT_NEAR(nw.at(1), 1e-3 * 0.5 * (1 + std::cos(std::numbers::pi / 10)), 1e-3 * kRel);
  EXPECT_NEAR(nw.at(10), 0.0, 1e-3 * kRel);
  // Warm-up as long as the run: peak at the last step, then the floor.
  const auto full = make(LrSchedule::Kind::cosine, 1e-3, 10, 10);
  EXPECT_EQ(full.at(10), 1e-3);
  EXPECT_NEAR(full.at(11), 1e-4, 1e-3 * kRel);
}

TEST(LrSchedule, Validation) {
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 0.0, 0, 10).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, -1e-3, 0, 10).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, NAN, 0, 10).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 1e-3, 11, 10).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 1e-3, -1, 10).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 1e-3, 0, 0).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 1e-3, 0, 10, 1.5).at(1), Error);
  EXPECT_THROW(make(LrSchedule::Kind::cosine, 1e-3, 0, 10).at(0), Error);
  try {
    make(LrSchedule::Kind::cosine, 1e-3, 20, 10).validate();
    FAIL() << "expected rt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[lr_schedule]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("warmup_steps"), std::string::npos) << e.what();
  }
}

TEST(LrSchedule, KindNames) {
  EXPECT_EQ(lr_schedule_kind_parse("cosine"), LrSchedule::Kind::cosine);
  EXPECT_EQ(lr_schedule_kind_parse("linear"), LrSchedule::Kind::linear);
  EXPECT_EQ(lr_schedule_kind_parse("constant"), LrSchedule::Kind::constant);
  EXPECT_STREQ(lr_schedule_kind_name(LrSchedule::Kind::linear), "linear");
  EXPECT_THROW(lr_schedule_kind_parse("step"), Error);
}

}  // namespace
}  // namespace rt
