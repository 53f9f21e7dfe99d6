#include "core/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>

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
  rt::test::expect_error([] { rt::read_text_file("/nonexistent/dir/x.json"); }, {"/nonexistent/dir/x.json"});
}

namespace {

using rt::test::contains;
using rt::test::error_of;

}  // namespace

TEST(Fs, PathKindNamesFifosAndDevices) {
  rt::test::TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("p").c_str(), 0644), 0);
  rt::write_file_atomic(dir.file("f"), "x");
  std::filesystem::create_symlink(dir.file("gone"), dir.file("l"));
  EXPECT_EQ(rt::path_kind(dir.file("p")), "a FIFO (named pipe)");
  EXPECT_EQ(rt::path_kind("/dev/null"), "a character device");
  EXPECT_EQ(rt::path_kind(dir.file("f")), "a regular file");
  EXPECT_EQ(rt::path_kind(dir.path()), "a directory");
  EXPECT_EQ(rt::path_kind(dir.file("l")), "a symbolic link to a missing target");
  EXPECT_EQ(rt::path_kind(dir.file("none")), "");
  const std::string fifo = error_of([&] { rt::require_regular_file(dir.file("p"), "[data]"); });
  EXPECT_TRUE(contains(fifo, "[data] " + dir.file("p") + ": is a FIFO (named pipe), not a regular file")) << fifo;
  const std::string zero = error_of([&] { rt::require_regular_file("/dev/zero", "[data]", true); });
  EXPECT_TRUE(contains(zero, "/dev/zero: is a character device, not a regular file or directory")) << zero;
  const std::string none = error_of([&] { rt::require_regular_file(dir.file("none"), "[data]"); });
  EXPECT_TRUE(contains(none, dir.file("none") + ": no such file")) << none;
  EXPECT_EQ(error_of([&] { rt::require_regular_file(dir.file("f"), "[data]"); }), "");
  EXPECT_EQ(error_of([&] { rt::require_regular_file(dir.path(), "[data]", true); }), "");
  EXPECT_NE(error_of([&] { rt::require_regular_file(dir.path(), "[data]"); }), "");
}

TEST(Fs, CheckOutWritableCreatesProbesAndWarnsOnSpace) {
  rt::test::TempDir dir;
  const std::string out = dir.file("a/b");
  EXPECT_EQ(rt::check_out_writable(out, 1, "[train]", "--out"), "");
  EXPECT_TRUE(rt::is_directory(out));
  EXPECT_TRUE(std::filesystem::is_empty(out));  // the probe is gone
  // More than the file system holds: a warning naming the flag and both sizes.
  const uint64_t free = rt::fs_free_bytes(out);
  ASSERT_NE(free, UINT64_MAX);
  const std::string w = rt::check_out_writable(out, free + (uint64_t(1) << 40), "[train]", "--out");
  EXPECT_TRUE(contains(w, "--out " + out + " has ")) << w;
  EXPECT_TRUE(contains(w, "less than one checkpoint (" + std::to_string((free + (uint64_t(1) << 40)) >> 20) + " MiB)"))
      << w;
  rt::write_file_atomic(dir.file("f"), "x");
  const std::string f = error_of([&] { rt::check_out_writable(dir.file("f"), 0, "[train]", "--out"); });
  EXPECT_TRUE(contains(f, "[train] --out " + dir.file("f") + " is a regular file, not a directory")) << f;
  const std::string g = error_of([&] { rt::check_out_writable(dir.file("f/x"), 0, "[train]", "--out"); });
  EXPECT_TRUE(contains(g, "[train] --out " + dir.file("f/x") + " cannot be created")) << g;
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
