// The driver's TMA tensor-map encoder (tma_sm90.h).
#include "cuda/tma_sm90.h"

#include <mutex>

#include "cuda/check.h"

namespace rt::cuda::sm90 {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* who, const char* fallback) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    cudaGetLastError();
  });
  RT_CHECK(fn != nullptr, "[", who, "] the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver); ", fallback);
  return fn;
}

}  // namespace rt::cuda::sm90
