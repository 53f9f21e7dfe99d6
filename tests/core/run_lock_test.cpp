// RunLock: a second holder of one directory is refused naming the first (flock
// locks belong to an open file, so two opens in one process conflict like two
// processes do); a lock file left behind by a process that is gone does not
// block; letting go removes the lock file and a directory the lock created.
#include "core/run_lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;

using rt::test::contains;

std::string refusal(const std::string& dir) {
  try {
    rt::RunLock l = rt::RunLock::acquire(dir, "[test]", "--out");
  } catch (const rt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunLock, ASecondHolderIsRefusedNamingTheFirst) {
  rt::test::TempDir tmp;
  const std::string dir = tmp.file("run");
  {
    rt::RunLock a = rt::RunLock::acquire(dir, "[test]", "--out");
    EXPECT_TRUE(a.held());
    EXPECT_TRUE(fs::is_directory(dir));
    const std::string info = rt::read_text_file(a.path());
    EXPECT_TRUE(contains(info, "pid " + std::to_string(::getpid()) + "\n")) << info;
    EXPECT_TRUE(contains(info, "\nhost ")) << info;
    EXPECT_TRUE(contains(info, "\ncommand ")) << info;
    const std::string why = refusal(dir);
    EXPECT_TRUE(contains(why, "[test] --out " + dir + " is in use by another ramtrain process (pid " +
                                  std::to_string(::getpid()) + ", host "))
        << why;
    rt::RunLock moved = std::move(a);  // moving keeps it held
    EXPECT_FALSE(a.held());
    EXPECT_NE(refusal(dir), "");
  }
  // Let go: the file is removed, and so is the directory the lock created (it was empty).
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(refusal(dir), "");
}

TEST(RunLock, ALockFileOfADeadProcessDoesNotBlock) {
  rt::test::TempDir tmp;
  const std::string dir = tmp.file("run");
  fs::create_directories(dir);
  // A child takes the lock and dies without letting go (_exit: no destructors).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      rt::RunLock l = rt::RunLock::acquire(dir, "[test]", "--out");
      new rt::RunLock(std::move(l));  // never destroyed
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const std::string left = rt::read_text_file(dir + "/" + rt::kRunLockName);
  ASSERT_TRUE(contains(left, "pid " + std::to_string(pid) + "\n")) << left;
  rt::RunLock l = rt::RunLock::acquire(dir, "[test]", "--out");
  EXPECT_TRUE(l.held());
  EXPECT_TRUE(contains(rt::read_text_file(l.path()), "pid " + std::to_string(::getpid()) + "\n"));
  l.release();
  EXPECT_FALSE(fs::exists(dir + "/" + rt::kRunLockName));
  EXPECT_TRUE(fs::is_directory(dir));  // not created by the lock: kept
}

TEST(RunLock, ARegularFileOrAPathBelowOneIsRefused) {
  rt::test::TempDir tmp;
  rt::test::write_bytes(tmp.file("f"), "x");
  EXPECT_TRUE(contains(refusal(tmp.file("f")), "--out " + tmp.file("f") + " is a regular file, not a directory"));
  EXPECT_TRUE(contains(refusal(tmp.file("f/sub")), "--out " + tmp.file("f/sub") + " cannot be created"));
  EXPECT_EQ(rt::read_text_file(tmp.file("f")), "x");
}

}  // namespace
