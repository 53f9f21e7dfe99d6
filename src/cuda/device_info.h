// Queries of the CUDA runtime. Only built with RAMTRAIN_HAVE_CUDA.
#pragma once

namespace rt::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int device_count();

}  // namespace rt::cuda
