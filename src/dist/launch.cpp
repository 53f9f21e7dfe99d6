#include "dist/launch.h"

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace rt {

namespace {

struct Family {
  const char* launcher;
  const char *rank, *size, *local;
};
const Family kFamilies[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// A decimal integer in [lo, hi], the whole string.
int parse_int(const char* name, const char* v, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    fail("[launch] ", name, "=\"", v, "\" is not an integer in [", lo, ", ", hi,
         "]; fix the launcher's environment (or unset it for a single process)");
  return static_cast<int>(x);
}

}  // namespace

LaunchConfig launch_config_from_env(const std::function<const char*(const char*)>& getenv) {
  std::vector<LaunchConfig> found;
  for (const Family& f : kFamilies) {
    const char *r = getenv(f.rank), *s = getenv(f.size), *l = getenv(f.local);
    if (!r && !s) {
      RT_CHECK(!l, "[launch] ", f.local, " is set but ", f.rank, " and ", f.size, " are not: set all three (",
               f.launcher, " does) or none");
      continue;
    }
    RT_CHECK(r && s, "[launch] ", r ? f.rank : f.size, " is set but ", r ? f.size : f.rank,
             " is not: a launcher sets both (", f.launcher, ")");
    LaunchConfig c;
    c.launcher = f.launcher;
    c.world = parse_int(f.size, s, 1, 1 << 20);
    c.rank = parse_int(f.rank, r, 0, 1 << 20);
    RT_CHECK(c.rank < c.world, "[launch] ", f.rank, "=", c.rank, " is not below ", f.size, "=", c.world,
             " (ranks are 0 .. size-1)");
    if (l) {
      c.local_rank = parse_int(f.local, l, 0, 1 << 20);
      RT_CHECK(c.local_rank <= c.rank, "[launch] ", f.local, "=", c.local_rank, " exceeds ", f.rank, "=", c.rank,
               " (a rank's index on its host cannot pass its global index)");
    } else {
      RT_CHECK(c.world == 1, "[launch] ", f.local, " is not set but ", f.size, "=", c.world,
               ": the local rank picks this process's GPU; set it (", f.launcher, " does)");
    }
    found.push_back(c);
  }
  if (found.empty()) return LaunchConfig{};
  LaunchConfig c = found[0];
  for (size_t i = 1; i < found.size(); ++i)
    RT_CHECK(found[i].rank == c.rank && found[i].world == c.world && found[i].local_rank == c.local_rank,
             "[launch] the launchers' variables disagree: ", c.launcher, " says rank ", c.rank, " of ", c.world,
             " (local ", c.local_rank, "), ", found[i].launcher, " says rank ", found[i].rank, " of ", found[i].world,
             " (local ", found[i].local_rank, "); unset one launcher's variables");
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (c.world > 1) {
    RT_CHECK(addr && *addr, "[launch] MASTER_ADDR is not set: with ", c.world,
             " ranks, set it to rank 0's host name or address (torchrun sets it; with mpirun/srun export it)");
    RT_CHECK(port && *port, "[launch] MASTER_PORT is not set: with ", c.world,
             " ranks, set it to a free TCP port on rank 0's host (e.g. 29500)");
  }
  if (addr) c.master_addr = addr;
  if (port && *port) c.master_port = parse_int("MASTER_PORT", port, 1, 65535);
  return c;
}

LaunchConfig launch_config_from_env() {
  return launch_config_from_env([](const char* n) -> const char* { return std::getenv(n); });
}

}  // namespace rt
