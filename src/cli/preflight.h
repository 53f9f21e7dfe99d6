// Pre-flight checks of `ramtrain train`: everything that can be checked from
// the configuration and the model's shape alone, before the data is encoded
// and before gigabytes of training state are allocated. New checks of the run
// environment (a lock on --out, its writability, free space) belong here.
#pragma once
#include "cli/train_config.h"
#include "model/spec.h"

namespace rt::cli {

// cpu_backend: the run will use the CPU backend (no GPU, or --device cpu).
// Throws rt::Error naming the option; prints warnings (GPU-only options on a
// CPU run).
void preflight(const TrainConfig& c, const ModelSpec& spec, bool cpu_backend);

// Host memory the kernel reports as available (MemAvailable; 0: unknown).
uint64_t host_memory_available();

}  // namespace rt::cli
