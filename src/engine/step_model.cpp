#include "engine/step_model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "engine/fold_clip.h"

namespace rt {

namespace {

constexpr uint64_t GiB = 1ull << 30;

// ---- cards: datasheet leads, not measurements --------------------------
// bf16 dense TFLOP/s with fp32 accumulate (what the engine's GEMMs use):
// NVIDIA's datasheets / architecture whitepapers. GeForce cards run fp32
// accumulate at half the fp16-accumulate rate: RTX 3080 59.5, 3090 71,
// 4090 165.2, 5090 209.5; A100 312; H100 SXM and H200 989 (dense, no
// sparsity). Memory: the card's nominal size (the RTX 3080 10 GB model).
// PCIe: practical host<->device rates with pinned memory, gen4 x16 ~25 GB/s,
// gen5 x16 ~50 GB/s (theoretical 32 / 64 GB/s per direction).
constexpr double kPcieGen4Gbs = 25.0;
constexpr double kPcieGen5Gbs = 50.0;
struct CardRow {
  const char* name;
  double memory_gib;
  double tflops;
  double pcie;
  double fp8_tflops;  // dense e4m3 with fp32 accumulate; 0: no FP8 tensor cores (Ampere)
  bool fp8_path;      // ramtrain's --matmul fp8 runs there: cuBLASLt's block scaling is Hopper's (docs/fp8.md)
  double gemm_peak;   // bf16 GEMM TFLOP/s measured on the card (large cuBLAS GEMMs); 0: none, see kGemmShareOfDatasheet
  double memory_tbs;  // device memory bandwidth (datasheet TB/s): the per-tensor FP8 estimate's quantizer time
};
// Measured GEMM peaks. H100 SXM / H200: cuBLASLt bf16 GEMMs on Qwen2.5-7B's
// shapes, 824-848 TFLOP/s in our own runs (bench/RESULTS.md): 839. RTX
// 4090: torch.matmul fp16 with fp32 accumulate (cuBLAS), 158.6 TFLOP/s at
// n = 8192 and 167 at n = 2048 (github.com/mli/transformers-benchmarks
// issue 4): 158, i.e. 0.96 of the 165 datasheet (GeForce boost clocks run
// above the datasheet's); LLMQ's published 4090 steps (bf16, 7B, block
// recompute) imply >= 142 TFLOP/s of hardware FLOPs over whole steps, so
// the card's GEMMs do reach ~0.9 of the datasheet. Other cards: no
// measurement at hand; their peak is taken at the H100's share of its
// datasheet (kGemmShareOfDatasheet), which leaves their predictions as they
// were before measured peaks were used.
constexpr double kHopperGemmPeak = 839;
constexpr double kGemmShareOfDatasheet = kHopperGemmPeak / 989.0;
// FP8: RTX 4090 330 (Ada whitepaper, fp32 accumulate; 660 with fp16
// accumulate), RTX 5090 419 (Blackwell GeForce datasheet, fp32 accumulate),
// H100 SXM / H200 1979 (dense, without sparsity). Memory: 3080 0.76, 3090
// 0.936, 4090 1.008, 5090 1.792, A100 40GB 1.555, H100 SXM 3.35, H200 4.8 TB/s.
// Per-tensor FP8 (--fp8-scaling tensor) runs wherever FP8 tensor cores are
// (cuBLASLt's per-tensor FP8 GEMM: sm_89 and newer; cuda/fp8.cu fp8_supported).
constexpr CardRow kCards[] = {
    {"rtx3080", 10, 59.5, kPcieGen4Gbs, 0, false, 0, 0.76},
    {"rtx3090", 24, 71, kPcieGen4Gbs, 0, false, 0, 0.936},
    {"rtx4090", 24, 165, kPcieGen4Gbs, 330, false, 158, 1.008},
    {"rtx5090", 32, 209, kPcieGen5Gbs, 419, false, 0, 1.792},
    {"a100-40g", 40, 312, kPcieGen4Gbs, 0, false, 0, 1.555},
    {"h100", 80, 989, kPcieGen5Gbs, 1979, true, kHopperGemmPeak, 3.35},
    {"h200", 141e9 / GiB, 989, kPcieGen5Gbs, 1979, true, kHopperGemmPeak, 4.8},  // 141 GB (139 GiB as the driver reports it)
};

// The CUDA context, cuBLAS(Lt) handles and workspace, outside the engine's
// budget: bench/RESULTS.md (2026-12-03, --low-memory): process 7.11 GiB for
// 6.53 GiB of engine allocations, 0.58 GiB; rounded up.
constexpr uint64_t kContextBytes = 640ull << 20;

// ---- calibration (bench/RESULTS.md) -------------------------------------
// The share of the card's bf16 GEMM peak the engine's kernels reach over a
// whole step (GEMMs, attention, norms, element-wise ops), on hardware FLOPs
// as counted here. Calibrated on the compute-bound step: Qwen2.5-7B, 32 x
// 2048, the exact default, on the H100 (2026-12-07, twenty-first session,
// build 2827865; 7 attention halves kept, hardware/model 1.209): 6.226 s a
// step. In this model that step is compute c plus the CPU optimizer (1.904 s
// at 4 Gparam/s) less the forward share of c it runs under (0.276 c), so c
// = 5.966 s for 65536 x 52.80 GFLOP: 580.0 TFLOP/s, 0.691 of the GEMM peak
// (839 here, 843.4 measured in that run; the engine's own count was 5.89 s
// of compute-stream busy time, 1.3% less). A card's step rate is this share of
// its own GEMM peak (CardSpec::gemm_peak_tflops): the step is
// GEMM-dominated (the projections alone were ~4.7 s of the 7B's ~6 s of
// kernel time), so its rate follows what the card's GEMMs reach, not its
// datasheet. Before: 0.633, from the H200's 7B step at 32 x 2048 with
// --delayed-update and every layer recomputed (2026-12-03: 531 TFLOP/s);
// the engine's kernels have become faster since (that row, measured on the
// older build, now predicts 9.4% short, bench/plan_check.sh).
constexpr double kStepShareOfGemmPeak = 580.0 / kHopperGemmPeak;
// The same against the Hopper datasheet (989): a card with no GEMM peak and
// no datasheet rate.
constexpr double kComputeEfficiency = kStepShareOfGemmPeak * kHopperGemmPeak / 989.0;
// --matmul fp8 on Hopper (block scales): fitted to the end-to-end step.
// Qwen2.5-7B 32 x 2048 on the H100 (2026-12-06, one call, bench/RESULTS.md)
// ran 1.138x bf16's tokens/s once the bias gradient's kernel was fixed;
// with this model's projection share of that step (0.65 of the hardware
// FLOPs) that is a 1.23x rate on the projections. (Before the fix, 2026-12-05:
// the projections alone 1.08x in fp8_gemm_bench, the step 1.04x.) The fit
// folds in what a shorter GPU step exposes (idle 6.0% -> 12.1%).
constexpr double kFp8ProjectionGain = 1.23;

// --fp8-scaling tensor, per card:
//   gain = 1 / (1 / G + q),  G = 1.75, q = quantizer time / bf16 GEMM time,
// fitted on the H100 (2026-12-06: the 7B step at 32 x 2048 ran 1.222x bf16,
// a projection gain of 1.39, so q = 0.148 there), extrapolated to other
// cards by their GEMM peak over their memory bandwidth (an ESTIMATE there).
// G: per-tensor scaled FP8 GEMMs ran at 1444 TFLOP/s = 1.75x bf16 on the
// 7B's shapes (H100, bench/RESULTS.md); taken for every FP8 card (the 4090
// and 5090 datasheets give FP8 = 2x bf16, as Hopper's does).
// q, from bytes (Qwen2.5-7B's seven projections, N = 16384 tokens, as the
// block calibration): per layer the forward reads each input twice (amax,
// then codes) and writes its codes once, 5 B/element, for the inputs shared
// by q/k/v and gate/up once: 5 N (C + QD + C + F) = 148,480 N B; the
// backward makes dy's amax and both layouts, 6 B/element over all outputs:
// 6 N * 49,664 = 297,984 N B, and the inputs' transposed codes again
// 148,480 N B; the weights 5 B/parameter for the codes and 5 again for the
// transposed codes: 10 * 233M. Total 594,944 N + 2.33e9 = 12.1 GB at 16k, for
// 2.29e13 GEMM FLOPs: 5.28e-4 B per projection FLOP. The block quantizers
// moved ~10.5 GB in the 7.8 ms they added at 16k (1.08x vs 1.47x): 1.35 TB/s,
// 0.40 of the H100's 3.35; bf16 GEMMs ran at 720 TFLOP/s, 0.858 of its
// measured GEMM peak (839). The estimate before a GPU ran it took the block
// quantizers' share, 0.40 (H100 q 0.285 -> 1.17x); the H100's measured step
// gives q 0.148, an effective share of 0.77 of the memory bandwidth (the
// per-tensor codes kernel moves its tile in one pass; the fit also holds the
// idle a shorter step exposes, 6.0% -> 14.7%). So, with the card's GEMM peak:
//   q = 5.28e-4 * 0.858 * GEMM peak TFLOP/s / (0.77 * memory TB/s)
// H100 0.148 -> 1.39x; H200 0.103 -> 1.48x; 4090 (peak 158) 0.092 -> 1.51x;
// 5090 0.058 -> 1.59x.
constexpr double kFp8TensorGemmGain = 1.75;
constexpr double kFp8TensorQuantBytesPerFlop = 5.28e-4;
constexpr double kFp8QuantBandwidthShare = 0.77, kBf16GemmShareOfPeak = 720.0 / kHopperGemmPeak;
double fp8_tensor_gain(double gemm_peak_tflops, double memory_tbs) {
  const double q =
      kFp8TensorQuantBytesPerFlop * kBf16GemmShareOfPeak * gemm_peak_tflops / (kFp8QuantBandwidthShare * memory_tbs);
  return 1.0 / (1.0 / kFp8TensorGemmGain + q);
}

// MoE models (issue 32): the routed experts' work runs below the dense
// step's rate: the expert GEMMs (batched over 128-row chunks, the auto mode at
// these sizes), the routing, gather and combine kernels, and the host's wait
// for the expert counts in every MoE call. Their FLOPs, 6 P_e per token in
// the model count plus 4/3 P_e recomputed by every backward (cuda/moe.cu
// recomputes the experts' gate and up, not down; P_e = top_k x 3 x hidden x
// expert width per layer), run at kMoeExpertShareOfDense of the dense rate,
// and the expert weight gradients, two cuBLAS calls per expert and layer
// call (down's GEMM, and gate's and up's as one: 2 E per layer and
// micro-batch), cost kMoeWeightGradCallS each beyond that. Fitted
// on the H100 (2026-12-06, seventeenth session, one call, bench/RESULTS.md)
// on the two compute-bound steps at 128k tokens: OLMoE-1B-7B 4 x 2048 x 16
// fold 4.448 s (64 experts of 2048 x 1024: 49k weight-gradient calls a step,
// three per expert then) and Qwen3-30B-A3B lean 4 x 2048 x 16 fold 15.07 s
// (128 of 2048 x 768: 295k calls), when the backward recomputed down too (8
// P_e at a share of 0.66). One constant could not hold both models (a rate
// alone: +-16%); the per-call cost is what sets Qwen3's narrower, more
// numerous experts apart. Since then (eighteenth and nineteenth sessions:
// no down recompute, the grouped forward without the host's wait, the
// gate+up pair) OLMoE's step is 4.007 s on the H100 (nineteenth session,
// one call with the dense 7B); the share was refitted to it, 0.63, with the
// per-call cost kept and two calls per expert; and again, 0.557, when the
// dense share was recalibrated (0.633 -> 0.691, twenty-first session) on the
// same call's OLMoE steps (4.003 and 4.036 s on two H100s: 4.020), so that
// the MoE prediction stays where it was measured; and again, 0.604, when
// the backward took gate and up as one and fused SwiGLU's recompute into
// its gradient kernel (twenty-second session: 3.846 and 3.819 s on one
// H100, 3.833; still two weight-gradient calls per expert: down's, and
// gate's and up's [2F, C] GEMM). Qwen3-30B-A3B was not
// measured on these builds: its prediction moved from 15.06 to 12.3 s. The 64k
// OLMoE step (2.670 s) is under-predicted: it waits on the host, which this
// compute term does not hold. ESTIMATES on other cards.
constexpr double kMoeExpertShareOfDense = 0.604;
constexpr double kMoeExpertFlopsPerPe = 6.0 + 4.0 / 3.0;  // a token's routed expert FLOPs run, in P_e
constexpr double kMoeWeightGradCallS = 21.3e-6;
double routed_expert_params_per_token(const ModelSpec& s) {
  return static_cast<double>(s.moe.top_k * s.params_expert() * s.n_layers);
}

// Muon's Newton-Schulz on the GPU (CudaOptions::muon): Qwen2.5-7B's
// matrices, one layer's NS5 ran at 728 TFLOP/s on the device (H200,
// ramtrain_muon_bench, bench/RESULTS.md 2026-12-04), 0.868 of the GEMM
// peak; it shares the device with the step, so its time adds to the compute.
// The engine runs NS5 as lane jobs (engine/cuda/muon_gpu.h): U in as fp32,
// its norm and bf16 division, the five steps, O out. On the H100
// (2026-12-06, `tests/gpu/run.sh muonperf`, Qwen2.5-7B 16 x 2048 fold) the
// jobs took 1.534 s of device time a step against 0.762 s for the steps
// alone, and Muon's step was 1.67 s longer than AdamW's (3.10 s): the jobs'
// whole time adds, 2.01x the steps'. With it plan predicts that Muon step
// within 1% (6,934 against 6,879 tokens/s; 8,205 when only the steps counted).
constexpr double kNs5ShareOfGemmPeak = 728.0 / kHopperGemmPeak;
constexpr double kNs5JobsOverSteps = 1.534 / 0.762;

// Host gradients (--grads host): the engine's worker adds (=, then +=) every
// layer gradient landed in a pinned slab into the unit's host arena
// (engine/cuda/gradient_sink.h): ~12 B of DRAM traffic per fp32 gradient
// element, on the CPU, beside the DMA writes. Rate in GB/s of fp32 gradient
// bytes, calibrated on issue 16's 10 GiB case (7B width, 14 layers, micro-
// batch 2 x grad-accum 16, micro-batch-major: 9.8 s per step, 208 GB of layer
// gradients landed, the optimizer exposed as below): ~24 GB/s, i.e. ~70 GB/s
// of DRAM traffic, half the ~145 GB/s the host's AdamW reaches
// (bench/RESULTS.md).
constexpr double kHostGradLandGbs = 24.0;

// The host embedding's landing (engine/cuda/host_embedding.cpp), at the end
// of the backward: its fp32 gradient arena zeroed (4 B/param, the step's
// first micro-batch) and each micro-batch's bf16 dx scattered into it (2 B
// read + 4 B read and 4 B written per element). Fitted on a trace of the
// 7B's fold step (H100 host, 16 cores, 2026-12-06): 64 ms for 2.18 GB of
// zeroing and 65,536 x 3,584 scattered elements (2.35 GB), ~70 GB/s.
constexpr double kHostEmbedLandGbs = 70.0;

// Naming only, not timing: the step is called optimizer-bound when more than
// this share of it is exposed CPU optimizer (Qwen2.5-7B, 16 x 2048, default
// mode: ~25%, which bench/RESULTS.md calls bound by the optimizer).
constexpr double kOptimizerBindsShare = 0.2;

}  // namespace

bool card_lookup(const std::string& name, CardSpec* out) {
  for (const CardRow& c : kCards)
    if (name == c.name) {
      out->name = c.name;
      out->memory_bytes = static_cast<uint64_t>(c.memory_gib * GiB);
      out->bf16_tflops = c.tflops;
      out->pcie_gbs = c.pcie;
      out->fp8_tflops = c.fp8_tflops;
      out->fp8_gain = c.fp8_path ? kFp8ProjectionGain : 0.0;
      out->fp8_path = c.fp8_path;
      out->gemm_peak_tflops = c.gemm_peak > 0 ? c.gemm_peak : c.tflops * kGemmShareOfDatasheet;
      out->gemm_peak_measured = c.gemm_peak > 0;
      out->fp8_tensor_path = c.fp8_tflops > 0;
      out->memory_tbs = c.memory_tbs;
      out->fp8_tensor_gain = c.fp8_tflops > 0 ? fp8_tensor_gain(out->gemm_peak_tflops, c.memory_tbs) : 0.0;
      return true;
    }
  return false;
}

const char* card_names() { return "rtx3080|rtx3090|rtx4090|rtx5090|a100-40g|h100|h200"; }

uint64_t card_engine_budget(uint64_t memory) { return memory > kContextBytes ? memory - kContextBytes : 0; }

double model_flops_per_token(const ModelSpec& s, int64_t T) {
  // N_matmul: every layer's projections and MLP (MoE: the router and the top-k
  // experts a token uses, the active parameters), and the LM head (tied or
  // not); causal attention counted as ramtrain_bench does: 6 L H D T, T
  // the keys a query sees (sliding-window layers fewer: ModelSpec::attention_span).
  const double n_matmul = static_cast<double>(s.active_params_per_layer()) * static_cast<double>(s.n_layers) +
                          static_cast<double>(s.vocab) * static_cast<double>(s.hidden);
  return 6.0 * n_matmul + 6.0 * static_cast<double>(s.n_layers * s.n_heads * s.head_dim) * s.attention_span(T);
}

double hardware_flops_per_token(const ModelSpec& s, int64_t T, int64_t recomputed) {
  // One more block forward per recomputed layer: 2 N_layer + the attention forward (2 H D T).
  const double per_layer = 2.0 * static_cast<double>(s.active_params_per_layer()) +
                           2.0 * static_cast<double>(s.n_heads * s.head_dim) * s.attention_span(T);
  return model_flops_per_token(s, T) + static_cast<double>(recomputed) * per_layer;
}

double hardware_flops_per_token(const ModelSpec& s, const BlockDims& dm, int64_t kept, int64_t attn_kept) {
  const int64_t L = s.n_layers;
  kept = std::clamp<int64_t>(kept, 0, L);
  attn_kept = std::clamp<int64_t>(attn_kept, 0, L - kept);
  return model_flops_per_token(s, dm.T) +
         static_cast<double>(L - kept - attn_kept) * layer_recompute_flops(s, dm, KeptPart::none) +
         static_cast<double>(attn_kept) * layer_recompute_flops(s, dm, KeptPart::attention) +
         static_cast<double>(kept) * layer_recompute_flops(s, dm, KeptPart::all);
}

double projection_flops_per_token(const ModelSpec& s, const BlockDims& dm, int64_t kept, int64_t attn_kept) {
  // the projections' GEMMs a token runs: 3 passes (forward, dgrad, wgrad) of
  // 2 FLOPs per weight, and what each layer's recompute runs of them
  // (layer_recompute_flops: q/k/v/o and gate/up without the down projection
  // for a whole recompute, gate/up alone for an attention-kept layer, gate/up
  // for a kept layer whose MLP runs in chunks). MoE layers: the attention
  // projections and the shared expert (routed experts stay bf16).
  const int64_t L = s.n_layers;
  kept = std::clamp<int64_t>(kept, 0, L);
  attn_kept = std::clamp<int64_t>(attn_kept, 0, L - kept);
  const double C = static_cast<double>(s.hidden), QD = static_cast<double>(s.q_dim()),
               KD = static_cast<double>(s.kv_dim());
  const double F = static_cast<double>(s.is_moe() ? s.moe.shared_intermediate : s.intermediate);
  const double attn = 2 * C * QD + 2 * C * KD, mlp = 3 * C * F;  // q, o; k, v; gate, up, down (weights)
  const double gate_up = s.is_moe() ? 0.0 : 2 * 2 * C * F;
  const double none = 2 * attn + gate_up, attention = gate_up, all = !s.is_moe() && dm.mlp_chunked() ? gate_up : 0.0;
  return 6.0 * (attn + mlp) * static_cast<double>(L) + static_cast<double>(L - kept - attn_kept) * none +
         static_cast<double>(attn_kept) * attention + static_cast<double>(kept) * all;
}

StepPrediction predict_step(const ModelSpec& s, int64_t B, int64_t T, const DevicePlan& plan, const CardSpec& card,
                            double gparams, MatmulMode matmul) {
  StepPrediction r;
  const DevicePlacement& p = plan.place;
  const double L = static_cast<double>(s.n_layers), K = static_cast<double>(p.micro_batches);
  const double N = static_cast<double>(B * T), C = static_cast<double>(s.hidden);
  const double tokens = K * N;
  // ---- compute
  r.model_flops_per_token = model_flops_per_token(s, T);
  r.hardware_flops_per_token =
      hardware_flops_per_token(s, BlockDims{B, T, plan.mlp_chunk_tokens}, plan.kept_layers, plan.attn_kept_layers);
  // the share of the datasheet rate: kStepShareOfGemmPeak of the card's GEMM
  // peak (a custom card without one: the H100's share of its datasheet)
  const double gemm_peak = card.gemm_peak_tflops > 0 ? card.gemm_peak_tflops : card.bf16_tflops * kGemmShareOfDatasheet;
  r.efficiency = card.bf16_tflops > 0 ? kStepShareOfGemmPeak * gemm_peak / card.bf16_tflops : kComputeEfficiency;
  r.gemm_peak_tflops = gemm_peak;
  if (matmul_is_fp8(matmul)) {
    RT_CHECK(card.fp8_tflops > 0, "[plan] --matmul fp8 needs the card's FP8 rate");
    r.fp8_flops_per_token = projection_flops_per_token(s, BlockDims{B, T, plan.mlp_chunk_tokens}, plan.kept_layers,
                                                       plan.attn_kept_layers);
  }
  const double gain = matmul == MatmulMode::fp8_tensor ? card.fp8_tensor_gain : card.fp8_gain;
  const double fp8_rate = gain > 0 ? card.bf16_tflops * gain : card.fp8_tflops;
  r.compute_s = tokens *
                ((r.hardware_flops_per_token - r.fp8_flops_per_token) / (card.bf16_tflops * 1e12) +
                 (r.fp8_flops_per_token > 0 ? r.fp8_flops_per_token / (fp8_rate * 1e12) : 0.0)) /
                r.efficiency;
  if (const double pe = routed_expert_params_per_token(s); pe > 0) {  // the routed experts at their own rate (above)
    r.compute_s += tokens * (kMoeExpertFlopsPerPe * pe / kMoeExpertShareOfDense - 6.0 * pe) /
                   (card.bf16_tflops * 1e12) / r.efficiency;
    r.compute_s += L * K * 2.0 * static_cast<double>(s.moe.n_experts) * kMoeWeightGradCallS;
  }
  MuonStepWork ns5;
  if (plan.options.muon) {  // NS5 on the same device: its time adds to the compute, its copies to the PCIe's
    ns5 = muon_step_work(s);
    r.ns5_s = ns5.flops / (gemm_peak * 1e12 * kNs5ShareOfGemmPeak) * kNs5JobsOverSteps;
    r.compute_s += r.ns5_s;
  }
  // ---- copies (bytes per step)
  const std::vector<int64_t> numel = unit_numels(s);
  const double layer = static_cast<double>(numel[1]), embed = static_cast<double>(numel[0]),
               head = static_cast<double>(numel.back());
  const double S = std::min(static_cast<double>(p.slots), L);
  // Weight loads (bf16): a slot is reloaded only when its layer or the
  // weights' version changed (engine/cuda/weight_slots.h). Resident: every
  // layer once per step (after its update). Streaming, per pass over the
  // layers: forward 0..L-1 then backward L-1..0, the last S layers reused at
  // the turn-around and the first S at the turn to the next micro-batch's
  // forward: first forward L, then 2 (L - S) - ... = 2 K (L - S) + S per step
  // micro-batch-major; layer-major passes once: 2 L - S.
  double layer_loads = S >= L ? L : p.layer_major ? 2 * L - S : 2 * K * (L - S) + S;
  r.h2d_bytes = 2 * (layer * layer_loads + head + (p.host_embed ? 0 : embed));
  // fp32 gradients out: host gradients leave per layer per backward pass
  // (micro-batch-major: K passes; layer-major: one); device gradients leave
  // once per step in the optimizer phase. The head's (and a device
  // embedding's) once per step.
  const double grad_passes = p.host_grads ? (p.layer_major ? 1 : K) : 1;
  r.d2h_bytes = 4 * (layer * L * grad_passes + head + (p.host_embed ? 0 : embed));
  // Block checkpoints on the host: L + 1 block inputs per micro-batch out in
  // the forward and back in for the backward.
  if (p.host_ckpt) {
    const double ck = K * (L + 1) * N * C * 2;
    r.h2d_bytes += ck;
    r.d2h_bytes += ck;
  }
  // The host embedding: the micro-batch's gathered rows in, its residual gradient out (bf16).
  if (p.host_embed) {
    r.h2d_bytes += K * N * C * 2;
    r.d2h_bytes += K * N * C * 2;
  }
  // Both directions share one rate: on the H200 host the two together reached
  // ~43 GB/s (issue 16: 10 GiB cap, 2 x 16 micro-batches, ~410 GB per 9.6 s
  // step), not 2 x 50.
  r.h2d_bytes += 4 * ns5.bytes / 6, r.d2h_bytes += 2 * ns5.bytes / 6;  // Muon: U in (fp32), O out (bf16)
  r.copies_s = (r.h2d_bytes + r.d2h_bytes) / (card.pcie_gbs * 1e9);
  // Host gradients also pass through the CPU (kHostGradLandGbs): the copies
  // take the longer of the two pipelines.
  r.landing_s = p.host_grads && !p.fold ? 4 * layer * L * grad_passes / (kHostGradLandGbs * 1e9) : 0;
  r.copies_s = std::max(r.copies_s, r.landing_s);
  // ---- optimizer
  const double params = static_cast<double>(s.params_total());
  r.optimizer_s = params / (gparams * 1e9);
  const double core = std::max(r.compute_s, r.copies_s);
  // the share of the step's hardware FLOPs in the forward passes
  const double fwd_share = (r.model_flops_per_token / 3.0) / r.hardware_flops_per_token;
  if (p.fold) {
    // Fold (--grads fold): the head updates first (its gradient leaves once
    // the step's last head is queued), then each layer as its gradient
    // lands, under the backward (its share of the core time); exposed: what
    // of the layers' updates does not fit under the backward, and the tail
    // after it -- layer 0's update (the last layer gradient) and the
    // embedding's, whose gradient is whole only at the end: a host
    // embedding's rows are scattered into its arena first (kHostEmbedLandGbs),
    // a device embedding's fp32 gradient crosses PCIe. Checked against the
    // H100's 7B step (32 x 2048: 0.41-0.43 s of turn-around in a trace,
    // 2026-12-06, bench/RESULTS.md) and the 10 GiB cap at 64k tokens.
    // Deferred folds (engine/fold_clip.h fold_defer_plan, at the share
    // RAMTRAIN_FOLD_DEFER sets, off by default; the engine's cap of half the
    // available RAM may defer less):
    // the head's and the last k layers' updates leave the backward (their
    // gradients copied aside there, at the landing rate) and run under the
    // next forward, exposed where they outlast the forward's first L - k
    // layers.
    std::vector<int64_t> fold_numel;
    for (size_t u : fold_order(s.n_layers)) fold_numel.push_back(numel[u]);
    const FoldDefer defer = fold_defer_plan(fold_numel, fold_defer_share(), UINT64_MAX);
    const double k = std::max(0.0, static_cast<double>(defer.at.size()) - 1);  // deferred layers (after the head)
    const double deferred = defer.at.empty() ? 0.0 : head + k * layer;
    const double layers_s = layer * (L - k) / (gparams * 1e9) + 4 * deferred / (kHostGradLandGbs * 1e9);
    const double land_s =
        p.host_embed ? (4 * embed + tokens * C * 10) / (kHostEmbedLandGbs * 1e9) : 4 * embed / (card.pcie_gbs * 1e9);
    const double tail_s = (embed + layer) / (gparams * 1e9) + land_s;
    const double defer_s = std::max(0.0, deferred / (gparams * 1e9) - core * fwd_share * (L - k) / L);
    const double exposed = std::max(0.0, layers_s - core * (1.0 - fwd_share)) + tail_s + defer_s;
    r.overlap_s = std::max(0.0, r.optimizer_s - exposed);
  } else if (plan.options.delayed_update) {
    r.overlap_s = core;
  } else if (p.host_grads) {
    // Host gradients: measured not to overlap (issue 16, 7B width, 14 layers,
    // 8 x 2048 under a 24 GiB cap: GPU idle 63% = 1.28 s of a 2.03 s step
    // waiting, against 1.09 s of AdamW; the compute, 0.75 s busy, is what this
    // model predicts). The cause was not traced; modelled as fully exposed.
    r.overlap_s = 0;
  } else {
    // the forward it runs under: one micro-batch's (micro-batch-major) or all
    // K (layer-major), as a share of the step's hardware FLOPs
    r.overlap_s = core * fwd_share * (p.layer_major ? 1.0 : 1.0 / K);
  }
  r.optimizer_exposed_s = std::max(0.0, r.optimizer_s - r.overlap_s);
  r.step_s = core + r.optimizer_exposed_s;
  // The binding part: the optimizer when more than kOptimizerBindsShare of
  // the step waits for it, else the longer of compute and copies.
  r.binding = r.optimizer_exposed_s > kOptimizerBindsShare * r.step_s ? "optimizer"
              : r.copies_s > r.compute_s                              ? "copies"
                                                                      : "compute";
  r.tokens_per_s = tokens / r.step_s;
  r.model_tflops = r.tokens_per_s * r.model_flops_per_token / 1e12;
  r.gpu_idle = 1.0 - r.compute_s / r.step_s;
  return r;
}

}  // namespace rt
