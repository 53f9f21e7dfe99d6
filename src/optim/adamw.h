// AdamW on the CPU: one fused, multi-threaded, vectorised pass per tensor over
// fp32 master weights p and moments m, v, optionally writing the bf16 shadow.
//
// Contract (torch.optim.AdamW, foreach=False, fused=False, capturable=False):
//   hyperparameters and lr, wd are doubles, like the Python floats torch uses;
//   per call, in double:  bc1 = 1 - b1^t, bc2 = 1 - b2^t, step_size = lr / bc1,
//                         bc2_sqrt = bc2^0.5;   every constant is then cast to fp32.
//   per element, in fp32 (each op rounded once, FMA only where written fma()):
//     g' = g * grad_scale
//     p  = p * (1 - lr*wd)                                  (skipped when wd == 0)
//     m  = fma(w, g' - m, m)        w = 1 - b1, torch's lerp_ (w < 0.5)
//        = fma(w - 1, g' - m, g')   (w >= 0.5)
//     v  = fma((1 - b2) * g', g', v * b2)                   torch's mul_ + addcmul_
//     p  = p + (-step_size * m) / (sqrt(v) / bc2_sqrt + eps) torch's addcdiv_
//     bf16_out = f32_to_bf16(p)                             (when bf16_out != nullptr)
// torch's AVX2/AVX-512 CPU kernels fuse lerp_ and addcmul_ into FMAs, so we do too
// (explicitly: std::fma / _mm*_fmadd_ps; the .cpp forbids implicit contraction).
// Against torch 2.15 (AVX2) m and v are bit-identical; p differs by about one ulp
// at the tensor's scale (|dp| <= 2^-23 max|p| seen over 1M elements x 5 steps; 98%
// of elements exact), because torch's fp32 sqrt is not correctly rounded (1 ulp off
// in ~16% of elements) while ours is (see tests/optim/adamw_test.cpp).
//
// Every SIMD path (scalar, AVX2+FMA, AVX-512F) gives bit-identical results, and so
// does every thread count: work is split in fixed blocks of kOptimBlock elements.
#pragma once
#include <cstdint>

namespace rt {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

// Elements per thread-pool task in adamw_update and sum_squares (fixed, so results
// do not depend on the thread count).
inline constexpr int64_t kOptimBlock = 16384;

// One AdamW step over n elements; see the contract above. t: 1-based step count.
// p, m, v, g: n floats each (g read only); bf16_out: n uint16 (bf16 bits) or nullptr.
// Buffers must not overlap each other. Throws rt::Error on t < 1 or bad hyperparameters.
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n, const AdamWHyper& h, int64_t t, double lr,
                  double wd, float grad_scale, uint16_t* bf16_out = nullptr);

struct SplitMaster;  // state/split_master.h

// adamw_update with the master held split (state/split_master.h): element i's
// master is read from (shadow_in[i], p.rem[i], tie bit p.tie_first + i), updated
// with exactly adamw_update's arithmetic, and written back as (p.shadow[i],
// p.rem[i], tie bit): bit-identical to adamw_update on the decoded master, its
// bf16_out included. shadow_in: nullptr reads p.shadow (in place); else the
// shadow of the previous step (delayed update), which must not overlap p.shadow.
// m, v, g as in adamw_update (element i at m[i]). Calls on disjoint element
// ranges may run concurrently, even inside one tie word (split_master.h).
// Stores by adamw_update's rule: the shadow streams when only written (delayed
// mode); rem, m, v and an in-place shadow where adamw_streams_moments() says.
void adamw_update_split(const SplitMaster& p, float* m, float* v, const float* g, int64_t n, const AdamWHyper& h,
                        int64_t t, double lr, double wd, float grad_scale, const uint16_t* shadow_in = nullptr);

// Sum of g[i]^2 in double. Within a block, 16 interleaved lanes (lane = i mod 16),
// combined in lane order; block partials combined in block order. Bit-identical
// for any thread count and SIMD level.
double sum_squares(const float* g, int64_t n);

// torch.nn.utils.clip_grad_norm_: coef = min(1, max_norm / (total_norm + 1e-6)),
// computed in double and rounded to fp32 (torch computes it in fp32 from its fp32
// norm; the two agree to ~1 ulp). max_norm <= 0: no clipping, coef 1.
// Non-finite total_norm, like torch without error_if_nonfinite: NaN gives a NaN
// coef (the step is poisoned visibly, not skipped); +inf gives 0.
float clip_coefficient(double total_norm, double max_norm);

// Whether adamw_update writes p, m, v with streaming (non-temporal) stores:
// on Intel CPUs, where that measured faster; plain stores elsewhere (see
// adamw.cpp). The bf16 shadow always streams. Values are the same either way.
bool adamw_streams_moments();

enum class SimdLevel { scalar, avx2, avx512 };
// The best path this CPU supports (avx2 needs AVX2 and FMA; avx512 needs AVX-512F).
SimdLevel simd_level_detected();
// The path adamw_update / sum_squares use now (starts as simd_level_detected()).
SimdLevel simd_level_active();
// Forces a path, clamped to simd_level_detected(); for tests and benchmarks.
void set_simd_level(SimdLevel level);
const char* simd_level_name(SimdLevel level);

}  // namespace rt
