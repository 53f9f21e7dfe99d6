// The CUDA streaming engine's passes over the layers (stream_engine_impl.h):
// the forward, the head and the backward of one micro-batch, and the
// layer-major forward and backward over K micro-batches; stream_engine.cpp
// describes the schedule and runs the step around them.
#include "engine/cuda/stream_engine_impl.h"

namespace rt::cuda {

void StreamEngine::load_for_forward(int64_t i) {
  weights_->load_layer(i);
  for (int64_t j = i + 1; j < std::min<int64_t>(s_.n_layers, i + weights_->prefetch_depth()) &&
                          track_.is_updated(static_cast<size_t>(j + 1), track_.need_version());
       ++j)
    weights_->load_layer(j);
}

void StreamEngine::forward_layer_major() {
  const int64_t L = s_.n_layers, C = s_.hidden;
  const int S = weights_->count();
  auto& units = st_.units();
  cudaStream_t cs = dev_.compute.get();
  if (host_embed_)
    track_.wait_updated(0, track_.need_version());
  else
    weights_->ensure_embed();
  auto span = dev_.tracer.gpu_begin(Lane::compute, "embed", -1, cs);
  for (int64_t k = 0; k < K_; ++k) {
    bf16* x0 = ckpt_->lm_out(k, 0);
    if (host_embed_) {
      // one gathered block in pinned memory: the last one's copy must be done
      if (k > 0) CUDA_CHECK(cudaStreamSynchronize(cs));
      host_embed_->gather(ids_h(k), weights_->shadow_src(0));
      host_embed_->copy_in(x0);
    } else {
      embedding_forward(x0, ids_.data() + k * N_, weights_->embed(), N_, C, cs);
    }
    if (s_.embedding_multiplier != 1.0)  // Granite
      scale(x0, x0, static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
    ckpt_->lm_written(k, 0);
  }
  dev_.tracer.gpu_end(span, cs);
  ckpt_->lm_prefetch(0, 0);
  const bool moe = s_.is_moe();  // one routing record per micro-batch (model/moe_aux.h)
  if (moe) {
    for (DeviceMoeAux& a : lm_aux_) a.begin(cs);  // one per micro-batch (the constructor made K_)
  }
  for (int64_t i = 0; i < L; ++i) {
    load_for_forward(i);
    const bf16* w = weights_->use_layer(i);
    const BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
    auto sp = dev_.tracer.gpu_begin(Lane::compute, "forward", static_cast<int>(i), cs);
    const auto codes = ops_->share_weights();  // --matmul fp8: layer i's weights quantized once for the K
    for (int64_t k = 0; k < K_; ++k) {
      const bf16* x = ckpt_->lm_in(k, i);
      if (k + 1 < K_)
        ckpt_->lm_prefetch(k + 1, i);
      else if (i + 1 < L)
        ckpt_->lm_prefetch(0, i + 1);
      else
        ckpt_->lm_prefetch(0, L);  // the first head's input
      bf16* y = ckpt_->lm_out(k, i + 1);
      const MoeLayerRouting routing = moe ? lm_aux_[static_cast<size_t>(k)].forward_routing(i) : MoeLayerRouting{};
      block_forward(*ops_, s_, bw, dm_, x, y, pos_.data() + k * N_, acts_->shared(), doc(k), moe ? &routing : nullptr);
      acts_->keep_attention_half(i, k);  // kept for the backward
      ckpt_->lm_done(k, i);
      ckpt_->lm_written(k, i + 1);
    }
    dev_.tracer.gpu_end(sp, cs);
    if (i + S < L) weights_->release_layer(i);  // the last S layers stay for the backward's turn-around
  }
  if (moe)
    for (int64_t k = 0; k < K_; ++k) count_routing(lm_aux_[static_cast<size_t>(k)]);
}

void StreamEngine::count_routing(DeviceMoeAux& a) {
  a.finish(N_, s_.moe.aux_loss_on() ? s_.moe.router_aux_loss_coef * aux_scale_ : 0.0, aux_scale_, *moe_stats_,
           dev_.compute.get());
}

void StreamEngine::backward_layer_major() {
  const int64_t L = s_.n_layers, C = s_.hidden;
  const int S = weights_->count();
  auto& units = st_.units();
  cudaStream_t cs = dev_.compute.get();
  for (int64_t i = L - 1; i >= 0; --i) {
    const bf16* w = weights_->use_layer(i);
    grads_->wait_zeroed(static_cast<size_t>(i + 1));
    float* g = grads_->dev_grad(static_cast<size_t>(i + 1));
    grads_->begin_layer(i);
    const BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
    const BlockGrads bg = bind_grads(units[i + 1], g);
    auto sp = dev_.tracer.gpu_begin(Lane::compute, "backward", static_cast<int>(i), cs);
    {
      const auto codes = ops_->share_weights();  // --matmul fp8: layer i's weights quantized once for the K
      // in micro-batch order: the gradient sums as micro-batch-major's do
      for (int64_t k = 0; k < K_; ++k) {
        const bf16* x = ckpt_->lm_in(k, i);
        if (k + 1 < K_)
          ckpt_->lm_prefetch(k + 1, i);
        else if (i > 0)
          ckpt_->lm_prefetch(0, i - 1);
        const int32_t* pos = pos_.data() + k * N_;
        block_recompute(*ops_, s_, bw, dm_, x, pos, *acts_, i, doc(k), k);
        const MoeLayerRouting back =
            s_.is_moe() ? lm_aux_[static_cast<size_t>(k)].backward_routing() : MoeLayerRouting{};
        block_backward(*ops_, s_, bw, dm_, x, dx(k), dx(k), pos, acts_->shared(), *bscratch_, bg, doc(k),
                       s_.is_moe() ? &back : nullptr);
        ckpt_->lm_done(k, i);
      }
    }
    dev_.tracer.gpu_end(sp, cs);
    grads_->end_layer(i, /*first_micro=*/true);  // the whole step's gradient of layer i: it leaves once
    weights_->release_layer(i);
    if (i - S >= 0) weights_->load_layer(i - S);
  }
  for (int64_t k = 0; k < K_; ++k) {
    if (s_.embedding_multiplier != 1.0)  // Granite: x0 = embed * m
      scale(dx(k), dx(k), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
    if (host_embed_) {
      host_embed_->land(dx(k), ids_h(k), k == 0);
    } else {
      grads_->wait_zeroed(0);
      Scratch sc{scratch_.data(), scratch_.size()};
      embedding_backward(grads_->dev_grad(0), dx(k), ids_.data() + k * N_, N_, C, s_.vocab, sc, cs);
    }
  }
  grads_->end_backward(/*first_micro=*/true);
}

void StreamEngine::forward(bool training) {
  const int64_t L = s_.n_layers, C = s_.hidden;
  const int S = weights_->count();
  auto& units = st_.units();
  cudaStream_t cs = dev_.compute.get();
  if (host_embed_) {
    // Rows of the current shadow, gathered here, then one copy in on the
    // compute stream. The staging buffer's previous copy is done:
    // upload_batch synchronised the stream.
    track_.wait_updated(0, track_.need_version());
    host_embed_->gather(host_io_.as<int32_t>(), weights_->shadow_src(0));
  } else {
    weights_->ensure_embed();
  }
  auto span = dev_.tracer.gpu_begin(Lane::compute, "embed", -1, cs);
  ckpt_->before_write(0);
  if (host_embed_)
    host_embed_->copy_in(ckpt_->at(0));
  else
    embedding_forward(ckpt_->at(0), ids_.data(), weights_->embed(), N_, C, cs);
  if (s_.embedding_multiplier != 1.0)  // Granite
    scale(ckpt_->at(0), ckpt_->at(0), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
  dev_.tracer.gpu_end(span, cs);
  if (training) ckpt_->written(0);
  const bool moe = training && s_.is_moe();  // the training forward counts the routing (model/moe_aux.h)
  if (moe) aux_->begin(cs);
  for (int64_t i = 0; i < L; ++i) {
    load_for_forward(i);
    const bf16* w = weights_->use_layer(i);
    ckpt_->before_write(i + 1);
    auto sp = dev_.tracer.gpu_begin(Lane::compute, "forward", static_cast<int>(i), cs);
    const MoeLayerRouting routing = moe ? aux_->forward_routing(i) : MoeLayerRouting{};
    block_forward(*ops_, s_, bind_weights<bf16>(units[i + 1], w), dm_, ckpt_->at(i), ckpt_->at(i + 1), pos_.data(),
                  training ? acts_->of(i) : acts_->shared(), doc(0), moe ? &routing : nullptr);
    if (training) acts_->keep_attention_half(i);
    dev_.tracer.gpu_end(sp, cs);
    if (training && i + 1 < L) ckpt_->written(i + 1);
    // the last S layers stay for the backward's turn-around
    if (i + S < L || !training) weights_->release_layer(i);
  }
  if (moe) count_routing(*aux_);  // the load-balancing loss and its gradient factor
}

void StreamEngine::head(bool training, float grad_scale, const bf16* xL, const int32_t* targets, bf16* dx_out) {
  const int64_t L = s_.n_layers, C = s_.hidden;
  const size_t H = static_cast<size_t>(L + 1);
  auto& hu = st_.units()[H];
  cudaStream_t cs = dev_.compute.get();
  weights_->ensure_head();
  const bf16* final_norm = weights_->head() + entry_offset(hu, WeightKind::final_norm);
  const bf16* lm = s_.tie_embeddings ? weights_->embed() : weights_->head() + entry_offset(hu, WeightKind::lm_head);
  float* g_norm = grads_->dev_grad(H) + entry_offset(hu, WeightKind::final_norm);
  float* g_lm = s_.tie_embeddings ? grads_->dev_grad(0) : grads_->dev_grad(H) + entry_offset(hu, WeightKind::lm_head);
  if (training) {  // first writes of these gradients this step
    grads_->wait_zeroed(H);
    if (s_.tie_embeddings) grads_->wait_zeroed(0);
  }
  auto span = dev_.tracer.gpu_begin(Lane::compute, "head", -1, cs);
  const float noff = static_cast<float>(s_.norm_offset);  // Gemma: (1 + w)
  rms_norm_forward(hf_.data(), rstd_f_.data(), xL, final_norm, N_, C, static_cast<float>(s_.rms_eps), cs, noff);
  const float ls = static_cast<float>(1.0 / s_.logits_scaling);  // Granite: logits / logits_scaling
  if (ls != 1.f) scale(hf_.data(), hf_.data(), ls, N_ * C, cs);
  Scratch sc{scratch_.data(), scratch_.size()};
  lm_head_cross_entropy(dev_.blas, training ? dhf_.data() : nullptr, training ? g_lm : nullptr, totals_.data(),
                        hf_.data(), lm, targets, N_, C, s_.vocab, grad_scale, opt_.ce_chunk_rows, sc, cs,
                        static_cast<float>(s_.final_softcap));  // Gemma 2
  if (training && ls != 1.f) scale(dhf_.data(), dhf_.data(), ls, N_ * C, cs);
  if (training)
    rms_norm_backward(dx_out, g_norm, dhf_.data(), xL, final_norm, rstd_f_.data(), nullptr, N_, C, sc, cs, noff);
  dev_.tracer.gpu_end(span, cs);
}

void StreamEngine::backward() {
  const int64_t L = s_.n_layers, C = s_.hidden;
  const int S = weights_->count();
  auto& units = st_.units();
  cudaStream_t cs = dev_.compute.get();
  ckpt_->begin_backward();
  // MoE: the load-balancing gradient
  const MoeLayerRouting back_routing = aux_ ? aux_->backward_routing() : MoeLayerRouting{};
  for (int64_t i = L - 1; i >= 0; --i) {
    const bf16* w = weights_->use_layer(i);
    ckpt_->before_backward(i);
    grads_->wait_zeroed(static_cast<size_t>(i + 1));
    float* g = grads_->dev_grad(static_cast<size_t>(i + 1));
    grads_->begin_layer(i);
    BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
    auto sp = dev_.tracer.gpu_begin(Lane::compute, "backward", static_cast<int>(i), cs);
    block_recompute(*ops_, s_, bw, dm_, ckpt_->at(i), pos_.data(), *acts_, i, doc(0));
    block_backward(*ops_, s_, bw, dm_, ckpt_->at(i), dx_.data(), dx_.data(), pos_.data(), acts_->of(i), *bscratch_,
                   bind_grads(units[i + 1], g), doc(0), s_.is_moe() ? &back_routing : nullptr);
    dev_.tracer.gpu_end(sp, cs);
    ckpt_->after_backward(i);
    grads_->end_layer(i, first_micro_);
    weights_->release_layer(i);
    if (i - S >= 0) weights_->load_layer(i - S);
  }
  if (s_.embedding_multiplier != 1.0)  // Granite: x0 = embed * m
    scale(dx_.data(), dx_.data(), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
  if (host_embed_) {
    host_embed_->land(dx_.data(), host_io_.as<int32_t>(), first_micro_);
  } else {
    grads_->wait_zeroed(0);
    Scratch sc{scratch_.data(), scratch_.size()};
    embedding_backward(grads_->dev_grad(0), dx_.data(), ids_.data(), N_, C, s_.vocab, sc, cs);
  }
  grads_->end_backward(first_micro_);
}

}  // namespace rt::cuda
