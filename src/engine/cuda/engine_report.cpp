#include "engine/cuda/engine_report.h"

#include <cstdio>

#include "core/error.h"
#include "dist/collective.h"
#include "engine/sharded_optimizer.h"
#include "engine/step_model.h"
#include "optim/muon.h"

namespace rt::cuda {

void print_engine_setup(const EngineSetup& e) {
  const int S = e.slots;
  std::printf(
      "cuda engine: %s, %d weight slot%s of %.1f MiB, gradients on %s, checkpoints on %s, "
      "embedding on %s, activations of %lld of %lld layers kept (%.2f GiB), the attention half of %lld more "
      "(%.2f GiB; the others are recomputed whole: hardware/model FLOPs %.3f), "
      "%s, %s, device memory %.2f GiB planned of %.2f GiB budget\n",
      e.opt.resident ? "resident" : "streaming", S, S == 1 ? "" : "s", e.st.units()[1].numel * 2.0 / (1 << 20),
      cat(e.place.fold         ? "host (per layer, folded into the update as they land"
          : e.place.host_grads ? "host (per layer"
                               : "device",
          e.place.host_grads ? (e.opt.muon && e.opt.grads == "auto" ? ": Muon needs whole gradients)" : ")") : "")
          .c_str(),
      e.place.host_ckpt ? "host" : "device", e.place.host_embed ? "host" : "device", (long long)e.keep,
      (long long)e.st.spec().n_layers, e.keep * e.act_bytes / double(1ull << 30), (long long)e.attn_keep,
      e.attn_keep * e.attn_bytes / double(1ull << 30),
      hardware_flops_per_token(e.st.spec(), e.dm, e.keep, e.attn_keep) / model_flops_per_token(e.st.spec(), e.dm.T),
      e.place.layer_major ? cat("layer-major over ", e.K, " micro-batches").c_str() : "micro-batch-major",
      e.dm.mlp_chunked() ? cat("MLP in chunks of ", e.dm.mlp_rows(), " tokens").c_str() : "MLP unchunked",
      e.alloc.used() / double(1ull << 30), e.alloc.budget() / double(1ull << 30));
  if (e.muon) std::printf("%s\n", e.muon->describe().c_str());
  const uint64_t host =
      e.st.bytes_total() + e.weights_pinned +
      (e.muon ? e.muon->pinned_bytes() + muon_scratch_bytes(e.st.spec(), e.st.units()[0].master_kind,
                                                            e.st.units()[0].quantized(), e.muon->lanes() > 0)
              : 0);
  if (e.dp.on()) {
    const uint64_t hb = e.st.bytes_total() + e.dp.shard->state_bytes();
    std::printf(
        "host RAM (this rank): %.2f GiB, %.3f B/param (bf16 weights, pinned; fp32 master + Adam m, v of its "
        "1/%d slices: %.2f GiB)\n",
        hb / double(1ull << 30), hb / double(e.st.n_params()), e.dp.grads->world(),
        e.dp.shard->state_bytes() / double(1ull << 30));
  } else {
    std::printf("host RAM: %.2f GiB, %.3f B/param (%s master, %s %s, pinned bf16 shadows%s)\n",
                host / double(1ull << 30), host / double(e.st.n_params()), master_storage_name(e.st.master_storage()),
                e.muon ? "Muon momentum + Adam m, v of the other tensors" : "Adam m, v",
                e.st.moment_storage() == MomentStorage::fp32 ? "fp32" : moment_storage_name(e.st.moment_storage()),
                e.place.fold         ? (e.place.host_embed ? ", the embedding's fp32 gradient" : "")
                : e.place.host_grads ? ", fp32 gradients"
                                     : "");
  }
}

}  // namespace rt::cuda
