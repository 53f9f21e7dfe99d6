#include "dist/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "dist/tcp_store.h"

#define RT_NCCL_CHECK(call)                                                                                      \
  do {                                                                                                           \
    const ncclResult_t rt_nccl_r = (call);                                                                       \
    if (rt_nccl_r != ncclSuccess)                                                                                \
      ::rt::fail("[nccl] ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", ncclGetErrorString(rt_nccl_r)); \
  } while (0)
#define RT_CUDART_CHECK(call)                                                                                    \
  do {                                                                                                           \
    const cudaError_t rt_cuda_r = (call);                                                                        \
    if (rt_cuda_r != cudaSuccess)                                                                                \
      ::rt::fail("[nccl] ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", cudaGetErrorString(rt_cuda_r)); \
  } while (0)

namespace rt {

namespace {

class NcclCollective final : public Collective {
 public:
  NcclCollective(const LaunchConfig& c, const ncclUniqueId& id) : rank_(c.rank), world_(c.world) {
    RT_CUDART_CHECK(cudaSetDevice(c.local_rank));
    RT_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RT_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
  }
  NcclCollective(ncclComm_t parent, int rank, int world) : rank_(rank), world_(world) {
    RT_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RT_NCCL_CHECK(ncclCommSplit(parent, 0, rank_, &comm_, nullptr));
  }
  ~NcclCollective() override {
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void reduce_scatter_sum(const float* in, float* out, int64_t count) override {
    RT_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, stream_));
  }
  void all_gather(const float* in, float* out, int64_t count) override {
    RT_NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(count), ncclFloat32, comm_, stream_));
  }
  void all_gather(const uint16_t* in, uint16_t* out, int64_t count) override {
    // bf16 bits moved as bytes: a gather does no arithmetic (and ncclBfloat16 is not in every nccl.h)
    RT_NCCL_CHECK(ncclAllGather(in, out, 2 * static_cast<size_t>(count), ncclUint8, comm_, stream_));
  }
  void all_reduce_sum(double* data, int64_t count) override {
    const size_t bytes = static_cast<size_t>(count) * sizeof(double);
    if (scratch_bytes_ < bytes) {
      if (scratch_) RT_CUDART_CHECK(cudaFree(scratch_));
      RT_CUDART_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    RT_CUDART_CHECK(cudaMemcpyAsync(scratch_, data, bytes, cudaMemcpyHostToDevice, stream_));
    RT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, static_cast<size_t>(count), ncclFloat64, ncclSum, comm_, stream_));
    RT_CUDART_CHECK(cudaMemcpyAsync(data, scratch_, bytes, cudaMemcpyDeviceToHost, stream_));
    RT_CUDART_CHECK(cudaStreamSynchronize(stream_));
  }
  void barrier() override {
    double x = 0;
    all_reduce_sum(&x, 1);
  }
  void* device_stream() const override { return stream_; }
  std::unique_ptr<Collective> split() override { return std::make_unique<NcclCollective>(comm_, rank_, world_); }

 private:
  int rank_, world_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(const LaunchConfig& c, double timeout_s) {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);  // always off (the machines' notes); before NCCL reads it
  ncclUniqueId id{};
  if (c.rank == 0) RT_NCCL_CHECK(ncclGetUniqueId(&id));
  const std::string mine(reinterpret_cast<const char*>(&id), sizeof id);
  const std::string got = tcp_store_exchange(c, mine, timeout_s);
  RT_CHECK(got.size() == sizeof id, "[nccl] the store sent a ", got.size(), "-byte unique id, NCCL's is ", sizeof id);
  std::memcpy(&id, got.data(), sizeof id);
  return std::make_unique<NcclCollective>(c, id);
}

}  // namespace rt
