// HostState's split master storage (state/host_state.h): conversion both ways
// is bit-exact for every element (padding included) and keeps the moments;
// read/write of one tensor, init_random and weights() agree with fp32 storage;
// the shadow count can change without losing the current master; the byte
// accounting matches what is allocated.
#include "state/host_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "testutil.h"

namespace {

rt::ModelSpec spec() {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 16;
  s.intermediate = 24;
  s.n_layers = 2;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.vocab = 40;
  s.max_positions = 32;
  s.qkv_bias = true;  // small tensors: partial tie words everywhere
  return s;
}

// Masters with the hard cases in them: exact ties, NaNs (signalling and quiet),
// infinities, denormals, zeros of both signs; m and v random.
void fill(rt::HostState& st, uint64_t seed) {
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800001u, 0x7fc00001u, 0xff800000u,
                              0x00000001u, 0x80000000u, 0x00000000u, 0x7f7fffffu, 0xffa00000u};
  for (auto& u : st.units()) {
    std::vector<float> r = rt::test::random_vec(3 * u.numel, seed++, -2.f, 2.f);
    for (size_t i = 0; i < 10 && i < r.size(); ++i) std::memcpy(&r[i * 7], &special[i], 4);
    std::memcpy(u.arena.p, r.data(), r.size() * 4);
  }
}

std::vector<float> masters(const rt::HostState& st) {
  std::vector<float> w;
  for (auto& u : st.units()) {
    std::vector<float> x(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, x.data());
    w.insert(w.end(), x.begin(), x.end());
  }
  return w;
}

std::vector<float> moments(const rt::HostState& st) {
  std::vector<float> w;
  for (auto& u : st.units()) w.insert(w.end(), u.m(), u.m() + 2 * u.numel);
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(HostStateSplit, ConversionRoundTripIsBitExact) {
  rt::HostState st(spec(), false);
  fill(st, 1);
  const std::vector<float> w0 = masters(st), mv0 = moments(st);
  std::vector<float> arena0;
  for (auto& u : st.units()) arena0.insert(arena0.end(), u.arena.p, u.arena.p + 3 * u.numel);
  st.set_master_storage(rt::MasterStorage::split, 1);
  EXPECT_EQ(st.master_storage(), rt::MasterStorage::split);
  EXPECT_TRUE(same_bits(masters(st), w0));
  EXPECT_TRUE(same_bits(moments(st), mv0));
  // the shadow is the bf16 rounding of the master, as the GPU loads it
  const rt::StateUnit& u1 = st.units()[1];
  const size_t base = static_cast<size_t>(st.units()[0].numel);
  for (int64_t i = 0; i < u1.numel; ++i)
    ASSERT_EQ(u1.shadow(0)[i], rt::f32_to_bf16(w0[base + static_cast<size_t>(i)])) << i;
  EXPECT_THROW(u1.master(), rt::Error);
  // two shadows, a flip of the current one, back to one and to fp32
  st.set_master_storage(rt::MasterStorage::split, 2);
  for (auto& u : st.units()) {
    EXPECT_EQ(0, std::memcmp(u.shadow(0), u.shadow(1), static_cast<size_t>(u.numel) * 2));
    u.cur_shadow = 1;
    std::memset(u.shadow(0), 0xab, static_cast<size_t>(u.numel) * 2);  // a stale shadow must not be read
  }
  EXPECT_TRUE(same_bits(masters(st), w0));
  st.set_master_storage(rt::MasterStorage::split, 1);
  EXPECT_EQ(st.units()[1].cur_shadow, 0);
  EXPECT_TRUE(same_bits(masters(st), w0));
  st.set_master_storage(rt::MasterStorage::fp32);
  std::vector<float> arena1;
  for (auto& u : st.units()) arena1.insert(arena1.end(), u.arena.p, u.arena.p + 3 * u.numel);
  EXPECT_TRUE(same_bits(arena1, arena0));
}

TEST(HostStateSplit, TensorAccessInitAndWeightsMatchFp32) {
  rt::HostState a(spec(), false), b(spec(), false);
  b.set_master_storage(rt::MasterStorage::split, 2);
  a.init_random(7);
  b.init_random(7);
  EXPECT_TRUE(same_bits(masters(a), masters(b)));
  for (auto& u : b.units()) EXPECT_EQ(0, std::memcmp(u.shadow(0), u.shadow(1), static_cast<size_t>(u.numel) * 2));
  // write one tensor, read it back; the neighbours are untouched
  const std::string name = "model.layers.1.self_attn.k_proj.bias";
  std::vector<float> x = rt::test::random_vec(8, 3), y(8);
  std::memcpy(a.master(name), x.data(), 32);
  b.write_master(name, x.data());
  b.read_master(name, y.data());
  EXPECT_TRUE(same_bits(x, y));
  EXPECT_TRUE(same_bits(masters(a), masters(b)));
  // weights(): fp32 views equal, in every tensor
  const rt::ModelWeightsT<float> wa = a.weights(), wb = b.weights();
  EXPECT_EQ(0, std::memcmp(wa.embed, wb.embed, 40 * 16 * 4));
  EXPECT_EQ(0, std::memcmp(wa.layers[1].down_proj, wb.layers[1].down_proj, 16 * 24 * 4));
  EXPECT_EQ(0, std::memcmp(wa.layers[1].k_bias, wb.layers[1].k_bias, 8 * 4));
  EXPECT_EQ(0, std::memcmp(wa.final_norm, wb.final_norm, 16 * 4));
}

TEST(HostStateSplit, ByteAccountingMatchesTheAllocation) {
  for (int shadows : {1, 2})
    for (bool grads : {false, true}) {
      rt::HostState st(spec(), grads);
      st.set_master_storage(rt::MasterStorage::split, shadows);
      EXPECT_EQ(st.bytes_total(), rt::HostState::planned_bytes(spec(), rt::MasterStorage::split, shadows, grads))
          << shadows << " " << grads;
    }
  rt::HostState st(spec(), true);
  EXPECT_EQ(st.bytes_total(), rt::HostState::planned_bytes(spec(), rt::MasterStorage::fp32, 0, true));
  // fp32 with the CUDA engine's pinned shadow: 4 + 2 B per (padded) element where split
  // holds 2 + 2 + 1/8 (page and line rounding aside)
  const double fp = static_cast<double>(rt::HostState::planned_bytes(spec(), rt::MasterStorage::fp32, 1, false));
  const double sp = static_cast<double>(rt::HostState::planned_bytes(spec(), rt::MasterStorage::split, 1, false));
  EXPECT_GT(fp, 0.0);
  EXPECT_GT(sp, 0.0);
}

}  // namespace
