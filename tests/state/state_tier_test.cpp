// The state tier's layout (state/state_tier.h): what `ramtrain plan` computes
// from a spec (tier_unit_bytes_planned) is what a live state holds
// (tier_unit_bytes), unit by unit, for every storage combination; the tier an
// engine attaches follows its plan (the file's size, the resident bytes left
// in RAM, which units page); and tier_place keeps its budget and its minimum.
#include "state/state_tier.h"

#include <gtest/gtest.h>

#include "core/fs.h"
#include "testutil.h"

namespace {

struct Case {
  rt::MasterStorage master;
  int shadows;  // a shadow master's (1 or 2)
  rt::MomentStorage moments;
  rt::UpdateRule rule;
  bool grads;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  using MS = rt::MasterStorage;
  using MO = rt::MomentStorage;
  for (MS ms : {MS::fp32, MS::split, MS::bf16_sr, MS::bf16_kahan})
    for (MO mo : {MO::fp32, MO::q8, MO::q4})
      for (rt::UpdateRule r : {rt::UpdateRule::adamw, rt::UpdateRule::muon})
        for (bool g : {false, true}) c.push_back({ms, 1, mo, r, g});
  c.push_back({MS::split, 2, MO::fp32, rt::UpdateRule::adamw, false});  // delayed update's two shadows
  c.push_back({MS::split, 2, MO::q8, rt::UpdateRule::adamw, true});
  return c;
}

std::vector<rt::ModelSpec> specs() {
  rt::ModelSpec tied = rt::test::llama_spec(48, 80, 2, 4, 2, 12, 301, true);  // odd vocab: a tensor off 16 and 256
  tied.tie_embeddings = true;
  return {rt::test::tiny_spec(), rt::test::llama_spec(64, 172, 3, 4, 2, 16, 258), tied};
}

std::string label(const Case& c) {
  return rt::cat(rt::master_storage_name(c.master), "x", c.shadows, " ", rt::optimizer_name(c.rule, c.moments),
                 c.grads ? " grads" : "");
}

TEST(StateTierLayout, PlanEqualsTheLiveStateUnitByUnit) {
  for (const rt::ModelSpec& s : specs())
    for (const Case& c : cases()) {
      SCOPED_TRACE(label(c));
      rt::HostState st(s, c.grads, c.moments, c.master, c.rule);
      if (c.shadows == 2) st.set_master_storage(c.master, 2);
      const int shadows = c.master == rt::MasterStorage::fp32 ? 0 : c.shadows;
      const auto planned = rt::tier_unit_bytes_planned(s, c.master, shadows, c.grads, c.moments, c.rule);
      const auto live = rt::tier_unit_bytes(st);
      ASSERT_EQ(planned.size(), live.size());
      for (size_t u = 0; u < live.size(); ++u) {
        EXPECT_EQ(planned[u].resident, live[u].resident) << "unit " << u;
        EXPECT_EQ(planned[u].paged, live[u].paged) << "unit " << u;
      }
      // and the resident + paged bytes are the state's (each paged buffer rounded up to 4 KiB at most)
      uint64_t res = 0, paged = 0;
      for (auto& b : live) res += b.resident, paged += b.paged;
      EXPECT_GE(res + paged, st.bytes_total());
      EXPECT_LE(res + paged, st.bytes_total() + 5 * rt::kDirectAlign * live.size());
    }
}

TEST(StateTierLayout, AttachedTierFollowsItsPlan) {
  const rt::ModelSpec s = rt::test::llama_spec(64, 172, 3, 4, 2, 16, 258);
  for (const Case& c : {Case{rt::MasterStorage::fp32, 1, rt::MomentStorage::fp32, rt::UpdateRule::adamw, true},
                        Case{rt::MasterStorage::split, 1, rt::MomentStorage::q4, rt::UpdateRule::adamw, false},
                        Case{rt::MasterStorage::bf16_kahan, 1, rt::MomentStorage::q8, rt::UpdateRule::muon, true}}) {
    SCOPED_TRACE(label(c));
    const int shadows = c.master == rt::MasterStorage::fp32 ? 0 : c.shadows;
    const auto planned = rt::tier_unit_bytes_planned(s, c.master, shadows, c.grads, c.moments, c.rule);
    const rt::TierPlan all = rt::tier_place(planned, 0);
    for (uint64_t budget : {uint64_t(0), all.min_bytes, all.min_bytes + planned[1].paged, all.ram() + all.file_bytes}) {
      rt::test::TempDir tmp;
      const rt::TierPlan want = rt::tier_place(planned, budget);
      rt::HostState st(s, c.grads, c.moments, c.master, c.rule);
      rt::StateTier t(st, {tmp.path(), budget});
      EXPECT_TRUE(t.plan() == want) << "budget " << budget;
      EXPECT_EQ(rt::file_size(t.path()), want.file_bytes);
      // RAM now: the resident bytes and the kept units' state; nothing of the paged units
      uint64_t res = 0;
      for (auto& b : rt::tier_unit_bytes(st)) res += b.resident;
      EXPECT_EQ(res, want.resident);
      for (size_t u = 0; u < st.units().size(); ++u) EXPECT_EQ(st.units()[u].paged_out, want.paged[u] != 0);
      if (budget) {
        EXPECT_LE(want.ram(), budget);
      }
      t.page_in_all();
    }
  }
}

TEST(StateTierLayout, PlaceKeepsBudgetAndMinimum) {
  const std::vector<rt::TierUnitBytes> u = {{10, 100}, {20, 300}, {20, 300}, {20, 300}, {5, 50}};
  const rt::TierPlan p0 = rt::tier_place(u, 0);  // every unit paged
  EXPECT_EQ(p0.resident, 75u);
  EXPECT_EQ(p0.min_bytes, 75u + 900u);  // the three largest in flight
  EXPECT_EQ(p0.n_paged(), 5);
  EXPECT_EQ(p0.file_bytes, 1050u);
  EXPECT_EQ(p0.slots, 900u);
  EXPECT_EQ(p0.traffic_per_step(), 2100u);
  EXPECT_FALSE(rt::tier_place(u, 974).fits);
  const rt::TierPlan p1 = rt::tier_place(u, 975 + 120);  // room for the first unit's state, not the last's too
  EXPECT_TRUE(p1.fits);
  EXPECT_EQ(p1.paged, (std::vector<char>{0, 1, 1, 1, 1}));
  EXPECT_EQ(p1.kept, 100u);
  EXPECT_EQ(p1.file_bytes, 950u);
  EXPECT_LE(p1.ram(), 975u + 120u);
  const rt::TierPlan p2 = rt::tier_place(u, 75 + 1050);  // everything fits: nothing paged
  EXPECT_EQ(p2.n_paged(), 0);
  EXPECT_EQ(p2.file_bytes, 0u);
  EXPECT_EQ(p2.ram(), 1125u);
}

}  // namespace
