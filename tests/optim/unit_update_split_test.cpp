// The optimizer over a split-master HostState (state/host_state.h) against the
// same over fp32 storage: masters, moments and bf16 shadows bit for bit after
// several steps, with chunks cutting tensors and tie words anywhere (the CUDA
// engine's update_unit_range), in place (one shadow) and in the delayed-update
// layout (two shadows, step t writes t % 2 from the other), including a
// skipped step (the shadow copied, the remainder untouched).
#include "optim/unit_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "testutil.h"

namespace {

rt::ModelSpec spec() { return rt::test::llama_spec(64, 172, 2, 4, 2, 16, 258, /*qkv_bias=*/true); }

using rt::test::all_masters;

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0; }

void run_twin(int shadows, int steps, int skipped_step) {
  rt::HostState ref(spec(), false), sp(spec(), false);
  ref.init_random(11);
  sp.init_random(11);
  sp.set_master_storage(rt::MasterStorage::split, shadows);
  rt::OptimStep o;
  o.lr = 3e-2;  // large steps: many masters cross bf16 rounding boundaries and ties
  o.weight_decay = 0.1;
  std::vector<std::vector<uint16_t>> ref_shadow;
  for (auto& u : ref.units()) ref_shadow.emplace_back(static_cast<size_t>(u.numel), 0);
  for (int t = 1, applied = 0; t <= steps; ++t) {
    const int dst = shadows == 2 ? t % 2 : 0;
    for (size_t i = 0; i < ref.units().size(); ++i) {
      rt::StateUnit& a = ref.units()[i];
      rt::StateUnit& b = sp.units()[i];
      if (t == skipped_step) {  // as the CUDA engine's optimizer phase does
        if (shadows == 2) std::memcpy(b.shadow(dst), b.shadow(1 - dst), static_cast<size_t>(b.numel) * 2);
        b.cur_shadow = dst;
        continue;
      }
      o.t = applied + 1;
      std::vector<float> g(static_cast<size_t>(a.numel));
      for (int64_t k = 0; k < a.numel; ++k)
        g[static_cast<size_t>(k)] = std::sin(0.37 * double(k) + 1.3 * t + double(i));
      rt::update_unit(a, g.data(), o, 0.75f, ref_shadow[i].data());
      // uneven chunks: 5 elements, then growing by 77 (never a multiple of 64)
      int64_t lo = 0, len = 5;
      const uint16_t* prev = shadows == 2 ? b.shadow(1 - dst) : nullptr;
      while (lo < b.numel) {
        const int64_t hi = std::min(b.numel, lo + len);
        rt::update_unit_range(b, lo, hi, g.data() + lo, o, 0.75f, b.shadow(dst), prev);
        lo = hi;
        len += 77;
      }
      EXPECT_EQ(b.cur_shadow, dst);
    }
    if (t != skipped_step) ++applied;
    const std::vector<float> wa = all_masters(ref), wb = all_masters(sp);
    ASSERT_TRUE(same_bits(wa.data(), wb.data(), static_cast<int64_t>(wa.size()))) << "masters differ after step " << t;
    for (size_t i = 0; i < ref.units().size(); ++i) {
      const rt::StateUnit& a = ref.units()[i];
      const rt::StateUnit& b = sp.units()[i];
      ASSERT_TRUE(same_bits(a.m(), b.m(), 2 * a.numel)) << a.name << " moments differ after step " << t;
      // the current shadow is what fp32 storage's update writes (padding aside: entries only)
      for (size_t k = 0; k < a.entries.size(); ++k)
        ASSERT_EQ(0, std::memcmp(ref_shadow[i].data() + a.offsets[k], b.shadow(b.cur_shadow) + a.offsets[k],
                                 static_cast<size_t>(a.entries[k].numel()) * 2))
            << a.entries[k].name << " shadow after step " << t;
    }
  }
}

TEST(UpdateUnitSplit, InPlaceEqualsFp32BitForBit) { run_twin(1, 4, -1); }
TEST(UpdateUnitSplit, DelayedTwoShadowsEqualFp32BitForBit) { run_twin(2, 5, 3); }

TEST(UpdateUnitSplit, WrongShadowsAreRefused) {
  rt::HostState st(spec(), false);
  st.set_master_storage(rt::MasterStorage::split, 2);
  rt::StateUnit& u = st.units()[1];
  std::vector<float> g(static_cast<size_t>(u.numel), 0.f);
  std::vector<uint16_t> foreign(static_cast<size_t>(u.numel));
  rt::OptimStep o;
  o.t = 1;
  EXPECT_THROW(rt::update_unit(u, g.data(), o, 1.f, foreign.data()), rt::Error);
  EXPECT_THROW(rt::update_unit(u, g.data(), o, 1.f, u.shadow(1)), rt::Error);  // in place, but not the current
  EXPECT_THROW(rt::update_unit(u, g.data(), o, 1.f, u.shadow(1), u.shadow(1)), rt::Error);
  rt::HostState fp(spec(), false);
  EXPECT_THROW(rt::update_unit(fp.units()[1], g.data(), o, 1.f, nullptr, u.shadow(0)), rt::Error);
}

}  // namespace
