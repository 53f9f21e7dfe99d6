// Checkpoints of a split-master state (state/host_state.h) are the fp32 format:
// a split run's checkpoint loads into an fp32 state and an fp32 run's into a
// split one, bit-exact both ways, from synchronous and background (staged)
// saves; the HF export's tensors decode too.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/checkpoint.h"
#include "io/state_tensors.h"
#include "testutil.h"

namespace {

using rt::test::tiny_spec;

void fill(rt::HostState& st, uint64_t seed) {
  for (auto& u : st.units()) {
    std::vector<float> r = rt::test::random_vec(3 * u.numel, seed++, -2.f, 2.f);
    for (size_t i = 0; i < r.size(); i += 5) r[i] = 1.0f + 0x1.01p-8f * static_cast<float>(i % 3);  // ties
    std::memcpy(u.arena.p, r.data(), r.size() * 4);
  }
}

// Every unit's [master | m | v] as fp32 (decoded where split).
std::vector<float> snapshot(const rt::HostState& st) {
  std::vector<float> w;
  for (auto& u : st.units()) {
    std::vector<float> x(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, x.data());
    w.insert(w.end(), x.begin(), x.end());
    w.insert(w.end(), u.m(), u.m() + 2 * u.numel);
  }
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

rt::TrainerCheckpoint meta_at(int64_t step) {
  rt::TrainerCheckpoint c;
  c.step = step;
  c.adam_t = step;
  return c;
}

TEST(CheckpointSplit, SplitAndFp32LoadEachOthersCheckpointsBitExact) {
  for (bool background : {false, true}) {
    rt::test::TempDir tmp;
    rt::HostState fp(tiny_spec(), false);
    fill(fp, 1);
    const std::vector<float> want = snapshot(fp);
    rt::HostState sp(tiny_spec(), false);
    fill(sp, 1);
    sp.set_master_storage(rt::MasterStorage::split, 2);
    for (auto& u : sp.units()) {  // the current master in shadow 1, shadow 0 stale
      std::memcpy(u.shadow(1), u.shadow(0), static_cast<size_t>(u.numel) * 2);
      std::memset(u.shadow(0), 0x5a, static_cast<size_t>(u.numel) * 2);
      u.cur_shadow = 1;
    }
    ASSERT_TRUE(same_bits(snapshot(sp), want));
    rt::CheckpointWriter w(tmp.file("split"), 0);
    w.save(sp, meta_at(3), background);
    w.wait();
    const std::string dir = tmp.file("split/ckpt-00000003");
    EXPECT_EQ(rt::checkpoint_verify(dir), "");
    rt::HostState into_fp(tiny_spec(), false);
    rt::checkpoint_load_state(dir, into_fp);
    EXPECT_TRUE(same_bits(snapshot(into_fp), want)) << "background " << background;
    // and an fp32 checkpoint into a split state
    rt::CheckpointWriter w2(tmp.file("fp"), 0);
    w2.save(fp, meta_at(4), background);
    w2.wait();
    rt::HostState into_sp(tiny_spec(), false);
    into_sp.set_master_storage(rt::MasterStorage::split, 1);
    rt::checkpoint_load_state(tmp.file("fp/ckpt-00000004"), into_sp);
    EXPECT_TRUE(same_bits(snapshot(into_sp), want)) << "background " << background;
  }
}

TEST(CheckpointSplit, ExportTensorsDecode) {
  rt::HostState fp(tiny_spec(), false), sp(tiny_spec(), false);
  fill(fp, 9);
  fill(sp, 9);
  sp.set_master_storage(rt::MasterStorage::split, 1);
  const std::vector<rt::TensorWrite> a = rt::master_tensors(fp, rt::DType::f32),
                                     b = rt::master_tensors(sp, rt::DType::f32);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : a[i].shape) n *= d;
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(0, std::memcmp(a[i].data, b[i].data, static_cast<size_t>(n) * 4)) << a[i].name;
  }
}

}  // namespace
