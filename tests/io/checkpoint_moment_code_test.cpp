// The code of quantized moments recorded in unit checkpoint files
// (io/checkpoint_unit.h, metadata moment_code): files written before the
// minifloat 8-bit codes (no moment_code, dynamic tree codes) load by decoding
// with the old code and re-encoding with the current one; a file of the current
// code loads bit for bit; an unknown code is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint_unit.h"
#include "state/host_state.h"
#include "state/moment_quant.h"
#include "testutil.h"

namespace {

using rt::MomentStorage;
using rt::QuantCode;

rt::ModelSpec spec() { return rt::test::llama_spec(64, 172, 1, 4, 2, 16, 258); }

std::vector<float> old_decode(bool sgn, const uint8_t* codes, const float* scales, int64_t n) {
  const QuantCode& c = sgn ? rt::quant_code_m8_dynamic() : rt::quant_code_v8_dynamic();
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float y = c.level[codes[i] & (sgn ? 0x7f : 0xff)] * scales[i / rt::kQuantBlock];
    x[i] = sgn && (codes[i] & 0x80) ? -y : y;
  }
  return x;
}

std::string file_bytes(const rt::StateUnit& u) {
  std::string out;
  rt::unit_snap_write(rt::unit_snap_live(u),
                      [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

// The file with its metadata's moment_code removed (code == nullptr) or set.
void write_with_code(const std::string& bytes, const char* code, const std::string& path) {
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  nlohmann::ordered_json h = nlohmann::ordered_json::parse(bytes.substr(8, hn));
  ASSERT_TRUE(h["__metadata__"].contains("moment_code"));
  if (code)
    h["__metadata__"]["moment_code"] = code;
  else
    h["__metadata__"].erase("moment_code");
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.write(bytes.data() + 8 + hn, static_cast<std::streamsize>(bytes.size() - 8 - hn));
}

// Heavy-tailed moments (magnitudes over ~10 decades) in every unit, fp32.
std::vector<std::vector<float>> fill_moments(rt::HostState& st) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> ref;
  for (auto& u : st.units()) {
    ref.emplace_back(static_cast<size_t>(2 * u.numel));
    for (int64_t i = 0; i < 2 * u.numel; ++i) {
      const float z = 1e-3f * nd(rng) * std::exp(2.f * nd(rng));
      ref.back()[i] = i < u.numel ? z : z * z;
    }
    std::memcpy(u.m(), ref.back().data(), static_cast<size_t>(2 * u.numel) * 4);
  }
  return ref;
}

TEST(CheckpointMomentCode, AnOldDynamicCodeFileLoadsIntoTheCurrentCode) {
  rt::test::TempDir dir;
  rt::HostState a(spec(), false);
  a.init_random(3);
  const std::vector<std::vector<float>> ref = fill_moments(a);
  a.set_moment_storage(MomentStorage::q8);
  for (bool explicit_name : {false, true}) {
    rt::HostState b(spec(), false);
    b.set_moment_storage(MomentStorage::q8);
    for (size_t k = 0; k < a.units().size(); ++k) {
      rt::StateUnit& u = a.units()[k];
      SCOPED_TRACE(u.name + (explicit_name ? " (moment_code dynamic)" : " (no moment_code)"));
      const int64_t n = u.numel, nb = rt::quant_blocks(n);
      // the old bytes, as an earlier ramtrain stored these moments
      rt::test::encode_dynamic8(true, ref[k].data(), n, u.qm(), u.scale_m());
      rt::test::encode_dynamic8(false, ref[k].data() + n, n, u.qv(), u.scale_v());
      const std::vector<float> old_m = old_decode(true, u.qm(), u.scale_m(), n);
      const std::vector<float> old_v = old_decode(false, u.qv(), u.scale_v(), n);
      const std::string path = dir.file(u.name + ".safetensors");
      write_with_code(file_bytes(u), explicit_name ? rt::kQuantCode8Dynamic : nullptr, path);
      rt::StateUnit& w = b.units()[k];
      rt::unit_file_load(path, w, true);
      // exactly the current code's nearest encoding of the old values
      std::vector<uint8_t> cm(static_cast<size_t>(n)), cv(static_cast<size_t>(n));
      std::vector<float> sm(static_cast<size_t>(nb)), sv(static_cast<size_t>(nb));
      for (int64_t blk = 0; blk < nb; ++blk) {
        const int64_t f = blk * rt::kQuantBlock, kk = std::min(rt::kQuantBlock, n - f);
        rt::quant_block_encode(MomentStorage::q8, true, rt::QuantRounding::nearest, 0, old_m.data() + f, kk, cm.data(),
                               f, &sm[blk]);
        rt::quant_block_encode(MomentStorage::q8, false, rt::QuantRounding::nearest, 0, old_v.data() + f, kk, cv.data(),
                               f, &sv[blk]);
      }
      ASSERT_EQ(0, std::memcmp(cm.data(), w.qm(), static_cast<size_t>(n)));
      ASSERT_EQ(0, std::memcmp(cv.data(), w.qv(), static_cast<size_t>(n)));
      ASSERT_EQ(0, std::memcmp(sm.data(), w.scale_m(), static_cast<size_t>(nb) * 4));
      ASSERT_EQ(0, std::memcmp(sv.data(), w.scale_v(), static_cast<size_t>(nb) * 4));
      // and within both codes' errors of the moments the old file stood for:
      // old: half its level gap at the value (below v's smallest level: that
      // level), times the absmax; new: 1/17 of the old value from its
      // smallest nonzero level up, else that level (times the absmax);
      // fp32 rounding: 2^-21 of the absmax
      std::vector<float> m1(static_cast<size_t>(n)), v1(static_cast<size_t>(n));
      rt::quant_decode(MomentStorage::q8, true, w.qm(), w.scale_m(), n, m1.data());
      rt::quant_decode(MomentStorage::q8, false, w.qv(), w.scale_v(), n, v1.data());
      for (int part = 0; part < 2; ++part) {
        const bool sgn = part == 0;
        const QuantCode& oc = sgn ? rt::quant_code_m8_dynamic() : rt::quant_code_v8_dynamic();
        const QuantCode& nc = sgn ? rt::quant_code_m8() : rt::quant_code_v8();
        const float* x = ref[k].data() + part * n;
        const float* got = sgn ? m1.data() : v1.data();
        const float* scales = sgn ? u.scale_m() : u.scale_v();
        for (int64_t i = 0; i < n; ++i) {
          const double amax = scales[i / rt::kQuantBlock], y = std::fabs(x[i]) / amax;
          double gap = oc.level[0];
          for (int j = 0; j + 1 < oc.n; ++j)
            if (oc.level[j] <= y && y <= oc.level[j + 1]) gap = (oc.level[j + 1] - oc.level[j]) / 2.0;
          const double old_err = gap * amax;
          const double new_err = std::fabs(x[i]) / 17 + old_err / 17 + nc.level[sgn ? 1 : 0] * amax;
          ASSERT_LE(std::fabs(double(got[i]) - x[i]), old_err + new_err + amax * 0x1.0p-21)
              << (sgn ? "m" : "v") << " element " << i << " x " << x[i];
        }
      }
    }
  }
}

TEST(CheckpointMomentCode, TheCurrentCodeLoadsBitForBitAndAnUnknownOneIsRefused) {
  rt::test::TempDir dir;
  rt::HostState a(spec(), false);
  a.init_random(4);
  fill_moments(a);
  a.set_moment_storage(MomentStorage::q8);
  rt::HostState b(spec(), false);
  b.set_moment_storage(MomentStorage::q8);
  const rt::StateUnit& u = a.units()[1];
  rt::StateUnit& w = b.units()[1];
  const std::string bytes = file_bytes(u), path = dir.file("unit.safetensors");
  write_with_code(bytes, rt::quant_code_id(MomentStorage::q8), path);
  rt::unit_file_load(path, w, true);
  EXPECT_EQ(0, std::memcmp(u.qm(), w.qm(), static_cast<size_t>(u.numel)));
  EXPECT_EQ(0, std::memcmp(u.qv(), w.qv(), static_cast<size_t>(u.numel)));
  EXPECT_EQ(0, std::memcmp(u.scale_m(), w.scale_m(), static_cast<size_t>(2 * rt::quant_blocks(u.numel)) * 4));
  write_with_code(bytes, "m8e9m9", path);
  try {
    rt::unit_file_load(path, w, true);
    ADD_FAILURE() << "an unknown moment_code loaded";
  } catch (const rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown moment_code 'm8e9m9'"), std::string::npos) << e.what();
  }
}

}  // namespace
