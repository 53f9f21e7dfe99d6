// FP8 projections on the GPU (`--matmul fp8`): bf16 -> e4m3 quantizers with
// power-of-two block scales (bit for bit cpu/fp8.h's, core/fp8.h's rule), a
// cuBLASLt FP8 GEMM with block scales (Hopper, sm_90: 1x128 "VEC128" and
// 128x128 "BLK128x128" fp32 scales, fp32 accumulation with the periodic
// promotion cuBLASLt applies when fast accumulation is off), and the linear
// layer built on them; per-tensor scaling (`--fp8-scaling tensor`) below.
// cpu/fp8.h states the formulas and granularity.
//
// Layouts (cuBLASLt's FP8 kernels want both operands K-major, "TN"):
//  - codes q[R, K] row-major (K contiguous), R x K quantized along K;
//  - 1x128 scales: [KB][Rp] (Rp = R rounded up to 4; the row index fastest);
//  - 128x128 scales: [RB][KBp] (KBp = KB rounded up to 4; the column block fastest);
// where KB = ceil(K/128), RB = ceil(R/128). Entries in the padding are 0.
// The weight's transposed codes (for dgrad) reuse the same blocks' scales.
//
// Per-tensor scaling (MatmulMode::fp8_tensor, `--fp8-scaling tensor`): one
// power-of-two scale per operand tensor (cpu/fp8.h's fp8_quantize_tensor),
// kept on the device in a 16-byte slot (the fp32 scale, which is cuBLASLt's
// scalar scale pointer, then the tensor's amax as fp32 bits); the codes of a
// tensor and of its transpose share the slot. cuBLASLt's FP8 GEMM with
// scalar scales (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) runs on Ada and Hopper.
//
// Ada (sm_89) has FP8 tensor cores but cuBLASLt runs block scaling on Hopper
// only (per-tensor scales on Ada); fp8_supported says which card runs which
// scaling, and `train --matmul fp8` refuses before any work starts.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "core/fp8.h"
#include "cuda/ops.h"

namespace rt::cuda {

// Whether this device runs the FP8 GEMM of `mode` (fp8: block scales, sm_90;
// fp8_tensor: per-tensor scales, sm_89 and newer); why not in *why.
bool fp8_supported(int device, MatmulMode mode, std::string* why);

inline int64_t fp8_blocks(int64_t n) { return (n + 127) / 128; }
inline int64_t fp8_round4(int64_t n) { return (n + 3) / 4 * 4; }
// Floats of each scale layout.
inline int64_t fp8_scales_1x128(int64_t R, int64_t K) { return fp8_blocks(K) * fp8_round4(R); }
inline int64_t fp8_scales_128x128(int64_t R, int64_t K) { return fp8_blocks(R) * fp8_round4(fp8_blocks(K)); }

// x[R, K] row-major (transposed = false) or x[K, R] row-major read as its
// transpose (transposed = true) -> q[R, K], 1x128 scales [KB][Rp].
// Needs K % 4 == 0 (rows of q stored 4 codes at a time).
void fp8_quantize_1x128(uint8_t* q, float* scale, const bf16* x, int64_t R, int64_t K, bool transposed,
                        cudaStream_t stream);
// w[R, K] row-major -> q[R, K] with 128x128 scales [RB][KBp], and (qt != null)
// the transposed codes qt[K, R] with their scales [KB][RBp].
void fp8_quantize_128x128(uint8_t* q, float* scale, uint8_t* qt, float* scale_t, const bf16* w, int64_t R, int64_t K,
                          cudaStream_t stream);

// Per-tensor scaling: x[R, C] row-major (C % 8 == 0) -> the slot's amax and
// scale (slot: kFp8TensorSlot bytes, 16-byte aligned), and the codes q[R, C]
// (null: not made) and the transposed codes qt[C, R] (null: not made; needs
// R % 4 == 0), all with the one scale. fp8_tensor_amax alone fills only the
// amax; fp8_tensor_codes then makes codes from it (and writes the scale), so
// a tensor's codes and transposed codes can be made at different times.
inline constexpr size_t kFp8TensorSlot = 16;
void fp8_tensor_amax(float* slot, const bf16* x, int64_t n, cudaStream_t stream);
void fp8_tensor_codes(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C, cudaStream_t stream);
void fp8_quantize_tensor(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C,
                         cudaStream_t stream);

// Device bytes Fp8Linear's workspace grows to for one linear [N, I, O] (the
// largest of its forward, dgrad and wgrad sets of codes and scales, each
// region rounded up to 256 bytes as it carves them), plus what one Fp8Gemm
// keeps (kFp8GemmWorkspace): what the engine holds back from its plan.
// Per-tensor scaling: the forward's codes of x and w, or the backward's
// codes of dy (both layouts), w^T and x^T, and a slot each.
inline size_t fp8_region(size_t b) { return (b + 255) / 256 * 256; }
inline size_t fp8_linear_workspace_bytes(int64_t N, int64_t I, int64_t O, MatmulMode mode = MatmulMode::fp8) {
  auto u8 = [](int64_t n) { return fp8_region(static_cast<size_t>(n)); };
  auto f32 = [](int64_t n) { return fp8_region(static_cast<size_t>(n) * 4); };
  if (mode == MatmulMode::fp8_tensor) {
    const size_t slot = fp8_region(kFp8TensorSlot);
    return std::max(u8(N * I) + u8(O * I) + 2 * slot, 2 * u8(N * O) + u8(O * I) + u8(N * I) + 3 * slot);
  }
  const size_t fwd = u8(N * I) + f32(fp8_scales_1x128(N, I)) + u8(O * I) + f32(fp8_scales_128x128(O, I));
  const size_t dgrad = u8(N * O) + f32(fp8_scales_1x128(N, O)) + u8(O * I) + f32(fp8_scales_128x128(O, I)) + u8(I * O) +
                       f32(fp8_scales_128x128(I, O));
  const size_t wgrad = u8(O * N) + f32(fp8_scales_1x128(O, N)) + u8(I * N) + f32(fp8_scales_1x128(I, N));
  return std::max({fwd, dgrad, wgrad});
}
// Device bytes of Fp8Linear's shared-input buffers for an [N, I] input: its
// codes and scales along I and along N.
inline size_t fp8_shared_input_bytes(int64_t N, int64_t I, MatmulMode mode = MatmulMode::fp8) {
  auto u8 = [](int64_t n) { return fp8_region(static_cast<size_t>(n)); };
  auto f32 = [](int64_t n) { return fp8_region(static_cast<size_t>(n) * 4); };
  if (mode == MatmulMode::fp8_tensor) return 2 * u8(N * I) + fp8_region(kFp8TensorSlot);
  return 2 * u8(N * I) + f32(fp8_scales_1x128(N, I)) + f32(fp8_scales_1x128(I, N));
}
// Device bytes Fp8Linear::share_weights holds for an [O, I] weight: its codes,
// their transpose and both scale arrays.
inline size_t fp8_shared_weight_bytes(int64_t O, int64_t I, MatmulMode mode = MatmulMode::fp8) {
  auto u8 = [](int64_t n) { return fp8_region(static_cast<size_t>(n)); };
  auto f32 = [](int64_t n) { return fp8_region(static_cast<size_t>(n) * 4); };
  if (mode == MatmulMode::fp8_tensor) return 2 * u8(O * I) + fp8_region(kFp8TensorSlot);
  return 2 * u8(O * I) + f32(fp8_scales_128x128(O, I)) + f32(fp8_scales_128x128(I, O));
}
inline constexpr size_t kFp8GemmWorkspace = 32u << 20;

// Whether per-tensor scaling takes amaxes from their producers (CudaOps::amax_tap):
// yes unless RAMTRAIN_FP8_FUSED_AMAX=0 (read once).
bool fp8_fused_amax_default();

// tensor: one fp32 scale (a slot's first float) for the whole operand.
enum class Fp8Scaling { vec128, blk128x128, tensor };

// out[M, N] (row-major; bf16, or fp32 with beta 0 or 1) = beta*out +
// dq(a)[M, K] @ dq(b)[N, K]^T; a, b codes K-major with their scales as above.
// Plans cached per shape; one cuBLASLt handle and workspace. 2D x 2D scaling
// is not supported by cuBLASLt (one operand must be vec128); tensor scaling
// goes with tensor scaling only (both operands).
class Fp8Gemm {
 public:
  explicit Fp8Gemm(size_t workspace_bytes = kFp8GemmWorkspace);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  void matmul(void* out, DType out_type, const uint8_t* a, const float* a_scale, Fp8Scaling a_mode, const uint8_t* b,
              const float* b_scale, Fp8Scaling b_mode, int64_t M, int64_t N, int64_t K, float beta,
              cudaStream_t stream);
  size_t plans_cached() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The FP8 linear layer: cuda::linear_forward / linear_backward's contract
// (out, dx bf16 written; dw, db fp32 accumulated), every dimension a multiple
// of 16 (fp8_linear_eligible). Owns its GEMM and a device workspace for the
// codes and scales that grows to the largest shape seen (cudaMalloc outside
// the device plan: fp8_linear_workspace_bytes). mode: MatmulMode::fp8 (block
// scales, cpu::fp8_linear_*) or fp8_tensor (per-tensor scales,
// cpu::fp8_tensor_linear_*; the backward quantizes dy once into both layouts).
class Fp8Linear {
 public:
  explicit Fp8Linear(MatmulMode mode = MatmulMode::fp8);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;
  void forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int64_t N, int64_t I, int64_t O,
               cudaStream_t stream);
  void backward(bf16* dx, float* dw, float* dbias, const bf16* dout, const bf16* x, const bf16* w, int64_t N, int64_t I,
                int64_t O, cudaStream_t stream);
  Fp8Gemm& gemm();

  // An input read by consecutive projections (q/k/v read xn, gate/up read
  // hn): between share_input(x, N, I) and end_share() the forward quantizes x
  // (1x128 along I; per-tensor: its amax once, then its codes) once and the
  // weight gradients quantize x^T (along N; per-tensor: the transposed codes) once,
  // on first use, into buffers of their own (fp8_shared_input_bytes). The
  // codes are those each call would make, so results are bit-identical; the
  // caller promises that x is not written in between. Not nested.
  void share_input(const bf16* x, int64_t N, int64_t I);
  void end_share();

  // Weights used by several micro-batches in a row (layer-major: a layer's
  // projections for each of its K micro-batches): between share_weights()
  // and end_share_weights() each weight's codes (128x128 blocks, or one
  // scale per tensor), and their transpose
  // for the input gradient, are made once on first use and kept in buffers
  // of their own (fp8_shared_weight_bytes per weight); bit-identical to
  // quantizing per call. The caller promises the weights are not written in
  // between. Not nested.
  void share_weights();
  void end_share_weights();

  // Per-tensor scaling's amax made by the kernel that writes the input
  // ("taps"; a no-op for block scales): tap_begin(x, n) opens a tap on x[n]
  // (zeroes one of kFp8Taps slots; -1 when none is free or the scaling is
  // per block). A producer writing x[n] passes tap_key(x, n) to its kernel,
  // which atomicMax'es the keys of the values it writes (ops.h,
  // rms_norm_forward); null when no open tap on x[n] waits for its producer
  // (a second producer write closes the tap: the max would span both). From
  // then until tap_end(i), forward and backward read x's amax from the tap's
  // slot instead of a pass over x: the same amax, so the same bits. The
  // caller promises that nothing else writes x in between.
  static constexpr int kFp8Taps = 4;
  int tap_begin(const bf16* x, int64_t n, cudaStream_t stream);
  uint32_t* tap_key(const bf16* x, int64_t n);
  void tap_end(int i);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void add_bias(bf16* out, const bf16* bias, int64_t N, int64_t O, cudaStream_t stream);
  void tensor_forward(bf16* out, const bf16* x, const bf16* w, int64_t N, int64_t I, int64_t O, cudaStream_t stream);
  void tensor_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int64_t N, int64_t I,
                       int64_t O, cudaStream_t stream);
};

}  // namespace rt::cuda
