// The CUDA streaming engine (stream_engine.cpp), as one plan exactly: it
// throws DeviceBudgetError / HostBudgetError when the plan does not fit.
// make_cuda_backend (make_backend.cpp) picks the plan.
#pragma once
#include <cstdint>
#include <memory>

#include "engine/backend.h"
#include "state/host_state.h"

namespace rt::cuda {

std::unique_ptr<Backend> make_stream_engine(HostState& state, int64_t micro_batch, int64_t seq_len,
                                            const CudaOptions& opt);

}  // namespace rt::cuda
