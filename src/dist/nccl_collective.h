// NcclCollective: dist/collective.h over NCCL, one process per GPU. Built only
// with CUDA (RAMTRAIN_HAVE_CUDA); buffers are device memory; every call is
// enqueued on `stream` (the collectives' own stream) and returns without
// waiting: the caller orders it against compute with events. Sums follow
// NCCL's algorithm (not rank order; deterministic for a fixed world,
// algorithm and topology). barrier() and all_reduce_sum synchronize the
// stream (all_reduce_sum's data is host memory: it stages through the device).
// make_nccl_collective sets NCCL_NVLS_ENABLE=0 (NVLink multicast off, as the
// GPU machines' notes require; it overrides the environment), then
// exchanges NCCL's unique id through the TCP store (dist/tcp_store.h).
#pragma once
#include <memory>

#include "dist/collective.h"
#include "dist/launch.h"

namespace rt {

// Selects GPU c.local_rank and joins the world described by c. timeout_s bounds the id exchange.
std::unique_ptr<Collective> make_nccl_collective(const LaunchConfig& c, double timeout_s = 300);

}  // namespace rt
