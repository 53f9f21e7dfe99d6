// `ramtrain train --nproc-per-node N` on GPUs: one process per GPU on this
// host, started the way torchrun starts them (docs/multi_gpu.md).
#pragma once
#include <string>
#include <vector>

namespace rt::cli {

// Runs `/proc/self/exe args...` (or $RAMTRAIN_EXE's) N times with RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port) and NCCL_NVLS_ENABLE=0 set,
// and waits. When one rank fails (non-zero exit or a signal), the others get
// SIGTERM; SIGINT/SIGTERM to this process are passed on to every rank.
// Returns 0 when all succeed, else the first failure's exit code (128 + the
// signal for a rank killed by one).
int spawn_local_ranks(int n, const std::vector<std::string>& args);

}  // namespace rt::cli
