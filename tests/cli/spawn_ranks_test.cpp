// `ramtrain train --nproc-per-node N` on GPUs starts N ranks the way torchrun
// does (cli/spawn_ranks.h). Tested with this test binary as the child: the
// parent test runs spawn_local_ranks with a gtest filter that selects
// SpawnChild.*, which, when it finds RANK in its environment, records what
// it was given, and fails or hangs on request.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "cli/spawn_ranks.h"
#include "dist/launch.h"
#include "testutil.h"

namespace {

std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

}  // namespace

// The child's body (skipped unless started by spawn_local_ranks).
TEST(SpawnChild, RecordsItsLaunchVariables) {
  if (env("RANK").empty() || env("RT_SPAWN_TEST_DIR").empty()) GTEST_SKIP() << "run by SpawnRanks tests only";
  const rt::LaunchConfig c = rt::launch_config_from_env();  // the engine's own reading of them
  std::ofstream(env("RT_SPAWN_TEST_DIR") + "/rank-" + env("RANK"))
      << c.rank << " " << c.world << " " << c.local_rank << " " << c.master_addr << " " << c.master_port << " "
      << env("NCCL_NVLS_ENABLE") << " " << c.launcher << "\n";
  if (env("RANK") == env("RT_SPAWN_FAIL_RANK")) {  // once the others are up (as ranks in a collective would be)
    for (int t = 0; t < 600; ++t) {
      bool all = true;
      for (int r = 0; r < c.world; ++r)
        all = all && std::ifstream(env("RT_SPAWN_TEST_DIR") + "/rank-" + std::to_string(r)).good();
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::_Exit(3);
  }
  if (env("RT_SPAWN_HANG").empty()) return;
  std::this_thread::sleep_for(std::chrono::seconds(120));  // the parent stops it before this ends
  std::ofstream(env("RT_SPAWN_TEST_DIR") + "/rank-" + env("RANK") + ".survived") << "1\n";
}

TEST(SpawnRanks, EveryRankGetsTheLauncherVariables) {
  rt::test::TempDir tmp;
  ::setenv("RT_SPAWN_TEST_DIR", tmp.path().c_str(), 1);
  ::unsetenv("RT_SPAWN_FAIL_RANK");
  ::unsetenv("RT_SPAWN_HANG");
  const int rc = rt::cli::spawn_local_ranks(3, {"--gtest_filter=SpawnChild.*"});
  EXPECT_EQ(rc, 0);
  std::set<int> ports;
  for (int r = 0; r < 3; ++r) {
    std::ifstream f(tmp.file("rank-" + std::to_string(r)));
    ASSERT_TRUE(f.good()) << "rank " << r << " did not run";
    int rank = -1, world = 0, local = -1, port = 0;
    std::string addr, nvls, launcher;
    f >> rank >> world >> local >> addr >> port >> nvls >> launcher;
    EXPECT_EQ(rank, r);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local, r);
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(port, 0);
    ports.insert(port);
    EXPECT_EQ(nvls, "0") << "NVLink multicast must stay off in every rank";
    EXPECT_EQ(launcher, "torchrun");
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must meet at one store";
  ::unsetenv("RT_SPAWN_TEST_DIR");
}

// One rank fails while the others wait (as ranks waiting in a collective for
// it would): the others are stopped and the failure's exit code returned.
TEST(SpawnRanks, OneFailingRankStopsTheOthersAndGivesItsCode) {
  rt::test::TempDir tmp;
  ::setenv("RT_SPAWN_TEST_DIR", tmp.path().c_str(), 1);
  ::setenv("RT_SPAWN_FAIL_RANK", "1", 1);
  ::setenv("RT_SPAWN_HANG", "1", 1);
  const int rc = rt::cli::spawn_local_ranks(3, {"--gtest_filter=SpawnChild.*"});
  EXPECT_EQ(rc, 3);
  for (int r : {0, 2}) {
    EXPECT_TRUE(std::ifstream(tmp.file("rank-" + std::to_string(r))).good()) << "rank " << r << " never ran";
    EXPECT_FALSE(std::ifstream(tmp.file("rank-" + std::to_string(r) + ".survived")).good())
        << "rank " << r << " was not stopped when rank 1 failed";
  }
  ::unsetenv("RT_SPAWN_TEST_DIR");
  ::unsetenv("RT_SPAWN_FAIL_RANK");
  ::unsetenv("RT_SPAWN_HANG");
}
