// See engine_device.h.
#include "engine/cuda/engine_device.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_info.h"
#include "cuda/fp8.h"
#include "engine/device_plan.h"

namespace rt {

bool cuda_backend_available() { return cuda::device_count() > 0; }
int cuda_device_count() { return cuda::device_count(); }
bool cuda_fp8_supported(MatmulMode mode, std::string* why) {
  if (cuda::device_count() == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return cuda::fp8_supported(0, mode, why);
}

namespace cuda {

uint64_t op_scratch_bytes(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& o) {
  const int64_t N = B * T;
  const std::vector<int64_t> numel = unit_numels(s);
  // MoE: the permuted rows and every expert's activations (cuda/ops.h)
  const uint64_t moe = s.is_moe() ? moe_scratch_bytes(MoeDims{N, s.hidden, s.moe.n_experts, s.moe.top_k,
                                                              s.moe.expert_intermediate, s.moe.norm_topk_prob})
                                  : 0;
  return std::max({moe, rms_norm_backward_scratch_bytes(N, s.hidden),
                   rms_norm_backward_scratch_bytes(N * std::max(s.n_heads, s.n_kv_heads), s.head_dim),
                   attention_backward_scratch_bytes(B, T, s.n_heads),
                   lm_head_cross_entropy_scratch_bytes(o.ce_chunk_rows, s.vocab),
                   embedding_backward_scratch_bytes(N, s.vocab), sum_squares_scratch_bytes(numel[0]),
                   sum_squares_scratch_bytes(numel[s.n_layers + 1]), sum_squares_scratch_bytes(numel[1])});
}

uint64_t device_budget(const CudaOptions& o) {
  RT_CHECK(device_count() > 0, "[cuda] no CUDA device is visible; use --device cpu");
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  uint64_t b = free_b > (512ull << 20) ? free_b - (512ull << 20) : free_b;  // leave room for the CUDA context
  if (o.max_gpu_memory) {
    if (o.max_gpu_memory > b)
      fail("[cuda] --max-gpu-memory ", o.max_gpu_memory >> 20, " MiB is more than the ", b >> 20,
           " MiB the device has free");
    b = o.max_gpu_memory;
  }
  RT_CHECK(b > o.fp8_reserve, "[cuda] --matmul fp8 needs ", o.fp8_reserve >> 20,
           " MiB of device memory for its quantized operands, more than the ", b >> 20, " MiB budget");
  return b - o.fp8_reserve;
}

// The vocabulary may be any size: the LM head runs on cuda::lm_head_rows(V)
// device rows (engine/device_plan.h device_unit_numels).
void check_cuda_shapes(const ModelSpec& s) {
  auto mult8 = [&](int64_t v, const char* what) {
    RT_CHECK(v % 8 == 0, "[cuda] ", what, " = ", v, " must be a multiple of 8 for the CUDA kernels; use --device cpu");
  };
  // RAMTRAIN_ATTENTION=masked's windows and soft cap: the fallback kernel (cuda/attention_masked.cu)
  // takes head_dim % 32 == 0 (every head_dim the fused kernels take below is one)
  RT_CHECK((s.local_layers.empty() && s.attn_softcap == 0.0) || s.head_dim % 32 == 0, "[cuda] head_dim ", s.head_dim,
           " with sliding windows or attention soft-capping needs a multiple of 32 on CUDA; use --device cpu");
  mult8(s.hidden, "hidden_size");
  if (!s.is_moe()) mult8(s.intermediate, "intermediate_size");
  if (s.is_moe() && s.moe.shared_intermediate > 0)
    mult8(s.moe.shared_intermediate, "shared_expert_intermediate_size");  // the dense GEMMs' widths
  RT_CHECK(!s.is_moe() || s.moe.top_k <= 32, "[cuda] num_experts_per_tok = ", s.moe.top_k,
           " is more than the CUDA MoE kernels hold (32); use --device cpu");
  mult8(s.q_dim(), "heads x head_dim");
  mult8(s.kv_dim(), "kv heads x head_dim");
  RT_CHECK(s.head_dim == 64 || s.head_dim == 96 || s.head_dim == 128 || s.head_dim == 256, "[cuda] head_dim ",
           s.head_dim, " is not supported by the CUDA attention kernels (64, 96, 128 or 256); use --device cpu");
}

}  // namespace cuda
}  // namespace rt
