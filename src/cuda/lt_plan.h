// LtContext: a cuBLASLt handle and its workspace, released together.
// LtPlan: the cuBLASLt objects of one GEMM shape (descriptor, three layouts,
// the chosen algorithm), destroyed together. Callers cache one per shape in a
// map of unique_ptrs (never rebuilt per call, never moved: STYLE.md rule 8);
// linear.cu's bf16 GEMMs and fp8.cu's block-scaled FP8 GEMMs both hold them.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/check.h"

namespace rt::cuda {

struct LtContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  explicit LtContext(size_t bytes) : workspace_bytes(bytes) {
    CUBLAS_CHECK(cublasLtCreate(&handle));
    if (bytes) CUDA_CHECK(cudaMalloc(&workspace, bytes));
  }
  LtContext(const LtContext&) = delete;
  LtContext& operator=(const LtContext&) = delete;
  ~LtContext() {
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace rt::cuda
