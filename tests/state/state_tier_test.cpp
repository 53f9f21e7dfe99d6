// The state tier's layout (state/state_tier.h): what `ramtrain plan` computes
// from a spec (tier_unit_bytes_planned) is what a live state holds
// (tier_unit_bytes), unit by unit, for every storage combination; the tier an
// engine attaches follows its plan (the file's size, the resident bytes left
// in RAM, which units page), with the weights paged too when the budget is
// below the minimum with them in RAM; and tier_place keeps its budget and its
// minimum.
#include <algorithm>
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
        EXPECT_EQ(planned[u].weights, live[u].weights) << "unit " << u;
        EXPECT_EQ(planned[u].weights_paged, live[u].weights_paged) << "unit " << u;
        EXPECT_GT(live[u].weights, 0u) << "unit " << u;
        EXPECT_LE(live[u].weights, live[u].resident) << "unit " << u;
        EXPECT_GE(live[u].weights_paged, live[u].weights) << "unit " << u;
      }
      // and the resident + paged bytes are the state's (each paged buffer rounded up to 4 KiB at most)
      uint64_t res = 0, paged = 0;
      for (auto& b : live) res += b.resident, paged += b.paged;
      EXPECT_GE(res + paged, st.bytes_total());
      EXPECT_LE(res + paged, st.bytes_total() + 5 * rt::kDirectAlign * live.size());
    }
}

TEST(StateTierLayout, AttachedTierFollowsItsPlan) {
  // six layers: the minimum with the weights paged leaves room to keep a whole unit below the one without
  const rt::ModelSpec s = rt::test::llama_spec(64, 172, 6, 4, 2, 16, 258);
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
    // below the minimum with the weights in RAM, an engine that pages them too: RAM keeps the gradients and
    // whole units (weights + state) in unit order; the paged units' weights are not in RAM either
    const uint64_t wmin = rt::tier_place(planned, all.min_bytes - 1, true).min_bytes;
    ASSERT_LT(wmin, all.min_bytes);
    for (uint64_t budget : {wmin, wmin + planned[0].paged + planned[0].weights_paged}) {
      rt::test::TempDir tmp;
      const rt::TierPlan want = rt::tier_place(planned, budget, true);
      ASSERT_TRUE(want.fits);
      ASSERT_TRUE(want.weights_paged);
      EXPECT_EQ(want.min_bytes_resident_weights, all.min_bytes);
      EXPECT_EQ(want.n_paged(),
                budget == wmin ? static_cast<int>(planned.size()) : static_cast<int>(planned.size()) - 1);
      rt::HostState st(s, c.grads, c.moments, c.master, c.rule);
      st.init_random(3);
      const std::vector<uint8_t> before = rt::test::state_bytes(st, false);
      rt::StateTier t(st, {tmp.path(), budget, "[train]", true});
      EXPECT_TRUE(t.plan() == want) << "budget " << budget;
      EXPECT_EQ(rt::file_size(t.path()), want.file_bytes);
      uint64_t grads = 0, wfile = 0;
      for (size_t u = 0; u < st.units().size(); ++u) {
        const rt::StateUnit& su = st.units()[u];
        grads += 4 * su.grad.n;
        EXPECT_EQ(su.paged_out, want.paged[u] != 0);
        if (!want.paged[u]) continue;
        wfile += planned[u].weights_paged;
        EXPECT_EQ(su.shadow_master() ? su.shadow_buf[0].p : su.arena.p, nullptr) << "unit " << u;
        rt::test::expect_error([&] { (void)su.read_master(0, 1, nullptr); },
                               {"its weights are in the state tier's file"});
      }
      EXPECT_EQ(want.resident, grads);  // RAM keeps the gradients only
      EXPECT_EQ(want.weight_file_bytes, wfile);
      EXPECT_LE(want.ram(), budget);
      t.page_in_all();
      EXPECT_TRUE(rt::test::state_bytes(st, false) == before);  // paged out and back: the same bytes
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
  // the weights page only when the engine may page them and the budget is below the minimum with them in RAM:
  // an embedding, six layers, a head; of each unit's resident bytes, 2 are gradients and the rest weights (in
  // the file one more: 4 KiB rounding)
  std::vector<rt::TierUnitBytes> w = {{102, 100, 100, 101}};
  for (int i = 0; i < 6; ++i) w.push_back({302, 300, 300, 301});
  w.push_back({52, 50, 50, 51});
  const uint64_t min_resident = 102 + 6 * 302 + 52 + 900;           // every weight in RAM + three units' state
  EXPECT_FALSE(rt::tier_place(w, min_resident - 1).weights_paged);  // an engine that does not page them
  EXPECT_FALSE(rt::tier_place(w, min_resident - 1).fits);
  EXPECT_FALSE(rt::tier_place(w, min_resident, true).weights_paged);  // fits with the weights in RAM
  EXPECT_FALSE(rt::tier_place(w, 0, true).weights_paged);             // 0: every unit's optimizer state, as before
  const uint64_t min_paged = 16 + 3 * (300 + 301);                    // the gradients + three units' weights and state
  const rt::TierPlan pw = rt::tier_place(w, min_paged + 100, true);
  EXPECT_TRUE(pw.weights_paged);
  EXPECT_TRUE(pw.fits);
  EXPECT_EQ(pw.resident, 16u);
  EXPECT_EQ(pw.min_bytes, min_paged);
  EXPECT_EQ(pw.min_bytes_resident_weights, min_resident);
  EXPECT_EQ(pw.paged, std::vector<char>(8, 1));  // 100 left: neither the embedding (201) nor the head (101)
  EXPECT_EQ(pw.file_bytes, 201u + 6 * 601 + 101);
  EXPECT_EQ(pw.weight_file_bytes, 101u + 6 * 301 + 51);
  EXPECT_EQ(pw.traffic_per_step(), 2 * pw.file_bytes);
  const rt::TierPlan pk = rt::tier_place(w, min_paged + 201, true);  // the embedding kept whole
  EXPECT_EQ(pk.paged, (std::vector<char>{0, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(pk.kept, 201u);
  EXPECT_EQ(pk.weight_file_bytes, 6u * 301 + 51);
  EXPECT_LE(pk.ram(), min_paged + 201);
  EXPECT_FALSE(rt::tier_place(w, min_paged - 1, true).fits);
}

// The kept units are spread over the units (the embedding first, then the others in bit-reversed order of their
// index), not a block of the first ones: the SSD then works while the kept units' gradients land. Same count kept
// as in unit order when the units are alike.
TEST(StateTierLayout, PlaceSpreadsTheKeptUnits) {
  std::vector<rt::TierUnitBytes> u(33, rt::TierUnitBytes{1, 100});  // an embedding and 32 layers
  const uint64_t budget = 33 + 300 + 8 * 100;                        // resident + 3 slots + 8 units kept
  const rt::TierPlan p = rt::tier_place(u, budget);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.n_paged(), 33 - 8);
  EXPECT_EQ(p.paged[0], 0);  // the embedding first
  EXPECT_LE(p.ram(), budget);
  int run = 0, longest = 0;
  for (size_t i = 1; i < u.size(); ++i) {
    run = p.paged[i] ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  // 7 layers kept of 32, every fourth from layer 0 on: the longest run of paged layers is the last, 32 - 25 = 7
  // (a block of the first ones kept would leave 25 in a row)
  EXPECT_LE(longest, 7);
}

// Slots reserved for the three largest units of all (here the embedding) that the paged units do not need keep
// more units in RAM.
TEST(StateTierLayout, PlaceUsesTheSlotsThePagedUnitsDoNotNeed) {
  std::vector<rt::TierUnitBytes> u = {{1, 500}};
  for (int i = 0; i < 10; ++i) u.push_back({1, 100});
  const uint64_t budget = 11 + 700 + 500;  // the minimum (three largest: 500 + 100 + 100) and the embedding
  const rt::TierPlan p = rt::tier_place(u, budget);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.paged[0], 0);
  // the embedding kept, the layers paged need 300 of the 700 reserved: 400 more keep four layers
  EXPECT_EQ(p.n_paged(), 6);
  EXPECT_EQ(p.slots, 300u);
  EXPECT_EQ(p.kept, 900u);
  EXPECT_EQ(p.ram(), budget);
}

}  // namespace
