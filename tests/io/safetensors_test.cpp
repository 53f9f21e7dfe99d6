// Tests for io/safetensors: the reader against files built byte by byte here
// (independent of the writer), bit-exact writer round trips (F32 keeps every
// bit, BF16/F16 match core/bf16.h element by element), sharded models with an
// index, and a corpus of broken files that must each throw rt::Error naming
// the file (and the tensor). No tolerances: every comparison is exact.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "testutil.h"

namespace {

using rt::safetensors_write;
using rt::test::TempDir;
using rt::test::write_bytes;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A safetensors file: 8-byte header length, header text as given, data.
std::string st_bytes(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

using rt::test::expect_error;

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Floats whose bits a careless copy or conversion would change.
std::vector<float> special_floats() {
  return {0.f,
          -0.f,
          1.f,
          -2.5f,
          INFINITY,
          -INFINITY,
          from_bits(0x7fc12345u),  // quiet NaN with payload
          from_bits(0xffa00001u),  // negative signalling NaN
          from_bits(0x00000001u),  // smallest denormal
          from_bits(0x807fffffu),  // largest negative denormal
          3.4028235e38f,
          1.00390625f /* bf16 tie */,
          65504.f,
          65520.f /* f16 overflow tie */,
          0x1p-24f,
          0x1p-25f};
}

}  // namespace

TEST(SafetensorsRead, HandBuiltF32) {
  TempDir dir;
  std::string p = dir.file("a.safetensors");
  std::vector<float> vals = {1.f, -2.f, 0.5f, 3.25f};
  std::string header =
      R"({"__metadata__":{"format":"pt","note":"x"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  write_bytes(p, st_bytes(header, raw(vals)));
  auto f = rt::SafetensorsFile::open(p);
  EXPECT_EQ(f->path(), p);
  ASSERT_EQ(f->tensors().size(), 1u);
  const rt::TensorInfo* t = f->find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_EQ(t->name, "w");
  EXPECT_EQ(t->dtype, rt::DType::f32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t->numel(), 4);
  EXPECT_EQ(t->nbytes, 16u);
  EXPECT_EQ(*t->file, p);
  EXPECT_EQ(std::memcmp(t->data, vals.data(), 16), 0);
  std::vector<float> out(4);
  rt::tensor_to_f32(*t, out.data());
  EXPECT_EQ(out, vals);
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
}

// Zero-size tensors of every dtype convert to nothing, also into a null
// buffer (what an empty std::vector's data() may be); found by the fuzzer.
TEST(SafetensorsRead, ZeroSizeTensorsConvertToNothing) {
  TempDir dir;
  std::string p = dir.file("z.safetensors");
  std::string header =
      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]},)"
      R"("c":{"dtype":"F16","shape":[0,2],"data_offsets":[0,0]}})";
  write_bytes(p, st_bytes(header, ""));
  auto f = rt::SafetensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 3u);
  for (const rt::TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.numel(), 0) << t.name;
    rt::tensor_to_f32(t, nullptr);
  }
}

// 16-bit dtypes from known bit patterns (values by the IEEE/bfloat16
// definitions), an odd-length header so data is unaligned, a hole between
// tensors, a scalar, an empty tensor, and header order != data order.
TEST(SafetensorsRead, HandBuilt16BitUnalignedWithHole) {
  TempDir dir;
  std::string p = dir.file("b.safetensors");
  std::vector<uint16_t> bf = {0x3f80, 0xc000, 0x7f80, 0x0001, 0x8000};  // 1, -2, inf, 2^-133, -0
  std::vector<uint16_t> hf = {0x3c00, 0xc000, 0x0001, 0x7bff, 0xfc00};  // 1, -2, 2^-24, 65504, -inf
  std::vector<float> sc = {7.f};
  std::string data = raw(hf) + std::string(6, '\xee') + raw(bf) + raw(sc);  // hole of 6 bytes
  std::string header = R"({"bf":{"dtype":"BF16","shape":[5],"data_offsets":[16,26]},)"
                       R"("empty":{"dtype":"F32","shape":[3,0],"data_offsets":[4,4]},)"
                       R"("hf":{"dtype":"F16","shape":[1,5],"data_offsets":[0,10]},)"
                       R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[26,30]}})";
  if (header.size() % 2 == 0) header += " ";  // odd length: the data section starts unaligned
  write_bytes(p, st_bytes(header, data));
  auto f = rt::SafetensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 4u);
  // Data-offset order: hf(0), empty(4), bf(16), scalar(26).
  EXPECT_EQ(f->tensors()[0].name, "hf");
  EXPECT_EQ(f->tensors()[1].name, "empty");
  EXPECT_EQ(f->tensors()[2].name, "bf");
  EXPECT_EQ(f->tensors()[3].name, "scalar");

  std::vector<float> out(5);
  rt::tensor_to_f32(*f->find("bf"), out.data());
  std::vector<float> bf_ref = {1.f, -2.f, INFINITY, std::ldexp(1.f, -133), -0.f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(to_bits(out[i]), to_bits(bf_ref[i])) << i;
  rt::tensor_to_f32(*f->find("hf"), out.data());
  std::vector<float> hf_ref = {1.f, -2.f, std::ldexp(1.f, -24), 65504.f, -INFINITY};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(to_bits(out[i]), to_bits(hf_ref[i])) << i;
  const rt::TensorInfo* s = f->find("scalar");
  EXPECT_EQ(s->numel(), 1);
  rt::tensor_to_f32(*s, out.data());
  EXPECT_EQ(out[0], 7.f);
  EXPECT_EQ(f->find("empty")->numel(), 0);
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_TRUE(f->metadata().empty());
}

TEST(SafetensorsWrite, F32RoundTripIsBitExact) {
  TempDir dir;
  std::string p = dir.file("f32.safetensors");
  std::vector<float> a = special_floats();
  std::vector<float> b = rt::test::random_vec(3 * 7, 1);
  safetensors_write(
      p, {{"a", {static_cast<int64_t>(a.size())}, a.data(), rt::DType::f32}, {"b", {3, 7}, b.data(), rt::DType::f32}},
      {{"k", "v"}});
  auto f = rt::SafetensorsFile::open(p);
  EXPECT_EQ(f->metadata().at("k"), "v");
  for (auto [name, src] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    const rt::TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->nbytes, src->size() * 4);
    EXPECT_EQ(std::memcmp(t->data, src->data(), t->nbytes), 0) << name;
    std::vector<float> out(src->size());
    rt::tensor_to_f32(*t, out.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(to_bits(out[i]), to_bits((*src)[i])) << name << "[" << i << "]";
  }
  EXPECT_EQ(f->find("b")->shape, (std::vector<int64_t>{3, 7}));
}

// Raw tensors (TensorWrite::raw: a carried tensor of a multimodal export) are
// stored as given, in any dtype (U8 too), beside converted ones, sharded or not.
TEST(SafetensorsWrite, RawTensorsAreStoredByteForByte) {
  TempDir dir;
  std::vector<uint8_t> bytes(2 * 3 * 5 + 7);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<float> f = rt::test::random_vec(9, 2);
  std::vector<rt::TensorWrite> w = {{"conv", {9}, f.data(), rt::DType::bf16, {}},
                                    {"bf", {3, 5}, nullptr, rt::DType::bf16, {}},
                                    {"u8", {7}, nullptr, rt::DType::u8, {}}};
  w[1].raw = bytes.data();
  w[2].raw = bytes.data() + 30;
  for (uint64_t shard : {uint64_t{0}, uint64_t{16}}) {
    const std::string d = dir.file(shard ? "sharded" : "one");
    rt::safetensors_write_model(d, w, shard);
    rt::SafetensorsModel m = rt::SafetensorsModel::open(d);
    const rt::TensorInfo& bf = m.get("bf");
    EXPECT_EQ(bf.dtype, rt::DType::bf16);
    ASSERT_EQ(bf.nbytes, 30u);
    EXPECT_EQ(std::memcmp(bf.data, bytes.data(), 30), 0);
    const rt::TensorInfo& u8 = m.get("u8");
    EXPECT_EQ(u8.dtype, rt::DType::u8);
    ASSERT_EQ(u8.nbytes, 7u);
    EXPECT_EQ(std::memcmp(u8.data, bytes.data() + 30, 7), 0);
    std::vector<float> back(9);
    rt::tensor_to_f32(m.get("conv"), back.data());
    for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i], rt::bf16_to_f32(rt::f32_to_bf16(f[i])));
  }
  // without raw bytes, U8 is still refused (there is no conversion from fp32)
  EXPECT_THROW(safetensors_write(dir.file("bad.safetensors"), {{"u8", {7}, f.data(), rt::DType::u8, {}}}), rt::Error);
}

// Large enough (> 1M elements) to go through the chunked, parallel conversion.
TEST(SafetensorsWrite, Bf16AndF16MatchScalarConversions) {
  rt::set_global_threads(3);
  TempDir dir;
  std::string p = dir.file("half.safetensors");
  std::vector<float> src = rt::test::random_vec((1 << 20) + 12345, 2, -70000.f, 70000.f);
  std::vector<float> sp = special_floats();
  std::copy(sp.begin(), sp.end(), src.begin() + (1 << 20) - 3);           // straddle a chunk boundary
  std::vector<float> small = rt::test::random_vec(33, 3, -1e-4f, 1e-4f);  // f16 subnormal range
  int64_t n = static_cast<int64_t>(src.size());
  safetensors_write(p, {{"bf", {n}, src.data(), rt::DType::bf16},
                        {"hf", {n}, src.data(), rt::DType::f16},
                        {"hf_small", {3, 11}, small.data(), rt::DType::f16}});
  auto f = rt::SafetensorsFile::open(p);
  for (auto [name, v] : {std::pair{"bf", &src}, std::pair{"hf", &src}, std::pair{"hf_small", &small}}) {
    const rt::TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr);
    const bool is_bf = std::string(name) == "bf";
    EXPECT_EQ(t->dtype, is_bf ? rt::DType::bf16 : rt::DType::f16);
    ASSERT_EQ(t->nbytes, v->size() * 2);
    std::vector<float> out(v->size());
    rt::tensor_to_f32(*t, out.data());
    int64_t bad = 0;
    for (size_t i = 0; i < v->size(); ++i) {
      uint16_t ref = is_bf ? rt::f32_to_bf16((*v)[i]) : rt::f32_to_f16((*v)[i]);
      uint16_t got;
      std::memcpy(&got, t->data + 2 * i, 2);
      float back = is_bf ? rt::bf16_to_f32(ref) : rt::f16_to_f32(ref);
      if (got != ref || to_bits(out[i]) != to_bits(back)) {
        if (++bad < 5) ADD_FAILURE() << name << "[" << i << "]: stored " << got << " want " << ref;
      }
    }
    EXPECT_EQ(bad, 0) << name;
  }
  rt::set_global_threads(0);
}

// The on-disk layout checked by parsing the bytes here: header padded with
// spaces to a multiple of 8, tensors in the given order, contiguous offsets.
TEST(SafetensorsWrite, LayoutFollowsTheFormat) {
  TempDir dir;
  std::string p = dir.file("layout.safetensors");
  std::vector<float> x = rt::test::random_vec(10, 4);
  safetensors_write(p,
                    {{"z", {5}, x.data(), rt::DType::bf16},
                     {"a", {2, 5}, x.data(), rt::DType::f32},
                     {"e", {0}, nullptr, rt::DType::f16},
                     {"m", {3}, x.data(), rt::DType::f16}},
                    {{"format", "pt"}});
  std::string bytes = rt::read_text_file(p);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);
  auto j = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "z", "a", "e", "m"}));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["z"]["data_offsets"], nlohmann::json({0, 10}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json({10, 50}));
  EXPECT_EQ(j["e"]["data_offsets"], nlohmann::json({50, 50}));
  EXPECT_EQ(j["m"]["data_offsets"], nlohmann::json({50, 56}));
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json({2, 5}));
  EXPECT_EQ(bytes.size(), 8 + n + 56);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 10, x.data(), 40), 0);
}

TEST(SafetensorsWrite, RefusesBadInputAndLeavesNoFile) {
  TempDir dir;
  std::string p = dir.file("bad.safetensors");
  std::vector<float> x(4, 1.f);
  expect_error([&] { safetensors_write(p, {{"w", {4}, x.data()}, {"w", {4}, x.data()}}); }, {p, "'w'", "twice"});
  expect_error([&] { safetensors_write(p, {{"neg", {-1, 4}, x.data()}}); }, {p, "'neg'", "negative"});
  expect_error([&] { safetensors_write(p, {{"big", {1LL << 40, 1LL << 40}, x.data()}}); }, {p, "'big'", "overflow"});
  EXPECT_TRUE(dir_entries(dir.path()).empty());

  // A failed write never replaces an existing file.
  safetensors_write(p, {{"w", {4}, x.data()}});
  std::string before = rt::read_text_file(p);
  expect_error([&] { safetensors_write(p, {{"w", {4}, x.data()}, {"w", {4}, x.data()}}); }, {p});
  EXPECT_EQ(rt::read_text_file(p), before);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"bad.safetensors"});

  // AtomicFile into a directory that does not exist: throws, creates nothing.
  std::string missing = dir.file("no_such_dir/x.safetensors");
  expect_error([&] { safetensors_write(missing, {{"w", {4}, x.data()}}); }, {missing});
  EXPECT_FALSE(std::filesystem::exists(dir.file("no_such_dir")));
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"bad.safetensors"});
}

TEST(SafetensorsModel, SingleFileByDirAndByPath) {
  TempDir dir;
  std::vector<float> a = rt::test::random_vec(6, 5), b = rt::test::random_vec(4, 6);
  rt::safetensors_write_model(dir.path(), {{"b.w", {2, 2}, b.data()}, {"a.w", {2, 3}, a.data(), rt::DType::bf16}});
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"model.safetensors"});
  for (const std::string& src : {dir.path(), dir.file("model.safetensors")}) {
    rt::SafetensorsModel m = rt::SafetensorsModel::open(src);
    EXPECT_EQ(m.source(), src);
    auto all = m.all();
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0]->name, "a.w");  // sorted by name
    EXPECT_EQ(all[1]->name, "b.w");
    EXPECT_EQ(m.get("b.w").shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(std::memcmp(m.get("b.w").data, b.data(), 16), 0);
    EXPECT_EQ(m.find("c"), nullptr);
    expect_error([&] { m.get("missing.weight"); }, {"missing.weight", src});
  }
  auto f = rt::SafetensorsFile::open(dir.file("model.safetensors"));
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(SafetensorsModel, ShardedRoundTrip) {
  TempDir dir;
  // Sizes in bytes: 400 (f32 x100), 200 (bf16 x100), 80, 600, 40 -> total 1320.
  std::vector<float> v = rt::test::random_vec(150, 7);
  std::vector<rt::TensorWrite> ts = {{"t0", {10, 10}, v.data(), rt::DType::f32},
                                     {"t1", {100}, v.data(), rt::DType::bf16},
                                     {"t2", {20}, v.data() + 5, rt::DType::f32},
                                     {"t3", {150}, v.data(), rt::DType::f32},
                                     {"t4", {2, 10}, v.data() + 1, rt::DType::f16}};
  // Greedy with limit 500: [t0] 400, [t1 t2] 280, [t3] 600 (alone, over the limit), [t4] 40.
  rt::safetensors_write_model(dir.path(), ts, 500);
  EXPECT_EQ(dir_entries(dir.path()),
            (std::vector<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                      "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                      "model.safetensors.index.json"}));
  auto idx = nlohmann::json::parse(rt::read_text_file(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(idx["metadata"]["total_size"], 1320);
  EXPECT_EQ(idx["weight_map"], nlohmann::json({{"t0", "model-00001-of-00004.safetensors"},
                                               {"t1", "model-00002-of-00004.safetensors"},
                                               {"t2", "model-00002-of-00004.safetensors"},
                                               {"t3", "model-00003-of-00004.safetensors"},
                                               {"t4", "model-00004-of-00004.safetensors"}}));
  EXPECT_EQ(rt::SafetensorsFile::open(dir.file("model-00002-of-00004.safetensors"))->metadata().at("format"), "pt");

  for (const std::string& src : {dir.path(), dir.file("model.safetensors.index.json")}) {
    rt::SafetensorsModel m = rt::SafetensorsModel::open(src);
    ASSERT_EQ(m.all().size(), 5u);
    for (const auto& w : ts) {
      const rt::TensorInfo& t = m.get(w.name);
      EXPECT_EQ(t.shape, w.shape);
      EXPECT_EQ(t.dtype, w.dtype);
      std::vector<float> out(static_cast<size_t>(t.numel()));
      rt::tensor_to_f32(t, out.data());
      for (size_t i = 0; i < out.size(); ++i) {
        float ref = w.dtype == rt::DType::f32    ? w.data[i]
                    : w.dtype == rt::DType::bf16 ? rt::bf16_to_f32(rt::f32_to_bf16(w.data[i]))
                                                 : rt::f16_to_f32(rt::f32_to_f16(w.data[i]));
        ASSERT_EQ(to_bits(out[i]), to_bits(ref)) << w.name << "[" << i << "]";
      }
    }
    EXPECT_NE(m.get("t3").file->find("model-00003-of-00004.safetensors"), std::string::npos);
  }

  // Rewriting unsharded removes the index that would describe other weights.
  rt::safetensors_write_model(dir.path(), {ts[0]}, 0);
  EXPECT_FALSE(rt::file_exists(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(rt::SafetensorsModel::open(dir.path()).all().size(), 1u);
  // And sharding again removes the model.safetensors that would shadow the index.
  rt::safetensors_write_model(dir.path(), ts, 500);
  EXPECT_FALSE(rt::file_exists(dir.file("model.safetensors")));
  EXPECT_EQ(rt::SafetensorsModel::open(dir.path()).all().size(), 5u);
}

// Every broken file must throw rt::Error naming the file and, where one is
// involved, the tensor.
TEST(SafetensorsRead, BrokenFilesThrowNamedErrors) {
  const std::string f4(4, '\0'), f8(8, '\0'), f12(12, '\0');
  struct Case {
    const char* file;
    std::string bytes;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"empty.safetensors", "", {"shorter than"}},
      {"five.safetensors", "abcde", {"5 bytes"}},
      {"past_end.safetensors", le64(1000) + "{}", {"past the end"}},
      {"huge_len.safetensors", le64(1ULL << 63) + "{}", {"9223372036854775808", "past the end"}},
      {"not_json.safetensors", st_bytes("{not json", ""), {"not valid JSON"}},
      {"array.safetensors", st_bytes("[1,2]", ""), {"array", "not an object"}},
      {"entry_not_object.safetensors", st_bytes(R"({"lm_head.weight":3})", ""), {"lm_head.weight", "not an object"}},
      {"no_dtype.safetensors",
       st_bytes(R"({"embed.weight":{"shape":[1],"data_offsets":[0,4]}})", f4),
       {"embed.weight", "dtype"}},
      {"i64.safetensors",
       st_bytes(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", f8),
       {"'ids'", "I64 is not supported", "F32, BF16, F16"}},
      {"neg_shape.safetensors",
       st_bytes(R"({"w.neg":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f4),
       {"w.neg", "shape", "-1"}},
      {"float_shape.safetensors",
       st_bytes(R"({"w.fl":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", f4),
       {"w.fl", "shape"}},
      {"no_shape.safetensors", st_bytes(R"({"w.ns":{"dtype":"F32","data_offsets":[0,4]}})", f4), {"w.ns", "shape"}},
      {"end_before_begin.safetensors",
       st_bytes(R"({"w.rev":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", f4),
       {"w.rev", "end before begin"}},
      {"bad_offsets.safetensors",
       st_bytes(R"({"w.off":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", f4),
       {"w.off", "data_offsets"}},
      {"beyond.safetensors",
       st_bytes(R"({"w.far":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f4),
       {"w.far", "past the data section"}},
      {"mismatch.safetensors",
       st_bytes(R"({"w.mm":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f8),
       {"w.mm", "8 bytes", "span 4 bytes"}},
      {"overflow.safetensors",
       st_bytes(R"({"w.of":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", f4),
       {"w.of", "overflow"}},
      {"overlap.safetensors",
       st_bytes(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                f12),
       {"'second'", "'first'", "overlap"}},
      {"dup.safetensors",
       st_bytes(R"({"twin":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("twin":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                f8),
       {"'twin'", "twice"}},
      {"meta_int.safetensors", st_bytes(R"({"__metadata__":{"step":1}})", ""), {"__metadata__", "step", "string"}},
      {"meta_array.safetensors", st_bytes(R"({"__metadata__":[]})", ""), {"__metadata__"}},
  };
  TempDir dir;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    std::string p = dir.file(c.file);
    write_bytes(p, c.bytes);
    std::vector<std::string> needles = c.needles;
    needles.push_back(p);
    expect_error([&] { rt::SafetensorsFile::open(p); }, needles);
    expect_error([&] { rt::SafetensorsModel::open(p); }, needles);
  }
}

// Every prefix of a valid file, and every header byte overwritten by a few
// values, must either open or throw rt::Error: never crash (run under ASan).
TEST(SafetensorsRead, TruncatedAndCorruptedFilesNeverCrash) {
  TempDir dir;
  std::string good = dir.file("good.safetensors");
  std::vector<float> x = rt::test::random_vec(6, 8);
  safetensors_write(good, {{"a", {2, 3}, x.data(), rt::DType::bf16}, {"b", {6}, x.data()}}, {{"k", "v"}});
  const std::string bytes = rt::read_text_file(good);
  std::string p = dir.file("mutant.safetensors");
  int opened = 0, refused = 0;
  auto try_open = [&](const std::string& b) {
    std::filesystem::remove(p);  // a fresh file: truncating one makes ext4 flush it to disk
    write_bytes(p, b);
    try {
      auto f = rt::SafetensorsFile::open(p);
      std::vector<float> out(64);
      for (const auto& t : f->tensors())
        if (t.numel() <= 64) rt::tensor_to_f32(t, out.data());
      ++opened;
    } catch (const rt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      ++refused;
    }
  };
  for (size_t len = 0; len < bytes.size(); ++len) try_open(bytes.substr(0, len));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  for (size_t i = 0; i < 8 + n; ++i)
    for (char v : {'\0', '"', '9', '-', '}', '\xff'}) {
      std::string b = bytes;
      b[i] = v;
      try_open(b);
    }
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened, 0);  // e.g. a digit changed inside a metadata string
}

TEST(SafetensorsModel, BrokenModelDirectories) {
  TempDir dir;
  std::vector<float> x(4, 1.f);
  // No weights at all: names both files it looked for.
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); },
               {dir.path(), "model.safetensors", "model.safetensors.index.json"});
  expect_error([&] { rt::SafetensorsModel::open(dir.file("absent")); }, {dir.file("absent"), "does not exist"});
  // Weights under another name, a dangling link (an incomplete HF download), a directory.
  {
    TempDir other;
    rt::safetensors_write(other.file("weights.safetensors"), {{"a", {4}, x.data(), rt::DType::f32}});
    expect_error([&] { rt::SafetensorsModel::open(other.path()); },
                 {other.path(), "holds weights.safetensors but neither model.safetensors nor"});
    std::filesystem::create_symlink(other.file("blobs/abc123"), other.file("model.safetensors"));
    expect_error([&] { rt::SafetensorsModel::open(other.path()); },
                 {other.file("model.safetensors"), "symbolic link to a missing file", "incomplete download"});
    std::filesystem::remove(other.file("model.safetensors"));
    std::filesystem::create_directory(other.file("model.safetensors"));
    expect_error([&] { rt::SafetensorsModel::open(other.path()); },
                 {other.file("model.safetensors"), "is a directory, not a weights file"});
  }

  const std::string idx = dir.file("model.safetensors.index.json");
  // Index naming a missing shard.
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "model-00001-of-00002.safetensors", "'a'"});

  // Index naming a tensor the shard does not hold.
  rt::safetensors_write(dir.file("s1.safetensors"), {{"a", {4}, x.data()}});
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"s1.safetensors","ghost":"s1.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "'ghost'", "s1.safetensors"});

  // A tensor stored in two shards.
  rt::safetensors_write(dir.file("s2.safetensors"), {{"a", {4}, x.data()}, {"b", {4}, x.data()}});
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {"'a'", "s1.safetensors", "s2.safetensors"});

  // Malformed indexes.
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"s1.safetensors","a":"s2.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "'a'", "twice"});
  rt::write_file_atomic(idx, R"({"metadata":{}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "weight_map"});
  rt::write_file_atomic(idx, R"({"weight_map":{"a":1}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "'a'"});
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"../outside.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "'../outside.safetensors', not a file of this directory"});
  rt::write_file_atomic(idx, "{oops");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {idx, "not valid JSON"});

  // A broken shard reports the shard's own path.
  write_bytes(dir.file("s3.safetensors"), "xyz");
  rt::write_file_atomic(idx, R"({"weight_map":{"a":"s3.safetensors"}})");
  expect_error([&] { rt::SafetensorsModel::open(dir.path()); }, {dir.file("s3.safetensors")});
}
