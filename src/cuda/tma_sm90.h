// The driver's TMA tensor-map encoder of the sm_90a kernels
// (attention_sm90.cu). Internal to the CUDA backend.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

namespace rt::cuda::sm90 {

// cuTensorMapEncodeTiled from the driver (looked up once). Throws where the
// driver has none (a CUDA 12+ driver has it): the message names `who` (the
// caller) and `fallback` (the setting that runs it without TMA kernels).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* who, const char* fallback);

}  // namespace rt::cuda::sm90
