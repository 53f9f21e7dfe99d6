// LaunchConfig (dist/launch.h) from torchrun, mpirun and srun environments,
// and the errors for incomplete, malformed or disagreeing ones.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "dist/launch.h"
#include "testutil.h"

namespace {

using Env = std::map<std::string, std::string>;

rt::LaunchConfig parse(const Env& e) {
  return rt::launch_config_from_env([&](const char* n) -> const char* {
    auto it = e.find(n);
    return it == e.end() ? nullptr : it->second.c_str();
  });
}

const Env kMaster{{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};

Env with(Env a, const Env& b) {
  a.insert(b.begin(), b.end());
  return a;
}

TEST(Launch, NoLauncherIsOneProcess) {
  const rt::LaunchConfig c = parse({});
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.world, 1);
  EXPECT_EQ(c.launcher, "none");
}

TEST(Launch, EachLauncherFamily) {
  const rt::LaunchConfig t = parse(with(kMaster, {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}}));
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.rank, 5);
  EXPECT_EQ(t.world, 8);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "10.0.0.1");
  EXPECT_EQ(t.master_port, 29500);
  const rt::LaunchConfig m = parse(with(
      kMaster, {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}));
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 3);
  EXPECT_EQ(m.local_rank, 3);
  const rt::LaunchConfig s =
      parse(with(kMaster, {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}}));
  EXPECT_EQ(s.launcher, "srun");
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.world, 4);
  // torchrun under srun: both agree, torchrun's names win
  const rt::LaunchConfig b = parse(with(kMaster, {{"RANK", "1"},
                                                  {"WORLD_SIZE", "2"},
                                                  {"LOCAL_RANK", "1"},
                                                  {"SLURM_PROCID", "1"},
                                                  {"SLURM_NTASKS", "2"},
                                                  {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(b.launcher, "torchrun");
  // a world of one needs no master
  EXPECT_EQ(parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world, 1);
}

TEST(Launch, InconsistentValuesAreRefusedByName) {
  const Env t{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  rt::test::expect_error(
      [&] {
        parse(with(kMaster, {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}));
      },
      {"RANK=2", "WORLD_SIZE=2"});
  rt::test::expect_error([&] { parse(with(kMaster, {{"RANK", "1"}})); }, {"RANK is set but WORLD_SIZE is not"});
  rt::test::expect_error([&] { parse(with(kMaster, {{"LOCAL_RANK", "1"}})); }, {"LOCAL_RANK is set"});
  rt::test::expect_error(
      [&] {
        parse(with(kMaster, {{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
      },
      {"LOCAL_RANK is not set"});
  rt::test::expect_error(
      [&] {
        parse(with(kMaster, {{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}));
      },
      {"RANK=\"x1\"", "not an integer"});
  rt::test::expect_error(
      [&] {
        parse(with(kMaster, {{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}));
      },
      {"WORLD_SIZE=\"0\""});
  rt::test::expect_error(
      [&] {
        parse(with(kMaster, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}));
      },
      {"LOCAL_RANK=1 exceeds RANK=0"});
  rt::test::expect_error([&] { parse(t); }, {"MASTER_ADDR is not set"});
  rt::test::expect_error([&] { parse(with(t, {{"MASTER_ADDR", "h"}})); }, {"MASTER_PORT is not set"});
  rt::test::expect_error(
      [&] {
        parse(with(t, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}));
      },
      {"MASTER_PORT=\"70000\""});
  rt::test::expect_error(
      [&] {
        parse(with(with(kMaster, t), {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}));
      },
      {"disagree", "torchrun says rank 1 of 2", "srun says rank 0 of 2"});
}

}  // namespace
