// make_cuda_backend (engine/backend.h): the stream engine with the largest
// plan that fits, shrinking it one change at a time (CudaOptions::fit).
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "core/error.h"
#include "cuda/fp8.h"
#include "engine/backend.h"
#include "engine/cuda/engine_device.h"
#include "engine/cuda/stream_engine.h"
#include "engine/device_plan.h"

namespace rt {

std::unique_ptr<Backend> make_cuda_backend(HostState& state, int64_t micro_batch, int64_t seq_len,
                                           const CudaOptions& opt) {
  CudaOptions o = opt;
  if (matmul_is_fp8(o.matmul)) {
    std::string why;
    RT_CHECK(cuda_fp8_supported(o.matmul, &why), "[cuda] --matmul fp8: ", why);
    const MatmulMode r = o.matmul;
    // the FP8 linears' workspace (cuda/fp8.h), for the largest projection at a
    // micro-batch's tokens (an MLP chunk needs less): outside the plan, held back
    const ModelSpec& s = state.spec();
    const int64_t N = micro_batch * seq_len, C = s.hidden;
    const int64_t F = s.is_moe() ? s.moe.shared_intermediate : s.intermediate;
    uint64_t ws = 0, layer_codes = 0;
    for (auto [I, O] : {std::pair<int64_t, int64_t>{C, s.q_dim()}, {C, s.kv_dim()}, {s.q_dim(), C}, {C, F}, {F, C}})
      if (I > 0 && O > 0) ws = std::max<uint64_t>(ws, cuda::fp8_linear_workspace_bytes(N, I, O, r));
    // one layer's weight codes, kept across its micro-batches in layer-major
    // (Fp8Linear::share_weights): q, k, v, o, gate, up, down
    for (auto [I, O] : {std::pair<int64_t, int64_t>{C, s.q_dim()},
                        {C, s.kv_dim()},
                        {C, s.kv_dim()},
                        {s.q_dim(), C},
                        {C, F},
                        {C, F},
                        {F, C}})
      if (I > 0 && O > 0) layer_codes += cuda::fp8_shared_weight_bytes(O, I, r);
    // + the input shared by q/k/v and by gate/up, along both dims (Fp8Linear::share_input)
    o.fp8_reserve = ws + layer_codes + cuda::fp8_shared_input_bytes(N, C, r) + cuda::kFp8GemmWorkspace;
  }
  o.muon = state.update_rule() == UpdateRule::muon;      // whole-unit updates, NS5 on the GPU (CudaOptions::muon)
  o.mlp_chunk_held = o.fit && o.mlp_chunk_tokens == -1;  // auto chunking: the fit chain's last step
  for (;;) {
    try {
      return cuda::make_stream_engine(state, micro_batch, seq_len, o);
    } catch (const cuda::DeviceBudgetError& e) {
      if (!o.fit) throw;
      // The next smaller plan, one change at a time (CudaOptions::fit).
      std::string change;
      if (!shrink_plan(o, &change))
        throw cuda::DeviceBudgetError(cat(e.what(), " (this is already the smallest plan the engine has for ",
                                          micro_batch, " x ", seq_len, " tokens per micro-batch)"));
      if (o.verbose) std::printf("cuda engine: the plan does not fit (%s); trying %s\n", e.what(), change.c_str());
    } catch (const cuda::HostBudgetError& e) {
      // Layer-major keeps the block inputs of every micro-batch; when the host
      // cannot pin them, auto falls back to micro-batch-major (one set).
      if (!(o.fit && o.layer_major == "auto" && o.micro_batches > 1)) throw;
      if (o.grads == "fold")  // fold needs layer-major with several micro-batches: say why it cannot stay on
        throw cuda::HostBudgetError(cat(e.what(), "; --grads fold needs layer-major with ", o.micro_batches,
                                        " micro-batches (every layer's input for every token of the step): use fewer "
                                        "tokens per step (--grad-accum), or --grads host"));
      o.layer_major = "off";
      if (o.verbose)
        std::printf("cuda engine: %s; falling back to micro-batch-major (weights stream once per micro-batch)\n",
                    e.what());
    }
  }
}

}  // namespace rt
