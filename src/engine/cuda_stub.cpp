// CPU-only builds: the CUDA backend entry points say what is missing.
#ifndef RAMTRAIN_HAVE_CUDA
#include "core/error.h"
#include "engine/backend.h"

namespace rt {

bool cuda_backend_available() { return false; }
int cuda_device_count() { return 0; }
bool cuda_fp8_supported(MatmulMode, std::string* why) {
  if (why) *why = "this ramtrain was built without the CUDA backend";
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(HostState&, int64_t, int64_t, const CudaOptions&) {
  fail(
      "[cuda] this ramtrain was built without the CUDA backend (RAMTRAIN_CUDA=OFF or no nvcc at build time); "
      "rebuild with scripts/build.sh release on a machine with the CUDA toolkit, or use --device cpu");
}

}  // namespace rt
#endif
