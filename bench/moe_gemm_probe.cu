// Which cuBLAS call runs the MoE expert GEMMs fastest on this card (issue
// 32): one layer call's products at a given shape, timed alone, per way of
// issuing them. A kernel profile of OLMoE-1B-7B's 128k step on the H100 put
// ~2.0 s of a 5.6 s step in cublasGemmGroupedBatchedEx's kernel (an sm_80
// cutlass kernel, ~313 TFLOP/s) and ~0.6 s in 41k looped weight-gradient
// cublasGemmEx calls; this measures the alternatives before building one.
//
//   moe_gemm_probe [NK C F E skew]   (default 65536 2048 1024 64 0.3: OLMoE,
//                                     4 x 2048 tokens a call, top 8)
//
// Rows per expert: NK split over E experts with weights 1 + skew * u
// (u uniform in [-1, 1), a fixed seed), so the experts are unequal as in a
// real routing. Ways, for the forward's gate product out[R_e, F] = xe W_e^T
// (bf16 out) and the weight gradient dW_e[F, C] += d_g^T xe (fp32 out):
//   looped    one cublasGemmEx per expert (the engine's looped mode)
//   grouped   one cublasGemmGroupedBatchedEx, a group per expert (the
//             engine's grouped mode; bf16 out only: cuBLAS 13.1 refuses
//             fp32 outputs there)
//   chunk T   each expert's rows padded to a multiple of T, one
//             cublasGemmBatchedEx over all T-row chunks (every chunk has the
//             same m, n, k); for the weight gradient, rounds: round j is one
//             batched call over every expert's j-th chunk (beta 1, k = T),
//             so no two problems of a call write the same output
//   equal     cublasGemmStridedBatchedEx with every expert at NK / E rows
//             (the bound an even routing would give)
// TFLOP/s counts the real rows only (2 R_e F C per expert), so padding is
// paid for. Not a test: timings only.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "bench_device.cuh"
#include "cuda/check.h"

namespace {

using rt::bench::bf16;
using rt::bench::Dev;
using rt::bench::fill;
using rt::bench::time_ms;

template <class T>
T* upload(const std::vector<T>& v, Dev& d) {
  CUDA_CHECK(cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d.as<T>();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t NK = 65536, C = 2048, F = 1024, E = 64;
  double skew = 0.3;
  if (argc != 1 && argc != 6) {
    std::fprintf(stderr, "usage: moe_gemm_probe [NK C F E skew]\n");
    return 2;
  }
  if (argc == 6) {
    NK = std::atoll(argv[1]), C = std::atoll(argv[2]), F = std::atoll(argv[3]), E = std::atoll(argv[4]);
    skew = std::atof(argv[5]);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> wt(E);
  double ws = 0;
  for (auto& x : wt) ws += (x = 1.0 + skew * u(rng));
  std::vector<int64_t> rows(E);
  int64_t left = NK;
  for (int64_t e = 0; e < E; ++e) left -= (rows[e] = e + 1 < E ? static_cast<int64_t>(NK * wt[e] / ws) : 0);
  rows[E - 1] += left;
  const int64_t rmin = *std::min_element(rows.begin(), rows.end()), rmax = *std::max_element(rows.begin(), rows.end());
  std::printf("moe_gemm_probe: NK %lld rows, C %lld, F %lld, E %lld experts (rows %lld..%lld)\n",
              static_cast<long long>(NK), static_cast<long long>(C), static_cast<long long>(F),
              static_cast<long long>(E), static_cast<long long>(rmin), static_cast<long long>(rmax));
  const double flop = 2.0 * static_cast<double>(NK) * F * C;  // one product over the real rows

  // buffers with room for the padded layout (each expert rounded up to 1024 rows)
  const int64_t cap = NK + E * 1024;
  Dev xe(cap * C * 2), g(cap * F * 2), dg(cap * F * 2), W(E * F * C * 2), dW(E * F * C * 4);
  fill(xe, cap * C, 1, 1.f);
  fill(dg, cap * F, 2, 1e-2f);
  fill(W, E * F * C, 3, 0.02f);
  CUDA_CHECK(cudaMemset(dW.p, 0, E * F * C * 4));
  const bf16* pW = W.as<bf16>();
  float* pdW = dW.as<float>();
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  Dev ws_dev(64 << 20);
  CUBLAS_CHECK(cublasSetWorkspace(h, ws_dev.p, 64 << 20));
  const float one = 1.f, zero = 0.f;
  std::vector<int64_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + rows[e];

  auto report = [&](const char* what, const char* way, double ms) {
    std::printf("  %-6s %-16s %8.3f ms %7.1f TFLOP/s\n", what, way, ms, flop / (ms * 1e-3) / 1e12);
  };
  const int reps = 20;

  // forward gate product: out^T [F, R] = W_e^T-as-col-major... as the engine: m = F, n = R, k = C, A = W_e (T), B = xe
  report("fwd", "looped",
         time_ms(
             [&] {
               for (int64_t e = 0; e < E; ++e)
                 CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(F), int(rows[e]), int(C), &one,
                                           pW + e * F * C, CUDA_R_16BF, int(C), xe.as<bf16>() + off[e] * C, CUDA_R_16BF,
                                           int(C), &zero, g.as<bf16>() + off[e] * F, CUDA_R_16BF, int(F),
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
             },
             reps, 1));
  {
    std::vector<const void*> A(E), B(E);
    std::vector<void*> Cp(E);
    for (int64_t e = 0; e < E; ++e) {
      A[e] = pW + e * F * C;
      B[e] = xe.as<bf16>() + off[e] * C;
      Cp[e] = g.as<bf16>() + off[e] * F;
    }
    Dev dA(E * 8), dB(E * 8), dC(E * 8);
    upload(A, dA), upload(B, dB), upload(Cp, dC);
    const std::vector<cublasOperation_t> ta(E, CUBLAS_OP_T), tb(E, CUBLAS_OP_N);
    std::vector<int> m(E, int(F)), n(E), k(E, int(C)), lda(E, int(C)), ldb(E, int(C)), ldc(E, int(F)), sz(E, 1);
    for (int64_t e = 0; e < E; ++e) n[e] = int(rows[e]);
    const std::vector<float> al(E, 1.f), be(E, 0.f);
    report("fwd", "grouped",
           time_ms(
               [&] {
                 CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
                     h, ta.data(), tb.data(), m.data(), n.data(), k.data(), al.data(), dA.as<const void*>(),
                     CUDA_R_16BF, lda.data(), dB.as<const void*>(), CUDA_R_16BF, ldb.data(), be.data(), dC.as<void*>(),
                     CUDA_R_16BF, ldc.data(), int(E), sz.data(), CUBLAS_COMPUTE_32F));
               },
               reps, 1));
  }
  for (int64_t T : {128, 256, 512, 1024}) {
    // padded layout: expert e's rows start at poff[e], a multiple of T
    std::vector<const void*> A, B;
    std::vector<void*> Cp;
    int64_t p = 0;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < rows[e]; r += T) {
        A.push_back(pW + e * F * C);
        B.push_back(xe.as<bf16>() + (p + r) * C);
        Cp.push_back(g.as<bf16>() + (p + r) * F);
      }
      p += (rows[e] + T - 1) / T * T;
    }
    if (p > cap) continue;
    const int nb = int(A.size());
    Dev dA(nb * 8), dB(nb * 8), dC(nb * 8);
    upload(A, dA), upload(B, dB), upload(Cp, dC);
    char name[32];
    std::snprintf(name, sizeof name, "chunk %lld (%d)", static_cast<long long>(T), nb);
    report("fwd", name,
           time_ms(
               [&] {
                 CUBLAS_CHECK(cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(F), int(T), int(C), &one,
                                                  dA.as<const void*>(), CUDA_R_16BF, int(C), dB.as<const void*>(),
                                                  CUDA_R_16BF, int(C), &zero, dC.as<void*>(), CUDA_R_16BF, int(F), nb,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
               },
               reps, 1));
  }
  {
    const int64_t R = NK / E;
    report("fwd", "equal (strided)",
           time_ms(
               [&] {
                 CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(F), int(R), int(C), &one, pW,
                                                         CUDA_R_16BF, int(C), F * C, xe.as<bf16>(), CUDA_R_16BF, int(C),
                                                         R * C, &zero, g.as<bf16>(), CUDA_R_16BF, int(F), R * F, int(E),
                                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
               },
               reps, 1));
  }

  // weight gradient dW_e [F, C] (row-major) += d_g^T xe: as the engine, m = C, n = F, k = R, A = xe (N), B = d_g (T)
  report("wgrad", "looped",
         time_ms(
             [&] {
               for (int64_t e = 0; e < E; ++e)
                 CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, int(C), int(F), int(rows[e]), &one,
                                           xe.as<bf16>() + off[e] * C, CUDA_R_16BF, int(C), dg.as<bf16>() + off[e] * F,
                                           CUDA_R_16BF, int(F), &one, pdW + e * F * C, CUDA_R_32F, int(C),
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
             },
             reps, 1));
  for (int64_t T : {256, 512, 1024}) {
    // rounds: round j = every expert's j-th chunk of T rows (padded layout; the padding rows would be zero)
    std::vector<int64_t> poff(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) poff[e + 1] = poff[e] + (rows[e] + T - 1) / T * T;
    if (poff[E] > cap) continue;
    const int64_t rounds = (rmax + T - 1) / T;
    std::vector<std::vector<const void*>> A(rounds), B(rounds);
    std::vector<std::vector<void*>> Cp(rounds);
    int calls = 0;
    for (int64_t j = 0; j < rounds; ++j)
      for (int64_t e = 0; e < E; ++e)
        if (j * T < rows[e]) {
          A[j].push_back(xe.as<bf16>() + (poff[e] + j * T) * C);
          B[j].push_back(dg.as<bf16>() + (poff[e] + j * T) * F);
          Cp[j].push_back(pdW + e * F * C);
          ++calls;
        }
    std::vector<std::unique_ptr<Dev>> dev;
    std::vector<std::array<void*, 3>> ptr(rounds);
    for (int64_t j = 0; j < rounds; ++j) {
      const size_t nb = A[j].size();
      dev.push_back(std::make_unique<Dev>(nb * 8)), ptr[j][0] = upload(A[j], *dev.back());
      dev.push_back(std::make_unique<Dev>(nb * 8)), ptr[j][1] = upload(B[j], *dev.back());
      dev.push_back(std::make_unique<Dev>(nb * 8)), ptr[j][2] = upload(Cp[j], *dev.back());
    }
    char name[40];
    std::snprintf(name, sizeof name, "rounds %lld (%lld)", static_cast<long long>(T), static_cast<long long>(rounds));
    report("wgrad", name,
           time_ms(
               [&] {
                 for (int64_t j = 0; j < rounds; ++j)
                   CUBLAS_CHECK(cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, int(C), int(F), int(T), &one,
                                                    static_cast<const void* const*>(ptr[j][0]), CUDA_R_16BF, int(C),
                                                    static_cast<const void* const*>(ptr[j][1]), CUDA_R_16BF, int(F),
                                                    &one, static_cast<void* const*>(ptr[j][2]), CUDA_R_32F, int(C),
                                                    int(A[j].size()), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
               },
               reps, 1));
  }
  {
    const int64_t R = NK / E;
    report("wgrad", "equal (strided)",
           time_ms(
               [&] {
                 CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, int(C), int(F), int(R), &one,
                                                         xe.as<bf16>(), CUDA_R_16BF, int(C), R * C, dg.as<bf16>(),
                                                         CUDA_R_16BF, int(F), R * F, &one, pdW, CUDA_R_32F, int(C),
                                                         F * C, int(E), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
               },
               reps, 1));
  }
  CUBLAS_CHECK(cublasDestroy(h));
  return 0;
}
