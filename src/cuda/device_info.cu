// CUDA runtime queries used by --device auto. The kernels of the CUDA backend
// live beside this file; see src/cuda/device_info.h.
#include <cuda_runtime.h>

#include "cuda/device_info.h"

namespace rt::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace rt::cuda
