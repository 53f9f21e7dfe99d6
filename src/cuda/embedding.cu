// Embedding gather and its deterministic scatter-add backward.
// Backward: stable radix sort of (id, token) pairs (CUB), then one block per
// run of equal ids sums the run's dout rows in token order in fp32 and adds
// the sum to dtable[id] once. No atomics: bit-identical run to run.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

using detail::bf16x8;

__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* table, int64_t C) {
  const int64_t n = blockIdx.x;
  const int64_t row = ids[n];
  const bf16x8* src = reinterpret_cast<const bf16x8*>(table + row * C);
  bf16x8* dst = reinterpret_cast<bf16x8*>(out + n * C);
  for (int64_t i = threadIdx.x; i < C / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<int32_t>(i);
}

// Block i starts work only if sorted position i begins a run of equal ids.
__global__ void embedding_backward_kernel(float* dtable, const bf16* dout, const int32_t* keys, const int32_t* tokens,
                                          int64_t N, int64_t C) {
  const int64_t i = blockIdx.x;
  const int32_t id = keys[i];
  if (i > 0 && keys[i - 1] == id) return;
  int64_t end = i + 1;
  while (end < N && keys[end] == id) ++end;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < C; c += static_cast<int64_t>(blockDim.x) * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < end; ++j) {
      float f[8];
      detail::bf16x8_to_float(*reinterpret_cast<const bf16x8*>(dout + static_cast<int64_t>(tokens[j]) * C + c), f);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += f[k];
    }
    float* dst = dtable + static_cast<int64_t>(id) * C + c;
#pragma unroll
    for (int k = 0; k < 8; ++k) dst[k] += acc[k];
  }
}

int id_bits(int64_t V) {
  int bits = 1;
  while ((int64_t{1} << bits) < V) ++bits;
  return bits;
}

size_t round16(size_t b) { return (b + 15) / 16 * 16; }

size_t sort_temp_bytes(int64_t N, int64_t V) {
  size_t temp = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), N, 0, id_bits(V)));
  return temp;
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* ids, const bf16* table, int64_t N, int64_t C, cudaStream_t stream) {
  RT_CHECK(C % 8 == 0, "[cuda embedding_forward] C must be a multiple of 8, got ", C);
  detail::check_aligned(out, "embedding out");
  detail::check_aligned(table, "embedding table");
  if (N == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(N), 128, 0, stream>>>(out, ids, table, C);
  CUDA_CHECK_LAUNCH();
}

size_t embedding_backward_scratch_bytes(int64_t N, int64_t V) {
  return 3 * round16(static_cast<size_t>(N) * 4) + round16(sort_temp_bytes(N, V));
}

void embedding_backward(float* dtable, const bf16* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        Scratch scratch, cudaStream_t stream) {
  RT_CHECK(C % 8 == 0, "[cuda embedding_backward] C must be a multiple of 8, got ", C);
  RT_CHECK(N < (int64_t{1} << 31), "[cuda embedding_backward] N must fit in int32, got ", N);
  const size_t need = embedding_backward_scratch_bytes(N, V);
  RT_CHECK(scratch.bytes >= need, "[cuda embedding_backward] scratch has ", scratch.bytes, " bytes, needs ", need,
           " (embedding_backward_scratch_bytes)");
  if (N == 0) return;
  char* p = static_cast<char*>(scratch.ptr);
  const size_t ib = round16(static_cast<size_t>(N) * 4);
  int32_t* keys_out = reinterpret_cast<int32_t*>(p);
  int32_t* vals_in = reinterpret_cast<int32_t*>(p + ib);
  int32_t* vals_out = reinterpret_cast<int32_t*>(p + 2 * ib);
  void* temp = p + 3 * ib;
  size_t temp_bytes = scratch.bytes - 3 * ib;
  iota_kernel<<<static_cast<unsigned>(detail::ceil_div(N, 256)), 256, 0, stream>>>(vals_in, N);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, vals_in, vals_out, N, 0, id_bits(V), stream));
  embedding_backward_kernel<<<static_cast<unsigned>(N), 128, 0, stream>>>(dtable, dout, keys_out, vals_out, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
