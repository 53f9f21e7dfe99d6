#include "engine/cuda/weight_slots.h"
#include "engine/cuda/host_wait.h"

#include <cstring>
#include <numeric>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda/lm_head_rows.h"
#include "dist/collective.h"
#include "engine/device_plan.h"
#include "engine/sharded_optimizer.h"
#include "state/state_tier.h"

namespace rt::cuda {

HostRegistration::HostRegistration(void* p, size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("[cuda] cannot pin ", bytes >> 20, " MiB of host memory for ", what, " (", cudaGetErrorString(e),
         "). Free host RAM or use a smaller model.");
  }
  p_ = p;
}

HostRegistration::~HostRegistration() {
  if (p_) cudaHostUnregister(p_);
}

WeightSlots::WeightSlots(HostState& st, EngineDevice& dev, UpdateTracker& track, int slots, bool host_embed,
                         const GpuDataParallel& dp)
    : st_(st),
      dev_(dev),
      track_(track),
      S_(slots),
      dev_numels_(device_unit_numels(st.spec())),
      host_embed_(host_embed),
      dp_(dp) {
  auto& units = st_.units();
  const bool delayed = track_.delayed();
  const int64_t L = st_.spec().n_layers;
  split_ = units[0].shadow_master();  // split or bf16: the state's own shadows are what the device loads
  if (split_) {
    RT_CHECK(units[0].n_shadows == (delayed ? 2 : 1) && units[0].cur_shadow == 0, "[cuda] the master holds ",
             units[0].n_shadows, " shadows (current: ", units[0].cur_shadow, "); this engine needs ", delayed ? 2 : 1);
    for (int k = 0; k < (delayed ? 2 : 1); ++k)
      for (auto& u : units)
        registered_.emplace_back(u.shadow(k), static_cast<size_t>(u.numel) * 2, cat("the bf16 shadow of ", u.name));
  }
  // fp32 master: pinned bf16 shadows, exact size, filled from the master (two of each in delayed mode)
  for (int k = 0; k < (split_ ? 0 : delayed ? 2 : 1); ++k)
    for (auto& u : units) {
      shadow_[k].emplace_back(
          static_cast<size_t>(u.numel) * 2,
          cat(delayed ? "a bf16 shadow (delayed update: two per unit) of " : "the bf16 shadow of ", u.name));
      uint16_t* sh = shadow_[k].back().as<uint16_t>();
      const float* m = u.master();
      parallel_for(u.numel, 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sh[i] = f32_to_bf16(m[i]);
      });
    }
  if (!host_embed) embed_w_ = DevBuf<bf16>(dev_.alloc, dev_numel(0), "the embedding");
  head_w_ = DevBuf<bf16>(dev_.alloc, dev_numel(static_cast<size_t>(L + 1)), "the final norm and LM head");
  for (int s = 0; s < S_; ++s) slots_.emplace_back(dev_.alloc, dev_numel(1), "a layer weight slot");
  slot_layer_.assign(S_, -1);
  slot_version_.assign(S_, -1);
  slot_loaded_.resize(S_);
  slot_free_.resize(S_);
}

int64_t WeightSlots::dev_numel(size_t u) const {
  const int64_t own = dev_numels_[u];  // numel, or more for the LM head's padding rows
  return dp_.on() ? std::max(own, dp_.shard->stride(u) * dp_.weights->world()) : own;
}

// Data parallel: unit u's own slice in (once this rank's update of it is
// done), then the others' by an in-place all-gather (NCCL: the send buffer is
// the receive buffer + rank * count). The padding past numel is never read.
void WeightSlots::copy_in_gathered(size_t u, bf16* dst, const char* what, int layer) {
  track_.wait_updated(u, track_.need_version());
  const ShardRange r = dp_.shard->range(u);
  const int64_t S = dp_.shard->stride(u);
  auto span = dev_.tracer.gpu_begin(Lane::h2d, what, layer, dev_.h2d.get());
  if (r.e > r.b)
    CUDA_CHECK(cudaMemcpyAsync(dst + r.b, shadow_src(u) + r.b, static_cast<size_t>(r.e - r.b) * 2,
                               cudaMemcpyHostToDevice, dev_.h2d.get()));
  auto ws = static_cast<cudaStream_t>(dp_.weights->device_stream());
  CUDA_CHECK(cudaEventRecord(dp_slice_in_.get(), dev_.h2d.get()));
  CUDA_CHECK(cudaStreamWaitEvent(ws, dp_slice_in_.get(), 0));
  auto* d = reinterpret_cast<uint16_t*>(dst);
  dp_.weights->all_gather(d + static_cast<int64_t>(dp_.weights->rank()) * S, d, S);
  CUDA_CHECK(cudaEventRecord(dp_gathered_.get(), ws));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.h2d.get(), dp_gathered_.get(), 0));
  dev_.tracer.gpu_end(span, dev_.h2d.get());
}

void WeightSlots::gather_into_host() {
  RT_CHECK(dp_.on(), "[cuda] internal: gather_into_host without data parallelism");
  auto& units = st_.units();
  const int64_t L = st_.spec().n_layers;
  CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t u = 0; u < units.size(); ++u) {
    // the embedding's and head's own buffers, or slot 0 for the layers (reloaded on next use)
    RT_CHECK(embed_w_.data(), "[cuda] internal: a data-parallel rank keeps its embedding on the device");
    bf16* dst = u == 0 ? embed_w_.data() : u == static_cast<size_t>(L + 1) ? head_w_.data() : slots_[0].data();
    if (u >= 1 && u <= static_cast<size_t>(L)) slot_layer_[0] = -1;
    copy_in_gathered(u, dst, "gather", static_cast<int>(u) - 1);
    CUDA_CHECK(cudaMemcpyAsync(shadow(0, u), dst, static_cast<size_t>(units[u].numel) * 2, cudaMemcpyDeviceToHost,
                               dev_.h2d.get()));
    CUDA_CHECK(cudaStreamSynchronize(dev_.h2d.get()));
  }
  embed_version_ = head_version_ = -1;  // their buffers hold the current weights, but reload to keep it simple
}

const uint16_t* WeightSlots::shadow_src(size_t u) const {
  if (paged_) {  // only the host embedding's gathers read a table on the host: the engine's copy
    RT_CHECK(u == 0 && host_embed_, "[cuda] internal: unit ", u, "'s shadow is paged (--state-dir)");
    return embed_copy_.data();
  }
  const int k = track_.delayed() ? static_cast<int>(track_.need_version() % 2) : 0;
  return split_ ? st_.units()[u].shadow(k) : shadow_[k][u].as<uint16_t>();
}

// Queues on h2d the copy of unit u's current shadow into dst, piece by piece
// as the optimizer's chunks of that unit finish.
void WeightSlots::copy_in_as_updated(size_t u, bf16* dst, const char* what, int layer) {
  if (dp_.on()) return copy_in_gathered(u, dst, what, layer);
  const int64_t need = track_.need_version(), n = st_.units()[u].numel;
  const uint16_t* src = shadow_src(u);
  int64_t issued = 0;
  Tracer::Span span;
  while (issued < n) {
    int64_t ready = 0;
    {
      HostWait hw("wait: a unit's update (weights to load)");
      ready = track_.wait_ready(u, need, n, issued);
    }
    if (issued == 0) span = dev_.tracer.gpu_begin(Lane::h2d, what, layer, dev_.h2d.get());
    CUDA_CHECK(cudaMemcpyAsync(dst + issued, src + issued, static_cast<size_t>(ready - issued) * 2,
                               cudaMemcpyHostToDevice, dev_.h2d.get()));
    issued = ready;
  }
  dev_.tracer.gpu_end(span, dev_.h2d.get());
}

void WeightSlots::ensure_unit(size_t u, DevBuf<bf16>& dst, int64_t& have_version, Event& loaded) {
  if (paged_) return track_.wait_updated(u, track_.need_version());  // uploaded by its update (upload_paged)
  if (have_version == track_.need_version()) return;
  copy_in_as_updated(u, dst.data(), u == 0 ? "load embed" : "load head", -1);
  zero_lm_head_padding(u, dst.data(), dev_.h2d.get());
  dev_.h2d_bytes += static_cast<uint64_t>(st_.units()[u].numel) * 2 / (dp_.on() ? dp_.weights->world() : 1);
  CUDA_CHECK(cudaEventRecord(loaded.get(), dev_.h2d.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), loaded.get(), 0));
  have_version = track_.need_version();
}

// The LM head's rows past the vocabulary (cuda/lm_head_rows.h) are zero on
// the device, whatever the load or the all-gather left there: the LM head is
// the unit's last tensor (the embedding when tied, else the head's).
void WeightSlots::zero_lm_head_padding(size_t u, bf16* dst, cudaStream_t stream) {
  const ModelSpec& s = st_.spec();
  const size_t lm_unit = s.tie_embeddings ? 0 : static_cast<size_t>(s.n_layers + 1);
  const int64_t V = s.vocab, C = s.hidden, Vr = lm_head_rows(V);
  if (u != lm_unit || Vr == V) return;
  const StateUnit& un = st_.units()[u];
  const WeightKind k = un.entries.back().kind;
  RT_CHECK(k == WeightKind::lm_head || k == WeightKind::embed,
           "[cuda] internal: the LM head is not the last tensor of ", un.name);
  RT_CHECK(un.offsets.back() + Vr * C <= dev_numel(u), "[cuda] internal: no room for the LM head's padding rows");
  CUDA_CHECK(cudaMemsetAsync(dst + un.offsets.back() + V * C, 0, static_cast<size_t>((Vr - V) * C) * 2, stream));
}

void WeightSlots::ensure_head() {
  ensure_unit(static_cast<size_t>(st_.spec().n_layers + 1), head_w_, head_version_, head_loaded_);
}

void WeightSlots::load_layer(int64_t i) {
  if (paged_) return track_.wait_updated(static_cast<size_t>(i + 1), track_.need_version());  // upload_paged
  const int s = static_cast<int>(i % S_);
  if (slot_layer_[s] == i && slot_version_[s] == track_.need_version()) return;
  if (slot_layer_[s] >= 0) CUDA_CHECK(cudaStreamWaitEvent(dev_.h2d.get(), slot_free_[s].get(), 0));
  copy_in_as_updated(static_cast<size_t>(i + 1), slots_[s].data(), "load", static_cast<int>(i));
  dev_.h2d_bytes += static_cast<uint64_t>(st_.units()[i + 1].numel) * 2 / (dp_.on() ? dp_.weights->world() : 1);
  CUDA_CHECK(cudaEventRecord(slot_loaded_[s].get(), dev_.h2d.get()));
  slot_layer_[s] = i;
  slot_version_[s] = track_.need_version();
}

const bf16* WeightSlots::use_layer(int64_t i) {
  const int s = static_cast<int>(i % S_);
  load_layer(i);                        // no-op when prefetched
  if (paged_) return slots_[s].data();  // its upload was done before the unit was marked updated
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), slot_loaded_[s].get(), 0));
  return slots_[s].data();
}

void WeightSlots::release_layer(int64_t i) {
  CUDA_CHECK(cudaEventRecord(slot_free_[static_cast<int>(i % S_)].get(), dev_.compute.get()));
}

std::string WeightSlots::paging_refusal() const {
  if (dp_.on()) return "a data-parallel rank's optimizer state is sharded, not paged";
  if (!split_) return "";  // fp32 master: the device loads the engine's own pinned shadows; the master pages
  if (track_.delayed())
    return "the CUDA engine pages a split or bf16 master only without --delayed-update (its two shadows: not built)";
  const int64_t L = st_.spec().n_layers;
  if (S_ < L)
    return cat(
        "the CUDA engine pages a split or bf16 master (the bf16 weights it loads) only with every layer in its "
        "own device slot: add --resident (",
        (dev_numel(1) * 2 * L) >> 20,
        " MiB of layers on the device; if the device plan does not fit then, a larger --max-gpu-memory or card). "
        "Reading the weights ahead of the forward and backward from the file instead is not built");
  return "";
}

void WeightSlots::page_weights() {
  const std::string why = paging_refusal();
  RT_CHECK(why.empty(), "[cuda] internal: the weights cannot page: ", why);
  if (!split_) return;                  // fp32 master: nothing the device loads leaves RAM
  CUDA_CHECK(cudaDeviceSynchronize());  // no copy from a shadow in flight
  registered_.clear();                  // unpinned: the tier frees these buffers
  if (host_embed_) embed_copy_.resize(static_cast<size_t>(st_.units()[0].numel));
  paged_ = true;
}

// Stream order. Write after read: the caller updated u after u's gradient
// reached the host, and that gradient's copy-out was queued on the compute
// stream behind every use of u's weights in the step (a layer's recompute and
// backward, the head's, the embedding's forward; device gradients: behind
// the whole backward), so no kernel still reads dst. Read after write: this
// returns once the copy is done, before the caller marks u updated; the
// compute thread queues u's next use only after waiting for that mark
// (load_layer, ensure_unit, the host embedding's gather). The source may be
// pageable (the tier's buffers are plain allocations): the driver stages it
// through its own pinned buffers, and the synchronize below makes the copy's
// end explicit, so the tier may free or reuse src as soon as this returns.
void WeightSlots::upload_paged(size_t u) {
  if (!paged_) return;
  const StateUnit& un = st_.units()[u];
  const uint16_t* src = un.shadow(0);
  RT_CHECK(src && !un.paged_out, "[cuda] internal: unit ", un.name, " is not paged in for its upload");
  const size_t bytes = static_cast<size_t>(un.numel) * 2;
  const size_t L = static_cast<size_t>(st_.spec().n_layers);
  if (u == 0 && host_embed_) {  // the gathers' table (HostEmbedding), on the host
    std::memcpy(embed_copy_.data(), src, bytes);
    return;
  }
  bf16* dst = u == 0       ? embed_w_.data()
              : u == L + 1 ? head_w_.data()
                           : slots_[static_cast<size_t>((u - 1) % static_cast<size_t>(S_))].data();
  auto span = dev_.tracer.gpu_begin(Lane::h2d, "upload", static_cast<int>(u) - 1, upload_.get());
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, upload_.get()));
  zero_lm_head_padding(u, dst, upload_.get());
  dev_.tracer.gpu_end(span, upload_.get());
  CUDA_CHECK(cudaStreamSynchronize(upload_.get()));
}

void WeightSlots::upload_all_paged() {
  if (!paged_) return;
  std::vector<size_t> all(st_.units().size());
  std::iota(all.begin(), all.end(), size_t{0});
  if (StateTier* t = st_.tier())
    t->for_each(
        all, [&](size_t u) { upload_paged(u); }, false);  // clean: nothing written back
  else
    for (size_t u : all) upload_paged(u);
}

}  // namespace rt::cuda
