// The FP8 linear layer's CPU twin: the specification of `--matmul fp8`
// (core/fp8.h holds the e4m3 code map and the power-of-two block scale rule).
// Quantization is bit for bit what the CUDA quantizers (cuda/fp8.cu) produce;
// the GEMMs run in fp32 on the dequantized values (code * scale, exact), so the
// GPU's FP8 GEMM differs from this only by its fp32 summation order.
//
// Granularity (DeepSeek-V3's recipe), always along each GEMM's reduction dim:
//  - activations and output gradients: 1 x 128 tiles (one scale per row per
//    128 consecutive elements of the reduction dim);
//  - weights: 128 x 128 blocks (one scale per block; the same codes serve the
//    forward and, transposed, the input gradient).
// Tails: a dimension that is not a multiple of 128 ends in a shorter tile or
// block, whose scale comes from the elements it holds.
//
// Linear [N tokens, I in, O out], Q1 = 1x128 quantize-dequantize along the
// named (reduction) dim, Q2 = 128x128:
//   forward   y[N,O]  = Q1_I(x) Q2(w)^T + b
//   dgrad     dx[N,I] = Q1_O(dy) Q2(w)
//   wgrad     dw[O,I] += Q1_N(dy^T) Q1_N(x^T)^T      (both along tokens)
//   dbias     db[O]  += sum_n dy[n, :]               (unquantized)
// Letters: R x K is a matrix quantized along K (row-major, K contiguous);
// KB = ceil(K / 128), RB = ceil(R / 128).
#pragma once
#include <cstdint>

namespace rt::cpu {

// x[R, K] (element (r, k) at x[r * row_stride + k * col_stride], so a
// transposed view quantizes with strides swapped) -> codes q[R, K] row-major
// and scale[R, KB]: 1 x 128 tiles along K.
void fp8_quantize_1x128(uint8_t* q, float* scale, const float* x, int64_t R, int64_t K, int64_t row_stride,
                        int64_t col_stride);
// x[R, K] row-major -> codes q[R, K] and scale[RB, KB]: 128 x 128 blocks.
void fp8_quantize_128x128(uint8_t* q, float* scale, const float* x, int64_t R, int64_t K);
// Dequantize (code * scale) with either scale layout: out[R, K].
void fp8_dequantize_1x128(float* out, const uint8_t* q, const float* scale, int64_t R, int64_t K);
void fp8_dequantize_128x128(float* out, const uint8_t* q, const float* scale, int64_t R, int64_t K);

// The FP8 linear layer (letters and formulas above). Same contract as
// cpu::linear_forward / linear_backward (out, dx written; dw, db accumulated;
// dx and db nullable).
void fp8_linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                        int64_t O);
void fp8_linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                         int64_t N, int64_t I, int64_t O);

// ---- per-tensor scaling (MatmulMode::fp8_tensor, `--fp8-scaling tensor`) ----
// One power-of-two scale per operand tensor: core/fp8.h's rule on the amax of
// the whole tensor as it is now (current scaling: no history). amax 0 (an
// all-zero tensor): scale 1, all codes 0. fp32-subnormal amax: the scale is
// clamped to 2^-126 and the codes are those of x * 2^126 (below 1: values
// up to 2^-136 become 0, not the whole tensor). An Inf or NaN anywhere:
// scale NaN and every code NaN (0x7F), so the GEMM's outputs are NaN and the
// step is skipped as a bad step, as in block mode.
// Since the scale belongs to the whole tensor, a transposed copy has the same
// scale and the transposed codes: each tensor is quantized once.
//   forward   y[N,O]  = Qt(x) Qt(w)^T + b
//   dgrad     dx[N,I] = Qt(dy) Qt(w)
//   wgrad     dw[O,I] += Qt(dy)^T Qt(x)
//   dbias     db[O]  += sum_n dy[n, :]               (unquantized)

// x[R, K] (strides as fp8_quantize_1x128) -> codes q[R, K] row-major; returns
// the tensor's scale (dequantized value = decode(code) * scale).
float fp8_quantize_tensor(uint8_t* q, const float* x, int64_t R, int64_t K, int64_t row_stride, int64_t col_stride);
void fp8_dequantize_tensor(float* out, const uint8_t* q, float scale, int64_t n);

void fp8_tensor_linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                               int64_t O);
void fp8_tensor_linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                                int64_t N, int64_t I, int64_t O);

}  // namespace rt::cpu
