// CPU reference ops (declared in cpu/ops.h): embedding, RMSNorm, linear, RoPE,
// SwiGLU, add. Plain fp32 loops; GEMMs go through cpu/matmul.cpp.
// Letters as in ops.h: N rows, C hidden, I/O linear in/out, D head_dim, V vocab.
//
// Rules: forward outputs and input gradients are written with '='; weight
// gradients (dw, dbias, dtable) are computed into a local sum first and then
// added once with '+=', so calling a backward twice adds exactly the same
// value twice. Work is split over the global pool in fixed blocks whose
// boundaries depend only on the shapes, and every reduction runs in a fixed
// order inside one task: results are bit-identical for any thread count.
// These functions use the global pool: do not call them from inside a pool task.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"

namespace rt::cpu {

namespace {
constexpr int64_t kRowGrain = 16;                 // rows per task for row-wise ops
constexpr int64_t kColGrain = 64;                 // columns per task for column reductions (dw, dbias)
constexpr int64_t kElemGrain = int64_t{1} << 14;  // elements per task for elementwise ops
}  // namespace

// ---- embedding ----

// out[N,C] = table[ids[n], :]
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
  parallel_for(N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      RT_CHECK(ids[n] >= 0, "[cpu/embedding_forward] token id ", ids[n], " at row ", n, " is negative");
      std::memcpy(out + n * C, table + static_cast<int64_t>(ids[n]) * C, sizeof(float) * C);
    }
  });
}

// dtable[V,C] += sum over rows n with ids[n] == v of dout[n,:]. Rows are grouped
// by id (stable, so each id's rows are summed in increasing n), each id's sum is
// formed in a scratch row and added to dtable once.
namespace {
float widen(float x) { return x; }
float widen(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
void embedding_backward_impl(float* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> starts;  // starts[u] = first index in order of the u-th distinct id
  for (int64_t i = 0; i < N; ++i)
    if (i == 0 || ids[order[i]] != ids[order[i - 1]]) starts.push_back(i);
  const int64_t n_unique = static_cast<int64_t>(starts.size());
  starts.push_back(N);
  RT_CHECK(ids[order[0]] >= 0, "[cpu/embedding_backward] token id ", ids[order[0]], " is negative");
  parallel_for(n_unique, 16, [&](int64_t u0, int64_t u1) {
    std::vector<float> sum(static_cast<size_t>(C));
    for (int64_t u = u0; u < u1; ++u) {
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t i = starts[u]; i < starts[u + 1]; ++i) {
        const T* d = dout + order[i] * C;
        for (int64_t c = 0; c < C; ++c) sum[c] += widen(d[c]);
      }
      float* row = dtable + static_cast<int64_t>(ids[order[starts[u]]]) * C;
      for (int64_t c = 0; c < C; ++c) row[c] += sum[c];
    }
  });
}
}  // namespace

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
  embedding_backward_impl(dtable, dout, ids, N, C);
}
void embedding_backward(float* dtable, const uint16_t* dout_bf16, const int32_t* ids, int64_t N, int64_t C) {
  embedding_backward_impl(dtable, dout_bf16, ids, N, C);
}

// ---- RMSNorm ----

// x, out [N,C]; w [C]; rstd [N]. rstd = 1/sqrt(mean(x^2) + eps), the mean
// accumulated in double and rounded to fp32; out = w * (x * rstd) in fp32 (HF order),
// w + w_offset for Gemma's (1 + w) norms.
void rms_norm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                      float w_offset) {
  parallel_for(N, kRowGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = x + n * C;
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const float var = static_cast<float>(ss / static_cast<double>(C));
      const float r = 1.f / std::sqrt(var + eps);
      rstd[n] = r;
      float* o = out + n * C;
      for (int64_t c = 0; c < C; ++c) o[c] = (w_offset + w[c]) * (xr[c] * r);
    }
  });
}

// dx [N,C] (=): dx = rstd * (w*dout - x * rstd^2 * mean(w*dout*x)); dw [C] (+=): sum_n dout*x*rstd.
void rms_norm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                       int64_t N, int64_t C, float w_offset) {
  parallel_for(N, kRowGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = x + n * C;
      const float* dr = dout + n * C;
      const float r = rstd[n];
      double dot = 0;  // sum_c w*dout*x
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>((w_offset + w[c]) * dr[c]) * xr[c];
      const float k = static_cast<float>(dot / static_cast<double>(C)) * r * r;
      float* o = dx + n * C;
      for (int64_t c = 0; c < C; ++c) o[c] = r * ((w_offset + w[c]) * dr[c] - xr[c] * k);
    }
  });
  // dw: each task owns a block of columns and sums all rows in order.
  parallel_for(C, kColGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += static_cast<double>(dout[n * C + c]) * (x[n * C + c] * rstd[n]);
      dw[c] += static_cast<float>(s);
    }
  });
}

// ---- linear ----

// out[N,O] = x[N,I] @ w[O,I]^T + bias[O]
void linear_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I, int64_t O) {
  matmul_nt(out, x, w, N, O, I);
  if (bias) {
    parallel_for(N, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t o = 0; o < O; ++o) out[n * O + o] += bias[o];
    });
  }
}

// dx[N,I] = dout[N,O] @ w[O,I] (=); dw[O,I] += dout^T @ x; dbias[O] += sum_n dout.
void linear_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w, int64_t N,
                     int64_t I, int64_t O) {
  if (dx) matmul_nn(dx, dout, w, N, I, O);
  if (dw) matmul_tn(dw, dout, x, O, I, N, 1.f);
  if (dbias) {
    parallel_for(O, kColGrain, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        double s = 0;
        for (int64_t n = 0; n < N; ++n) s += dout[n * O + o];
        dbias[o] += static_cast<float>(s);
      }
    });
  }
}

// ---- RoPE ----

// HF: inv_freq = 1.0 / (base ** (arange(0, D, 2).float() / D)), all in fp32;
// llama3 scaling as transformers' _compute_llama3_parameters, with its fp32
// operation order (python-scalar / tensor is tensor.reciprocal() * scalar).
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim, bool long_factors) {
  // transformers: dim = int(head_dim * partial_rotary_factor)
  const int64_t D = static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  RT_CHECK(D > 0 && D % 2 == 0, "[cpu/rope_inv_freq] rotated dims ", D, " (head_dim ", head_dim,
           " x partial_rotary_factor ", rope.partial_rotary_factor, ") must be positive and even");
  RT_CHECK(rope.theta > 0, "[cpu/rope_inv_freq] rope_theta ", rope.theta, " must be positive");
  const int64_t half = D / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float base = static_cast<float>(rope.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(D);
    inv[i] = 1.f / std::pow(base, e);  // std::pow(float, float) -> float
  }
  if (rope.scaling == RopeScaling::linear) {  // HF: inv_freq /= factor, in fp32
    RT_CHECK(rope.factor > 0, "[cpu/rope_inv_freq] linear rope_scaling needs factor > 0, got ", rope.factor);
    for (auto& f : inv) f /= static_cast<float>(rope.factor);
  }
  if (rope.scaling == RopeScaling::llama3) {
    RT_CHECK(rope.factor > 0 && rope.high_freq_factor != rope.low_freq_factor && rope.low_freq_factor > 0 &&
                 rope.original_max_positions > 0,
             "[cpu/rope_inv_freq] llama3 rope_scaling needs factor > 0, low_freq_factor > 0, "
             "high_freq_factor != low_freq_factor and original_max_position_embeddings > 0");
    const double old_len = static_cast<double>(rope.original_max_positions);
    const float low_freq_wavelen = static_cast<float>(old_len / rope.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(old_len / rope.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
    const float factor = static_cast<float>(rope.factor);
    const float low = static_cast<float>(rope.low_freq_factor);
    const float span = static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
    const float old_len_f = static_cast<float>(old_len);
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv[i];
      const float wavelen = (1.f / f) * two_pi;
      const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const float smooth = ((1.f / wavelen) * old_len_f - low) / span;
        inv[i] = (1.f - smooth) * scaled / factor + smooth * scaled;
      } else {
        inv[i] = scaled;
      }
    }
  }
  if (rope.scaling == RopeScaling::yarn) {
    // transformers' _compute_yarn_parameters: the correction range [low, high]
    // in double (python floats), the ramp and the blend as fp32 tensor ops
    RT_CHECK(rope.factor > 0 && rope.original_max_positions > 0,
             "[cpu/rope_inv_freq] yarn rope_scaling needs factor > 0 and original_max_position_embeddings > 0");
    const double dim = static_cast<double>(D), lbase = std::log(rope.theta);
    const double omp = static_cast<double>(rope.original_max_positions);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(omp / (rotations * 2.0 * std::numbers::pi)) / (2.0 * lbase);
    };
    double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
    if (rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // transformers: prevent a singularity
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    const float factor = static_cast<float>(rope.factor);
    for (int64_t i = 0; i < half; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(D);
      const float pos_freq = std::pow(base, e);
      const float extrapolation = 1.f / pos_freq, interpolation = 1.f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.f, 1.f);
      const float extra = 1.f - ramp;  // inv_freq_extrapolation_factor
      inv[i] = interpolation * (1.f - extra) + extrapolation * extra;
    }
  }
  if (rope.scaling == RopeScaling::longrope) {
    // transformers' _compute_longrope_parameters: 1.0 / (ext_factors * base ** (arange(0, dim, 2) / dim)),
    // ext_factors an fp32 tensor
    const std::vector<double>& ext = long_factors ? rope.long_factor : rope.short_factor;
    RT_CHECK(static_cast<int64_t>(ext.size()) == half, "[cpu/rope_inv_freq] LongRoPE ",
             long_factors ? "long_factor" : "short_factor", " has ", ext.size(), " entries for ", half,
             " rotated pairs");
    for (int64_t i = 0; i < half; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(D);
      inv[i] = 1.f / (static_cast<float>(ext[i]) * std::pow(base, e));
    }
  }
  return inv;
}

namespace {
// x [N, heads, D] in place, its first R dims rotated; sign = +1 rotates by
// +angle, -1 by -angle; cos and sin are multiplied by scale.
void rope_rotate(float* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D, int64_t R,
                 float scale, float sign) {
  RT_CHECK(R > 0 && R % 2 == 0 && R <= D, "[cpu/rope] rotary_dim ", R, " must be even and in (0, head_dim ", D, "]");
  const int64_t half = R / 2;
  parallel_for(N, kRowGrain, [&](int64_t n0, int64_t n1) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[n]) * inv_freq[i];  // fp32, as HF
        cs[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;  // HF: emb.cos() * scaling
        sn[i] = sign * (static_cast<float>(std::sin(static_cast<double>(angle))) * scale);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* x1 = x + (n * heads + h) * D;
        float* x2 = x1 + half;
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * cs[i] - b * sn[i];
          x2[i] = b * cs[i] + a * sn[i];
        }
      }
    }
  });
}
}  // namespace

// out = [x1*cos - x2*sin, x2*cos + x1*sin]
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D) {
  rope_rotate(x, pos, inv_freq, N, heads, D, D, 1.f, 1.f);
}
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                  int64_t rotary_dim, float scale) {
  rope_rotate(x, pos, inv_freq, N, heads, D, rotary_dim, scale, 1.f);
}

// dx = [d1*cos + d2*sin, d2*cos - d1*sin]
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D) {
  rope_rotate(dx, pos, inv_freq, N, heads, D, D, 1.f, -1.f);
}
void rope_backward(float* dx, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t D,
                   int64_t rotary_dim, float scale) {
  rope_rotate(dx, pos, inv_freq, N, heads, D, rotary_dim, scale, -1.f);
}

RopeTables::RopeTables(const ModelSpec& s)
    : inv_short(rope_inv_freq(s.rope, s.head_dim)),
      rotary_dim(s.rotary_dim()),
      scale(static_cast<float>(s.rope_cos_scale())) {
  if (s.rope.scaling == RopeScaling::longrope) {
    inv_long = rope_inv_freq(s.rope, s.head_dim, true);
    long_above = s.rope.original_max_positions;
  }
  if (s.rope_local_on) {
    RT_CHECK(s.rope_local.scaling != RopeScaling::longrope,
             "[cpu/rope] LongRoPE for the local (sliding) layers' rope_local is not supported");
    inv_local = rope_inv_freq(s.rope_local, s.head_dim);
    RT_CHECK(static_cast<int64_t>(inv_local.size()) * 2 == rotary_dim, "[cpu/rope] rope_local rotates ",
             inv_local.size() * 2, " dims, rope ", rotary_dim, "; both must rotate the same dims");
  }
}

const float* RopeTables::select(const int32_t* pos, int64_t N, bool local) const {
  if (local) {
    RT_CHECK(!inv_local.empty(), "[cpu/rope] internal: a local RoPE without rope_local in the spec");
    return inv_local.data();
  }
  return use_long(pos, N) ? inv_long.data() : inv_short.data();
}

bool RopeTables::use_long(const int32_t* pos, int64_t N) const {
  if (inv_long.empty()) return false;
  int64_t mx = -1;
  for (int64_t n = 0; n < N; ++n) mx = std::max<int64_t>(mx, pos[n]);
  return mx + 1 > long_above;
}

// ---- SwiGLU ----

// out = silu(gate) * up, silu(g) = g / (1 + exp(-g))
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      out[i] = g / (1.f + std::exp(-g)) * up[i];
    }
  });
}

// dgate = dout * up * s * (1 + g*(1 - s)), dup = dout * silu(g), s = sigmoid(g)
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      const float s = 1.f / (1.f + std::exp(-g));
      const float silu = g / (1.f + std::exp(-g));
      dgate[i] = dout[i] * up[i] * (s * (1.f + g * (1.f - s)));
      dup[i] = dout[i] * silu;
    }
  });
}

// ---- gpt-oss's clamped SwiGLU ----

void swiglu_clamped_forward(float* out, const float* gate, const float* up, int64_t n, float limit, float alpha) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
      const float glu = g * (1.f / (1.f + std::exp(-(g * alpha))));  // HF: gate * sigmoid(gate * alpha)
      out[i] = (u + 1.f) * glu;
    }
  });
}

// d/dg' [g' s(a g')] = s + a g' s (1 - s); d/du' = g' s(a g')
void swiglu_clamped_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                             float limit, float alpha) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
      const float s = 1.f / (1.f + std::exp(-(g * alpha)));
      const bool g_pass = gate[i] <= limit, u_pass = up[i] >= -limit && up[i] <= limit;
      dgate[i] = g_pass ? dout[i] * (u + 1.f) * (s + alpha * g * s * (1.f - s)) : 0.f;
      dup[i] = u_pass ? dout[i] * g * s : 0.f;
    }
  });
}

// ---- GeGLU (tanh approximation) ----

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

// out = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (torch's
// approximate="tanh")
void geglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      const float t = std::tanh(kGeluK * (g + kGeluA * g * g * g));
      out[i] = 0.5f * g * (1.f + t) * up[i];
    }
  });
}

// d gelu_tanh/dg = 0.5 (1 + t) + 0.5 g (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2);
// dgate = dout * up * that, dup = dout * gelu_tanh(g)
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      const float t = std::tanh(kGeluK * (g + kGeluA * g * g * g));
      const float dgelu = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluA * g * g);
      dgate[i] = dout[i] * up[i] * dgelu;
      dup[i] = dout[i] * (0.5f * g * (1.f + t));
    }
  });
}

// ---- elementwise ----

void add_inplace(float* y, const float* x, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] += x[i];
  });
}

void scale(float* y, const float* x, float alpha, int64_t n) {
  parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = alpha * x[i];
  });
}

}  // namespace rt::cpu
