// Error checks for CUDA runtime and cuBLASLt calls. Each macro evaluates the
// call once and, on failure, throws rt::Error naming the call as written, its
// file:line and the library's own message, e.g.
//   [cuda] cudaMalloc(&p, bytes) failed at src/cuda/linear.cu:42: out of memory
// CUDA_CHECK_LAUNCH() checks the last kernel launch (bad configuration, no
// kernel image for this GPU); it does not wait for the kernel to finish.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                                               \
  do {                                                                                                                 \
    cudaError_t rt_cuda_err_ = (call);                                                                                 \
    if (rt_cuda_err_ != cudaSuccess)                                                                                   \
      ::rt::fail("[cuda] ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", cudaGetErrorName(rt_cuda_err_), " (", \
                 cudaGetErrorString(rt_cuda_err_), ")");                                                               \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                 \
  do {                                                                                                     \
    cublasStatus_t rt_cublas_st_ = (call);                                                                 \
    if (rt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      ::rt::fail("[cublasLt] ", #call, " failed at ", __FILE__, ":", __LINE__, ": ",                       \
                 cublasLtGetStatusName(rt_cublas_st_), " (", cublasLtGetStatusString(rt_cublas_st_), ")"); \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
