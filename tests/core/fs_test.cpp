#include "core/fs.h"

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "core/error.h"
#include "testutil.h"

TEST(Fs, AtomicWriteReplacesOnlyOnCommit) {
  rt::test::TempDir dir;
  std::string p = dir.file("a.txt");
  rt::write_file_atomic(p, "old");
  {
    rt::AtomicFile f(p);
    f.write("new content");
    // destroyed without commit: the old file stays and no temporary is left
  }
  EXPECT_EQ(rt::read_text_file(p), "old");
  rt::AtomicFile f(p);
  f.write("new");
  f.commit();
  EXPECT_EQ(rt::read_text_file(p), "new");
}

TEST(Fs, MissingFileNamesThePath) {
  try {
    rt::read_text_file("/nonexistent/dir/x.json");
    FAIL() << "no error";
  } catch (const rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.json"), std::string::npos);
  }
}

TEST(Bf16, RoundTripAndRounding) {
  for (float f : {0.f, 1.f, -2.5f, 3.140625f, 0x1p-100f, 65536.f, -0x1.fep+127f})
    EXPECT_EQ(rt::bf16_to_f32(rt::f32_to_bf16(f)), f) << f;
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even (1).
  EXPECT_EQ(rt::bf16_to_f32(rt::f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(rt::bf16_to_f32(rt::f32_to_bf16(1.01171875f)), 1.015625f);
}

TEST(F16, RoundTripIncludingSubnormals) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f, -0.333251953125f})
    EXPECT_EQ(rt::f16_to_f32(rt::f32_to_f16(f)), f) << f;
}
