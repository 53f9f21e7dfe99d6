// The time model of one optimizer step of the CUDA streaming engine, as a pure
// function of the model, the tokens per step, the engine's device plan
// (engine/device_plan.h) and the machine (card and host). No CUDA: `ramtrain
// plan` and the CPU tests call it. Every constant is named in step_model.cpp
// with its source (a datasheet lead or an H200 measurement in bench/RESULTS.md).
//
// Contract (the same accounting the engine's schedule has, backend.h):
//   compute  = hardware FLOPs per step / (card dense bf16 TFLOP/s x efficiency),
//              efficiency = a share of the card's GEMM peak calibrated on the
//              H100 (0.691, step_model.cpp), expressed against the datasheet rate:
//              6 N_matmul + 6 L H D T per token (model FLOPs, as ramtrain_bench
//              counts them), plus a block forward per recomputed layer
//              (2 N_layer + 2 H D T per token); with Muon, its Newton-Schulz
//              on the same device (device_plan.h muon_step_work) at a
//              measured share of the GEMM peak;
//   copies   = (H2D + D2H bytes) / PCIe GB/s: weights bf16 in, fp32 gradients
//              out, block checkpoints both ways when on the host, the host
//              embedding's rows in and residual gradient out; host gradients
//              also pass through the CPU (added into the host arenas), and
//              the copies take the longer of the PCIe and that CPU work;
//   optimizer= parameters / CPU AdamW Gparam/s, exposed only where it does not
//              overlap: default mode, it starts once the global norm is known
//              and overlaps the next step's forward (micro-batch-major: the
//              first micro-batch's; layer-major: all of them); host gradients:
//              not at all (as measured); delayed update: the whole step;
//   step     = max(compute, copies) + exposed optimizer.
#pragma once
#include <cstdint>
#include <string>

#include "core/fp8.h"
#include "engine/device_plan.h"
#include "model/block_memory.h"
#include "model/spec.h"

namespace rt {

struct CardSpec {
  std::string name;           // "h200", or "custom"
  uint64_t memory_bytes = 0;  // what the card has
  double bf16_tflops = 0;     // dense bf16 with fp32 accumulate, datasheet
  double fp8_tflops = 0;      // dense FP8 (e4m3) with fp32 accumulate, datasheet; 0: no FP8 tensor cores
  // --matmul fp8's projections (GEMMs + quantizers) as a multiple of the bf16
  // rate, fitted to a measured step (kFp8ProjectionGain); 0: not measured, fp8_tflops is used
  double fp8_gain = 0;
  bool fp8_path = false;      // ramtrain's --matmul fp8 runs on it (cuda/fp8.h: Hopper only)
  // --fp8-scaling tensor: the same multiple (step_model.cpp, fp8_tensor_gain:
  // the per-tensor GEMM's measured 1.75x less the quantizers' bytes at the
  // card's memory rate, fitted on the H100's measured step; an ESTIMATE on
  // other cards); 0: fp8_tflops
  double fp8_tensor_gain = 0;
  bool fp8_tensor_path = false;  // --fp8-scaling tensor runs on it (cuda/fp8.h: Ada and Hopper)
  double memory_tbs = 0;         // device memory bandwidth, datasheet TB/s
  double pcie_gbs = 0;        // practical host<->device GB/s (1e9 B/s)
  // bf16 GEMM TFLOP/s the card reaches (large cuBLAS GEMMs): measured where
  // step_model.cpp names a source, else the H100's share of its datasheet;
  // 0 (a custom card): that share of bf16_tflops. The step's rate is a
  // calibrated share of it.
  double gemm_peak_tflops = 0;
  bool gemm_peak_measured = false;
};

// The cards `ramtrain plan --gpu` knows (datasheet leads, step_model.cpp);
// false for an unknown name.
bool card_lookup(const std::string& name, CardSpec* out);
const char* card_names();  // "rtx3080|rtx3090|...", for help and messages

// Device bytes the engine may plan with on a card of `memory` bytes: what the
// CUDA context and cuBLAS keep is held back (measured on the H200).
uint64_t card_engine_budget(uint64_t memory);

// Hardware FLOPs per token the step runs: model FLOPs + recomputed forwards.
double model_flops_per_token(const ModelSpec& s, int64_t seq_len);
double hardware_flops_per_token(const ModelSpec& s, int64_t seq_len, int64_t recomputed_layers);
// What the engine runs: model FLOPs + each layer's recompute by what it kept
// (model/block_memory.h layer_recompute_flops: no down projection, only the
// MLP half for attention-kept layers, the MLP chunks' gate/up for kept
// layers whose MLP runs in chunks).
double hardware_flops_per_token(const ModelSpec& s, const BlockDims& dm, int64_t kept_layers,
                                int64_t attn_kept_layers);

struct StepPrediction {
  double model_flops_per_token = 0, hardware_flops_per_token = 0;
  double efficiency = 0;  // the share of the datasheet rate the kernels reach (calibrated on the GEMM peak)
  double gemm_peak_tflops = 0;  // the card's bf16 GEMM peak the efficiency was taken from
  double fp8_flops_per_token = 0;  // --matmul fp8: the projections' share of hardware FLOPs, at the FP8 rate
  double compute_s = 0;    // the step's kernels, and Muon's Newton-Schulz (ns5_s) when the optimizer is Muon
  double ns5_s = 0;
  double h2d_bytes = 0, d2h_bytes = 0;
  double copies_s = 0;     // max(PCIe time, host gradient landing)
  double landing_s = 0;    // host gradients: the CPU adding them into the arenas
  double optimizer_s = 0;  // the whole CPU AdamW pass
  double overlap_s = 0;    // the part of the step it runs under
  double optimizer_exposed_s = 0;
  double step_s = 0;
  double tokens_per_s = 0, model_tflops = 0;
  double gpu_idle = 0;  // 1 - compute / step
  std::string binding;  // "compute", "copies" or "optimizer"
};

// Hardware FLOPs per token of the layers' projections (q/k/v/o, gate/up/down,
// a shared expert's; not MoE experts, router or LM head): what --matmul fp8
// moves to the FP8 rate, forward, backward and the recomputed forwards.
double projection_flops_per_token(const ModelSpec& s, const BlockDims& dm, int64_t kept_layers,
                                  int64_t attn_kept_layers);

// micro_batch x seq_len tokens per micro-batch, plan.place.micro_batches of
// them per step (the plan's CudaOptions::micro_batches). matmul fp8: the
// projection FLOPs run at card.fp8_gain x the bf16 rate (fp8_tensor:
// card.fp8_tensor_gain, an estimate; measured on the
// H100 with the quantizers, bench/RESULTS.md), or at card.fp8_tflops where
// no gain is measured (a rate given with --gpu-fp8-tflops), with the same
// calibrated efficiency as bf16.
StepPrediction predict_step(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const DevicePlan& plan,
                            const CardSpec& card, double cpu_adamw_gparams, MatmulMode matmul = MatmulMode::bf16);

}  // namespace rt
