// Collective: the few collectives data parallelism needs, behind one
// interface with two implementations: LoopbackWorld (dist/loopback.h: N ranks
// as N threads of one process, host memory, the CPU twin CI tests) and
// NcclCollective (dist/nccl_collective.h: one process per GPU, device memory,
// built only with CUDA).
// Contracts, for every implementation:
//  - every rank calls the same collectives in the same order with the same
//    counts (a mismatch is a bug of the caller: LoopbackWorld checks it);
//  - buffers are where the implementation's memory is (host for loopback,
//    device for NCCL) and in/out never overlap;
//  - reduce_scatter_sum: in holds world() chunks of `count` floats, chunk r
//    destined for rank r; out receives the sum over ranks of their chunk
//    rank(). LoopbackWorld sums in rank order (rank 0's contribution first,
//    then 1, ...), so results are bit-identical run to run and equal to a
//    serial loop over ranks; NCCL sums in its algorithm's order (fixed for a
//    fixed world, algorithm and topology, but not rank order);
//  - all_reduce_sum of doubles: every rank receives the same values (rank
//    order in LoopbackWorld, so every rank holds the same bits);
//  - all_gather: out receives world() chunks of `count`, chunk r from rank r.
//  - device_stream(): NCCL's stream (a cudaStream_t; null for host
//    implementations): callers order device work against it with events;
//  - split(): a second communicator over the same ranks, with its own order
//    of operations (NCCL: ncclCommSplit), for collectives issued
//    independently of this one's (a GPU rank's weight all-gathers beside its
//    gradient reduce-scatters).
#pragma once
#include <cstdint>
#include <memory>

namespace rt {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual void reduce_scatter_sum(const float* in, float* out, int64_t count) = 0;
  virtual void all_gather(const float* in, float* out, int64_t count) = 0;
  virtual void all_gather(const uint16_t* in, uint16_t* out, int64_t count) = 0;  // bf16 bits
  virtual void all_reduce_sum(double* data, int64_t count) = 0;                   // in place
  virtual void barrier() = 0;
  virtual void* device_stream() const { return nullptr; }
  virtual std::unique_ptr<Collective> split() = 0;
};

}  // namespace rt
