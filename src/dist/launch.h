// LaunchConfig: where this process sits in a multi-process world, read from
// the launcher's environment. Understood: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK), Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) and
// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); MASTER_ADDR and
// MASTER_PORT name rank 0's TCP store (dist/tcp_store.h) in every case.
// Rules: no launcher variables: one process (rank 0 of 1). A launcher's set
// must be complete (rank and size; local rank too when size > 1). When
// several launchers' variables are present (torchrun under srun), their
// rank and size must agree, and torchrun's are used. Every inconsistency is
// an rt::Error naming the variables and their values.
#pragma once
#include <functional>
#include <string>

namespace rt {

struct LaunchConfig {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;  // "" when world == 1
  int master_port = 0;
  std::string launcher = "none";  // torchrun | mpirun | srun | none
};

// getenv: returns the variable's value or nullptr (std::getenv in production).
LaunchConfig launch_config_from_env(const std::function<const char*(const char*)>& getenv);
LaunchConfig launch_config_from_env();  // the process environment

}  // namespace rt
