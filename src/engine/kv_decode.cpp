#include "engine/kv_decode.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace rt {

KvDecoder::KvDecoder(CpuOps& ops, const ModelSpec& s, const ModelWeightsT<float>& w, int64_t capacity)
    : ops_(ops), s_(s), w_(w), cap_(capacity) {
  RT_CHECK(capacity >= 1, "[sample] the key/value cache needs a capacity >= 1");
  const int64_t C = s.hidden, QD = s.q_dim(), KD = s.kv_dim(), L = s.n_layers;
  const int64_t F = std::max<int64_t>({s.intermediate, s.moe.shared_intermediate, 1});
  k_.resize(static_cast<size_t>(L * cap_ * KD));
  v_.resize(k_.size());
  for (auto* b : {&x_, &xn_, &h_, &hn_, &y_, &so_}) b->resize(static_cast<size_t>(C));
  for (auto* b : {&q_, &qr_, &att_}) b->resize(static_cast<size_t>(QD));
  for (auto* b : {&kr_, &kn_, &vn_}) b->resize(static_cast<size_t>(KD));
  for (auto* b : {&g_, &u_, &a_}) b->resize(static_cast<size_t>(F));
  probs_.resize(static_cast<size_t>(std::max<int64_t>(s.moe.n_experts, 1)));
  sl_.resize(1);
  rstd_.resize(static_cast<size_t>(std::max(s.n_heads, s.n_kv_heads)));
  p_.resize(static_cast<size_t>(cap_));
}

const float* KvDecoder::step(int32_t id) {
  RT_CHECK(n_ < cap_, "[sample] the key/value cache is full (", cap_, " positions)");
  const ModelSpec& s = s_;
  const int64_t C = s.hidden, H = s.n_heads, G = s.n_kv_heads, D = s.head_dim, F = s.intermediate;
  const int64_t QD = H * D, KD = G * D, pos = n_;
  const float eps = static_cast<float>(s.rms_eps), scale = static_cast<float>(s.attention_softmax_scale());
  const float r = static_cast<float>(s.residual_multiplier);  // Granite's multipliers (model/block.h)
  const int32_t p32 = static_cast<int32_t>(pos);
  ops_.embedding_forward(x_.data(), &id, w_.embed, 1, C);
  if (s.embedding_multiplier != 1.0) ops_.scale(x_.data(), x_.data(), static_cast<float>(s.embedding_multiplier), C);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const BlockWeightsT<float>& w = w_.layers[static_cast<size_t>(l)];
    float* kc = k_.data() + l * cap_ * KD;
    float* vc = v_.data() + l * cap_ * KD;
    // OLMo2 (post_norms): q/k/v read x itself; each branch's output is normed before its residual add
    const float* xn = s.post_norms ? x_.data() : xn_.data();
    if (!s.post_norms) ops_.rms_norm_forward(xn_.data(), rstd_.data(), x_.data(), w.attn_norm, 1, C, eps);
    float* k = kc + pos * KD;
    if (s.qk_norm) {
      ops_.linear_forward(qr_.data(), xn, w.q_proj, w.q_bias, 1, C, QD);
      ops_.linear_forward(kr_.data(), xn, w.k_proj, w.k_bias, 1, C, KD);
      if (s.qk_norm_whole) {
        ops_.rms_norm_forward(q_.data(), rstd_.data(), qr_.data(), w.q_norm, 1, QD, eps);
        ops_.rms_norm_forward(k, rstd_.data(), kr_.data(), w.k_norm, 1, KD, eps);
      } else {
        ops_.rms_norm_forward(q_.data(), rstd_.data(), qr_.data(), w.q_norm, H, D, eps);
        ops_.rms_norm_forward(k, rstd_.data(), kr_.data(), w.k_norm, G, D, eps);
      }
    } else {
      ops_.linear_forward(q_.data(), xn, w.q_proj, w.q_bias, 1, C, QD);
      ops_.linear_forward(k, xn, w.k_proj, w.k_bias, 1, C, KD);
    }
    ops_.linear_forward(vc + pos * KD, xn, w.v_proj, w.v_bias, 1, C, KD);
    if (s.layer_uses_rope(l)) {  // SmolLM3's NoPE layers do not rotate; Gemma 3's local layers their own RoPE
      ops_.rope_forward(q_.data(), &p32, 1, H, D, s.layer_rope_local(l));
      ops_.rope_forward(k, &p32, 1, G, D, s.layer_rope_local(l));
    }
    // Gemma: the window of a local layer (keys pos - window + 1 .. pos) and the attention soft cap
    const int64_t window = s.layer_window(l), j0 = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    const float cap = static_cast<float>(s.attn_softcap);
    // one query row against the cached keys 0..pos (causal), heads in groups of H / G
    for (int64_t hd = 0; hd < H; ++hd) {
      const int64_t g = hd / (H / G);
      const float* qh = q_.data() + hd * D;
      float mx = w.sinks ? w.sinks[hd] : -INFINITY;  // gpt-oss: the sink joins the softmax (cpu/attention.cpp)
      for (int64_t j = j0; j <= pos; ++j) {
        const float* kj = kc + j * KD + g * D;
        float d = 0;
        for (int64_t e = 0; e < D; ++e) d += qh[e] * kj[e];
        p_[j] = cap > 0.f ? std::tanh(d * scale / cap) * cap : d * scale;
        mx = std::max(mx, p_[j]);
      }
      float sum = 0;
      for (int64_t j = j0; j <= pos; ++j) sum += p_[j] = std::exp(p_[j] - mx);
      if (w.sinks) sum += std::exp(w.sinks[hd] - mx);
      float* o = att_.data() + hd * D;
      std::fill(o, o + D, 0.f);
      for (int64_t j = j0; j <= pos; ++j) {
        const float pj = p_[j] / sum;
        const float* vj = vc + j * KD + g * D;
        for (int64_t e = 0; e < D; ++e) o[e] += pj * vj[e];
      }
    }
    if (s.sandwich_norms) {  // Gemma 2/3: h = x + rms(att Wo^T)·w_attn_post_norm
      ops_.linear_forward(xn_.data(), att_.data(), w.o_proj, w.o_bias, 1, QD, C);
      ops_.rms_norm_forward(h_.data(), rstd_.data(), xn_.data(), w.attn_post_norm, 1, C, eps);
    } else if (s.post_norms) {
      ops_.linear_forward(xn_.data(), att_.data(), w.o_proj, nullptr, 1, QD, C);
      ops_.rms_norm_forward(h_.data(), rstd_.data(), xn_.data(), w.attn_norm, 1, C, eps);
    } else {
      ops_.linear_forward(h_.data(), att_.data(), w.o_proj, w.o_bias, 1, QD, C);
      if (r != 1.f) ops_.scale(h_.data(), h_.data(), r, C);
    }
    ops_.add_inplace(h_.data(), x_.data(), C);
    const float* hn = s.post_norms ? h_.data() : hn_.data();  // the MLP's input
    if (!s.post_norms) ops_.rms_norm_forward(hn_.data(), rstd_.data(), h_.data(), w.mlp_norm, 1, C, eps);
    if (s.is_moe()) {
      ops_.moe_forward(y_.data(), probs_.data(), hn_.data(), w.router, w.expert_gate.data(), w.expert_up.data(),
                       w.expert_down.data(), 1, C, s.moe, nullptr, nullptr, moe_biases(w));
      if (s.moe.shared_intermediate > 0) {  // Qwen2-MoE's shared expert, gated
        const int64_t Fs = s.moe.shared_intermediate;
        ops_.linear_forward(g_.data(), hn_.data(), w.gate_proj, nullptr, 1, C, Fs);
        ops_.linear_forward(u_.data(), hn_.data(), w.up_proj, nullptr, 1, C, Fs);
        ops_.swiglu_forward(a_.data(), g_.data(), u_.data(), Fs);
        ops_.linear_forward(so_.data(), a_.data(), w.down_proj, nullptr, 1, Fs, C);
        ops_.linear_forward(sl_.data(), hn_.data(), w.shared_expert_gate, nullptr, 1, C, 1);
        ops_.moe_shared_gate_forward(y_.data(), so_.data(), sl_.data(), 1, C);
      }
    } else {
      ops_.linear_forward(g_.data(), hn, w.gate_proj, nullptr, 1, C, F);
      ops_.linear_forward(u_.data(), hn, w.up_proj, nullptr, 1, C, F);
      glu_forward(ops_, s, a_.data(), g_.data(), u_.data(), F);
      if (s.sandwich_norms) {
        ops_.linear_forward(so_.data(), a_.data(), w.down_proj, nullptr, 1, F, C);
        ops_.rms_norm_forward(y_.data(), rstd_.data(), so_.data(), w.mlp_post_norm, 1, C, eps);
      } else if (s.post_norms) {
        ops_.linear_forward(so_.data(), a_.data(), w.down_proj, nullptr, 1, F, C);
        ops_.rms_norm_forward(y_.data(), rstd_.data(), so_.data(), w.mlp_norm, 1, C, eps);
      } else {
        ops_.linear_forward(y_.data(), a_.data(), w.down_proj, nullptr, 1, F, C);
        if (r != 1.f) ops_.scale(y_.data(), y_.data(), r, C);
      }
    }
    ops_.add_inplace(y_.data(), h_.data(), C);
    std::swap(x_, y_);
  }
  ops_.rms_norm_forward(xn_.data(), rstd_.data(), x_.data(), w_.final_norm, 1, C, eps);
  if (s.logits_scaling != 1.0)  // Granite: the logits hf W^T come out divided by logits_scaling
    ops_.scale(xn_.data(), xn_.data(), static_cast<float>(1.0 / s.logits_scaling), C);
  ++n_;
  return xn_.data();
}

}  // namespace rt
