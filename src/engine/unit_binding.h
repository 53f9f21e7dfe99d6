// Views of one decoder-layer unit's arena layout (StateUnit entries and
// offsets) over any base pointer: the device slot holding its bf16 weights or
// the fp32 buffer receiving its gradients. Binding is free: pointer sums.
#pragma once
#include <cstdint>

#include "core/error.h"
#include "model/block.h"
#include "state/host_state.h"

namespace rt {

template <class T, class P>
BlockWeightsT<T> bind_weights(const StateUnit& u, P* base) {
  BlockWeightsT<T> w{};
  w.layer = u.entries.empty() ? -1 : u.entries[0].layer;
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const T* p = reinterpret_cast<const T*>(base) + u.offsets[k];
    switch (u.entries[k].kind) {
      case WeightKind::attn_norm:
        w.attn_norm = p;
        break;
      case WeightKind::q_proj:
        w.q_proj = p;
        break;
      case WeightKind::q_bias:
        w.q_bias = p;
        break;
      case WeightKind::k_proj:
        w.k_proj = p;
        break;
      case WeightKind::k_bias:
        w.k_bias = p;
        break;
      case WeightKind::v_proj:
        w.v_proj = p;
        break;
      case WeightKind::v_bias:
        w.v_bias = p;
        break;
      case WeightKind::q_norm:
        w.q_norm = p;
        break;
      case WeightKind::k_norm:
        w.k_norm = p;
        break;
      case WeightKind::o_proj:
        w.o_proj = p;
        break;
      case WeightKind::mlp_norm:
        w.mlp_norm = p;
        break;
      case WeightKind::attn_post_norm:
        w.attn_post_norm = p;
        break;
      case WeightKind::mlp_post_norm:
        w.mlp_post_norm = p;
        break;
      case WeightKind::gate_proj:
        w.gate_proj = p;
        break;
      case WeightKind::up_proj:
        w.up_proj = p;
        break;
      case WeightKind::down_proj:
        w.down_proj = p;
        break;
      case WeightKind::router:
        w.router = p;
        break;
      case WeightKind::expert_gate:  // entries list experts in increasing order
        w.expert_gate.push_back(p);
        break;
      case WeightKind::expert_up:
        w.expert_up.push_back(p);
        break;
      case WeightKind::expert_down:
        w.expert_down.push_back(p);
        break;
      case WeightKind::shared_expert_gate:
        w.shared_expert_gate = p;
        break;
      case WeightKind::o_bias:
        w.o_bias = p;
        break;
      case WeightKind::sinks:
        w.sinks = p;
        break;
      case WeightKind::router_bias:
        w.router_bias = p;
        break;
      case WeightKind::expert_gate_bias:
        w.expert_gate_bias.push_back(p);
        break;
      case WeightKind::expert_up_bias:
        w.expert_up_bias.push_back(p);
        break;
      case WeightKind::expert_down_bias:
        w.expert_down_bias.push_back(p);
        break;
      default:
        fail("[engine] unexpected tensor ", u.entries[k].name, " in a decoder layer");
    }
  }
  return w;
}

inline BlockGrads bind_grads(const StateUnit& u, float* base) { return block_grads_from(bind_weights<float>(u, base)); }

// Element offset of the entry of kind k in unit u, -1 when absent.
inline int64_t entry_offset(const StateUnit& u, WeightKind k) {
  for (size_t i = 0; i < u.entries.size(); ++i)
    if (u.entries[i].kind == k) return u.offsets[i];
  return -1;
}

}  // namespace rt
