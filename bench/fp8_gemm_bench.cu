// FP8 vs bf16 GEMM throughput on Qwen2.5-7B's projection shapes (issue 31):
// for each projection (q, k, v, o, gate, up, down) and N tokens, the forward,
// input-gradient (dgrad) and weight-gradient (wgrad) GEMMs in
//   bf16     cuda::Blas (what --matmul bf16 runs),
//   fp8      cuda::Fp8Gemm on operands already quantized (the GEMM alone),
//   fp8+q    cuda::Fp8Linear: the quantizers (incl. the transposed copies and
//            the weight's blocks, redone every call as training does) + GEMM,
//   t8, t8+q the same with per-tensor scales (--fp8-scaling tensor): the GEMM
//            with scalar scales alone, and Fp8Linear(fp8_tensor) with its amax
//            and quantizer passes (dgrad and wgrad timed apart, so dy's amax
//            is counted twice here; training's backward makes it once),
// as TFLOP/s of the 2*N*I*O model FLOPs, then the whole layer's sum.
//   fp8_gemm_bench [N ...]     (default: 8192 16384; N a multiple of 16)
// Not a test: timings only. Block columns need sm_90, tensor ones sm_89+
// (a column the card does not run prints 0).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/ops.h"
#include "bench_device.cuh"

using rt::cuda::bf16;
using rt::cuda::DType;
using rt::cuda::Fp8Scaling;

namespace {

using rt::bench::Dev;
using rt::bench::fill;
using rt::bench::time_ms;

struct Proj {
  const char* name;
  int64_t I, O;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string why;
    if (!rt::cuda::fp8_supported(0, rt::MatmulMode::fp8_tensor, &why)) {
      std::fprintf(stderr, "fp8_gemm_bench: %s\n", why.c_str());
      return 1;
    }
    const bool block = rt::cuda::fp8_supported(0, rt::MatmulMode::fp8, &why);
    if (!block) std::printf("block-scaled columns skipped: %s\n", why.c_str());
    std::vector<int64_t> Ns;
    for (int i = 1; i < argc; ++i) Ns.push_back(std::atoll(argv[i]));
    if (Ns.empty()) Ns = {8192, 16384};
    const int64_t C = 3584, QD = 3584, KD = 512, F = 18944;
    const Proj projs[] = {{"q", C, QD}, {"k", C, KD}, {"v", C, KD}, {"o", QD, C},
                          {"gate", C, F}, {"up", C, F}, {"down", F, C}};
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("fp8_gemm_bench on %s (Qwen2.5-7B projections; TFLOP/s of 2*N*I*O)\n", prop.name);
    std::printf("%6s %5s %6s | %8s %8s %8s %8s %8s | %6s %6s %6s %6s\n", "N", "proj", "pass", "bf16", "fp8", "fp8+q",
                "t8", "t8+q", "x gemm", "x +q", "x t8", "x t8+q");
    rt::cuda::Blas blas(32u << 20);
    rt::cuda::Fp8Linear lin, tlin(rt::MatmulMode::fp8_tensor);
    rt::cuda::Fp8Gemm gemm;
    for (int64_t N : Ns) {
      double tot[5] = {0, 0, 0, 0, 0};  // bf16, fp8, fp8+q, t8, t8+q over all passes and projections (ms)
      double flops_total = 0;
      for (const Proj& p : projs) {
        const int64_t I = p.I, O = p.O;
        Dev x(N * I * 2), w(O * I * 2), dy(N * O * 2), y(N * O * 2), dx(N * I * 2), dw(O * I * 4);
        fill(x, N * I, 1, 1.f);
        fill(w, O * I, 2, 0.02f);
        fill(dy, N * O, 3, 1e-3f);
        CUDA_CHECK(cudaMemset(dw.p, 0, O * I * 4));
        // pre-quantized operands for the GEMM-only timings
        Dev qx(N * I), sx(rt::cuda::fp8_scales_1x128(N, I) * 4), qw(O * I), sw(rt::cuda::fp8_scales_128x128(O, I) * 4),
            qwt(O * I), swt(rt::cuda::fp8_scales_128x128(I, O) * 4), qdy(N * O),
            sdy(rt::cuda::fp8_scales_1x128(N, O) * 4), qdyt(N * O), sdyt(rt::cuda::fp8_scales_1x128(O, N) * 4),
            qxt(N * I), sxt(rt::cuda::fp8_scales_1x128(I, N) * 4);
        rt::cuda::fp8_quantize_1x128(qx.as<uint8_t>(), sx.as<float>(), x.as<bf16>(), N, I, false, nullptr);
        rt::cuda::fp8_quantize_128x128(qw.as<uint8_t>(), sw.as<float>(), qwt.as<uint8_t>(), swt.as<float>(),
                                       w.as<bf16>(), O, I, nullptr);
        rt::cuda::fp8_quantize_1x128(qdy.as<uint8_t>(), sdy.as<float>(), dy.as<bf16>(), N, O, false, nullptr);
        rt::cuda::fp8_quantize_1x128(qdyt.as<uint8_t>(), sdyt.as<float>(), dy.as<bf16>(), O, N, true, nullptr);
        rt::cuda::fp8_quantize_1x128(qxt.as<uint8_t>(), sxt.as<float>(), x.as<bf16>(), I, N, true, nullptr);
        // per-tensor: codes and transposed codes of x, w, dy, one slot each
        Dev tx(N * I), txt(N * I), tw(O * I), twt(O * I), tdy(N * O), tdyt(N * O), slots(3 * 256);
        auto* slot = slots.as<char>();
        auto* slx = reinterpret_cast<float*>(slot), *slw = reinterpret_cast<float*>(slot + 256),
             *sldy = reinterpret_cast<float*>(slot + 512);
        rt::cuda::fp8_quantize_tensor(tx.as<uint8_t>(), txt.as<uint8_t>(), slx, x.as<bf16>(), N, I, nullptr);
        rt::cuda::fp8_quantize_tensor(tw.as<uint8_t>(), twt.as<uint8_t>(), slw, w.as<bf16>(), O, I, nullptr);
        rt::cuda::fp8_quantize_tensor(tdy.as<uint8_t>(), tdyt.as<uint8_t>(), sldy, dy.as<bf16>(), N, O, nullptr);
        const Fp8Scaling T = Fp8Scaling::tensor;
        auto blk = [&](auto&& f) { return block ? time_ms(f) : 1e30; };
        const double flops = 2.0 * N * I * O;
        const char* passes[] = {"fwd", "dgrad", "wgrad"};
        for (int pass = 0; pass < 3; ++pass) {
          double t[5];
          if (pass == 0) {
            t[0] = time_ms([&] { blas.matmul_nt(y.p, DType::bf16, x.as<bf16>(), w.as<bf16>(), N, O, I, 0.f, nullptr); });
            t[1] = blk([&] {
              gemm.matmul(y.p, DType::bf16, qx.as<uint8_t>(), sx.as<float>(), Fp8Scaling::vec128, qw.as<uint8_t>(),
                          sw.as<float>(), Fp8Scaling::blk128x128, N, O, I, 0.f, nullptr);
            });
            t[2] = blk([&] { lin.forward(y.as<bf16>(), x.as<bf16>(), w.as<bf16>(), nullptr, N, I, O, nullptr); });
            t[3] = time_ms([&] {
              gemm.matmul(y.p, DType::bf16, tx.as<uint8_t>(), slx, T, tw.as<uint8_t>(), slw, T, N, O, I, 0.f, nullptr);
            });
            t[4] = time_ms([&] { tlin.forward(y.as<bf16>(), x.as<bf16>(), w.as<bf16>(), nullptr, N, I, O, nullptr); });
          } else if (pass == 1) {
            t[0] = time_ms([&] { blas.matmul_nn(dx.p, DType::bf16, dy.as<bf16>(), w.as<bf16>(), N, I, O, 0.f, nullptr); });
            t[1] = blk([&] {
              gemm.matmul(dx.p, DType::bf16, qdy.as<uint8_t>(), sdy.as<float>(), Fp8Scaling::vec128, qwt.as<uint8_t>(),
                          swt.as<float>(), Fp8Scaling::blk128x128, N, I, O, 0.f, nullptr);
            });
            t[2] = blk([&] {
              lin.backward(dx.as<bf16>(), nullptr, nullptr, dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), N, I, O, nullptr);
            });
            t[3] = time_ms([&] {
              gemm.matmul(dx.p, DType::bf16, tdy.as<uint8_t>(), sldy, T, twt.as<uint8_t>(), slw, T, N, I, O, 0.f,
                          nullptr);
            });
            t[4] = time_ms([&] {
              tlin.backward(dx.as<bf16>(), nullptr, nullptr, dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), N, I, O,
                            nullptr);
            });
          } else {
            t[0] = time_ms([&] { blas.matmul_tn(dw.p, DType::f32, dy.as<bf16>(), x.as<bf16>(), O, I, N, 1.f, nullptr); });
            t[1] = blk([&] {
              gemm.matmul(dw.p, DType::f32, qdyt.as<uint8_t>(), sdyt.as<float>(), Fp8Scaling::vec128, qxt.as<uint8_t>(),
                          sxt.as<float>(), Fp8Scaling::vec128, O, I, N, 1.f, nullptr);
            });
            t[2] = blk([&] {
              lin.backward(nullptr, dw.as<float>(), nullptr, dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), N, I, O, nullptr);
            });
            t[3] = time_ms([&] {
              gemm.matmul(dw.p, DType::f32, tdyt.as<uint8_t>(), sldy, T, txt.as<uint8_t>(), slx, T, O, I, N, 1.f,
                          nullptr);
            });
            t[4] = time_ms([&] {
              tlin.backward(nullptr, dw.as<float>(), nullptr, dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), N, I, O,
                            nullptr);
            });
          }
          for (int i = 0; i < 5; ++i) tot[i] += t[i];
          flops_total += flops;
          std::printf("%6lld %5s %6s | %8.0f %8.0f %8.0f %8.0f %8.0f | %6.2f %6.2f %6.2f %6.2f\n",
                      static_cast<long long>(N), p.name, passes[pass], flops / t[0] * 1e-9, flops / t[1] * 1e-9,
                      flops / t[2] * 1e-9, flops / t[3] * 1e-9, flops / t[4] * 1e-9, t[0] / t[1], t[0] / t[2],
                      t[0] / t[3], t[0] / t[4]);
        }
      }
      std::printf("%6lld %5s %6s | %8.0f %8.0f %8.0f %8.0f %8.0f | %6.2f %6.2f %6.2f %6.2f   (layer: %.2f / %.2f / "
                  "%.2f / %.2f / %.2f ms)\n",
                  static_cast<long long>(N), "all", "sum", flops_total / tot[0] * 1e-9, flops_total / tot[1] * 1e-9,
                  flops_total / tot[2] * 1e-9, flops_total / tot[3] * 1e-9, flops_total / tot[4] * 1e-9,
                  tot[0] / tot[1], tot[0] / tot[2], tot[0] / tot[3], tot[0] / tot[4], tot[0], tot[1], tot[2], tot[3],
                  tot[4]);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", e.what());
    return 1;
  }
}
