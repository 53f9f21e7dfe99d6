#!/usr/bin/env python3
"""Generate the PyTorch/transformers reference fixtures that ramtrain's C++ tests compare against.

Run (from the repository root, CPU only, no network):
    python3 tools/make_hf_fixtures.py --out tests/fixtures
    python3 tools/make_hf_fixtures.py --only olmo2_postnorm   # one model fixture, nothing else
    python3 tools/make_hf_fixtures.py --only gemma3_multimodal
Needs torch + transformers 5.x + safetensors (`pip install torch transformers safetensors`).
Deterministic: fixed seeds, torch.use_deterministic_algorithms(True), one CPU thread, fp32
defaults, safetensors written with a fixed metadata dict, JSON with sort_keys and Python's
float repr. Running it twice on the same machine gives byte-identical files; other
torch/transformers versions or CPUs may differ in the last bits (the versions are recorded).

What it writes (all tensors little-endian fp32 "F32" unless said otherwise):

<out>/hf/<name>/   for name in llama_gqa_rope3, mistral, qwen2_bias_tied, qwen3_qknorm_hd,
                   olmo2_postnorm, granite_mult, smollm3_nope, gemma_geglu,
                   gemma2_softcap_window, gemma3_local_rope, phi3_longrope_short,
                   phi4mini_partial_tied, gptoss_sinks_window
  config.json        exactly what transformers' save_pretrained wrote (5.x dialect:
                     "rope_parameters" = {"rope_type", "rope_theta", ...}).
  model.safetensors  exactly what save_pretrained(safe_serialization=True) wrote: HF tensor
                     names, fp32. Tied models (qwen2_bias_tied) hold no lm_head.weight.
  tokens.txt         B lines, one per sequence, T token ids separated by single spaces.
  reference.safetensors
                     "logits"        [B, T, V]  the model's output logits for tokens.txt
                     "grad.<name>"   same shape as the parameter, for every name of
                                     model.named_parameters() (HF names such as
                                     "model.layers.0.self_attn.q_proj.weight"); the gradient
                                     of `loss` below. Tied embeddings are one parameter:
                                     "grad.model.embed_tokens.weight" holds both the embedding
                                     and the LM-head contribution; there is no grad.lm_head.
  reference.json     {"loss": fp32 loss as a Python float repr (exact),
                      "loss_f64": the same weights and tokens run in float64 (context only),
                      "n_predicted": B*(T-1), "batch": B, "seq_len": T, "vocab": V,
                      "family": config.model_type, "seed", "torch_version",
                      "transformers_version"}
                     loss = mean over the B*(T-1) positions t<T-1 of
                            -log softmax(logits[b, t])[tokens[b, t+1]]
                     (HF labels=input_ids, shifted inside; causal attention, no padding).
  The model forward uses eager attention, no attention mask (full causal), positions 0..T-1.

<out>/hf/gemma3_multimodal/
  The gemma3_local_rope text model inside a Gemma3ForConditionalGeneration with a one-layer
  SigLIP vision tower and projector (mm_fixture_write): config.json and model.safetensors as
  save_pretrained wrote them (transformers 5.25 writes the 4.x names: language_model.model.*,
  vision_tower.*, multi_modal_projector.*), tokens.txt, reference.safetensors and
  reference.json as above for input_ids alone (no pixel values); the gradients are the
  language model's, named as in the text model ("grad.model.layers.0..."), and
  reference.json adds "carried_parameters" (the vision and projector parameters).

<out>/hf/configs/<variant>/config.json
  The llama_gqa_rope3 config rewritten by hand in the transformers 4.x dialect, no weights:
    llama3_rope_type   top-level "rope_theta", "rope_scaling": {"rope_type": "llama3", ...},
                       "torch_dtype": "float32"
    llama3_type_key    same, but the old key "type": "llama3" instead of "rope_type"
    rope_default       "rope_theta" only, "rope_scaling": null (plain RoPE)
<out>/hf/configs/expected.json
  {variant: {"rope_type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
   "original_max_position_embeddings" (the last four absent for plain RoPE),
   "inv_freq": [head_dim/2 floats]}} as transformers itself reads each variant; the
  llama3 variants' inv_freq equals that of the llama_gqa_rope3 fixture (checked here).

<out>/adamw/
  adamw.safetensors  "w.init" [8, 16], "n.init" [16]: initial parameters;
                     "w.grad.k", "n.grad.k" (k = 1..5): the raw, unclipped gradients of step k;
                     "w.step.k", "n.step.k": parameters after step k;
                     "w.exp_avg.k", "w.exp_avg_sq.k", "n.exp_avg.k", "n.exp_avg_sq.k":
                     AdamW moments after step k (k = 1..5; the brief's minimum is k = 5).
  adamw.json         {"lr": [5 per-step learning rates], "beta1", "beta2", "eps",
                      "weight_decay": {"w": 0.1, "n": 0.0}, "max_grad_norm": 1.0,
                      "grad_norm": [pre-clip global L2 norm over both tensors per step],
                      "clip_coef": [coefficient applied per step, 1.0 when not clipped],
                      "steps": 5, "seed", "torch_version"}
  Each step: clip_grad_norm_(both, 1.0) (torch: coef = min(1, max_norm / (norm + 1e-6)),
  grads multiplied by coef), then torch.optim.AdamW (decoupled weight decay
  p *= 1 - lr*wd, bias-corrected moments, eps added to sqrt(v_hat)), foreach/fused off.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

SEED = 1234
BATCH = 2
SEQ_LEN = 16
ST_METADATA = {"format": "pt"}  # one key: safetensors may order several keys differently per run


def setup_determinism():
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)


def json_write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, sort_keys=True, indent=2)
        f.write("\n")


def safetensors_write(path, tensors):
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, path,
              metadata=dict(ST_METADATA))


def file_sizes(dir_path):
    return {f: os.path.getsize(os.path.join(dir_path, f)) for f in sorted(os.listdir(dir_path))}


# ---------------------------------------------------------------- HF model fixtures

def model_configs():
    """name -> (config class name, kwargs). Dims tiny; each family exercises one feature."""
    common = dict(num_hidden_layers=2, max_position_embeddings=64, hidden_act="silu",
                  use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    gemma = {k: v for k, v in common.items() if k != "hidden_act"}  # Gemma names its activation itself
    gemma["rms_norm_eps"] = 1e-6
    return {
        # GQA 4/2, head_dim 16, llama3 rope: with theta 1e4 and original context 32 the 8
        # frequencies fall in all three llama3 regions (checked in llama3_regions_check).
        "llama_gqa_rope3": ("LlamaConfig", dict(
            common, vocab_size=96, hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 32})),
        "mistral": ("MistralConfig", dict(
            common, vocab_size=80, hidden_size=32, intermediate_size=64,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
            sliding_window=None, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        "qwen2_bias_tied": ("Qwen2Config", dict(
            common, vocab_size=112, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            tie_word_embeddings=True, use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "qwen3_qknorm_hd": ("Qwen3Config", dict(
            common, vocab_size=128, hidden_size=48, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # OLMo2: no pre-norms, RMSNorm on each branch's output before its residual add
        # (post_attention_layernorm, post_feedforward_layernorm), q/k RMSNorm over the whole
        # projection ([H*D] and [G*D] weights), GQA 4/2.
        "olmo2_postnorm": ("Olmo2Config", dict(
            common, vocab_size=104, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            tie_word_embeddings=False, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        # Granite: embedding_multiplier, residual_multiplier (each branch's output before its
        # residual add), attention_multiplier (the softmax scale instead of 1/sqrt(head_dim)),
        # logits_scaling (logits divided by it); a vocabulary that is not a multiple of 8.
        "granite_mult": ("GraniteConfig", dict(
            common, vocab_size=101, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            embedding_multiplier=2.5, residual_multiplier=0.6, attention_multiplier=0.2,
            logits_scaling=1.7,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # SmolLM3: layer 1 has no RoPE (no_rope_layers [1, 0]: 1 = RoPE), tied embeddings.
        "smollm3_nope": ("SmolLM3Config", dict(
            common, vocab_size=96, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
            no_rope_layers=[1, 0], use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
        # Gemma: (1 + w) RMSNorms, embedding times sqrt(hidden), GeGLU (gelu tanh), tied.
        "gemma_geglu": ("GemmaConfig", dict(
            gemma, vocab_size=96, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # Gemma 2: sandwich norms, query_pre_attn_scalar, attention and final soft caps small
        # enough to bite, layers 0 and 2 sliding with a window of 5 < SEQ_LEN, untied.
        "gemma2_softcap_window": ("Gemma2Config", dict(
            gemma, num_hidden_layers=3, vocab_size=104, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=False,
            query_pre_attn_scalar=24, sliding_window=5, attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # Gemma 3 (text): q/k (1 + w) norms, layers 0 and 2 sliding (window 6) rotating with
        # their own base, the global layer with linear RoPE scaling; tied.
        "gemma3_local_rope": ("Gemma3TextConfig", dict(
            gemma, num_hidden_layers=3, vocab_size=112, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
            query_pre_attn_scalar=16, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
        # Phi-3: fused qkv_proj and gate_up_proj, GQA 4/2, head_dim 12 rotated whole, LongRoPE
        # with T = 16 <= original_max_position_embeddings 32 (the short factors; attention
        # factor sqrt(1 + ln(64/32) / ln 32)), sliding_window 16 = T (the mask at its edge).
        "phi3_longrope_short": ("Phi3Config", dict(
            common, vocab_size=96, hidden_size=48, intermediate_size=80,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            tie_word_embeddings=False, sliding_window=16, original_max_position_embeddings=32,
            resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": [1.0, 1.3, 2.1, 3.7, 5.2, 8.9],
                             "long_factor": [1.5, 2.5, 4.0, 7.0, 12.0, 20.0]})),
        # Phi-4-mini-like: partial_rotary_factor 0.75 (12 of head_dim 16 rotate), tied
        # embeddings, LongRoPE with T = 16 > original_max_position_embeddings 8 (the long
        # factors; attention factor sqrt(1 + ln 8 / ln 8)), no window.
        "phi4mini_partial_tied": ("Phi3Config", dict(
            common, vocab_size=112, hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            tie_word_embeddings=True, sliding_window=None, original_max_position_embeddings=8,
            resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0, 1.0, 1.2, 1.6, 2.4, 3.0],
                             "long_factor": [1.1, 1.9, 3.3, 6.0, 11.5, 23.0]})),
        # gpt-oss: attention sinks, q/k/v/o biases, layer 0 sliding (window 5 < T = 16), layer 1
        # full; YaRN (head_dim 16, theta 150000, original context 4096: pairs 0-2 extrapolate,
        # 3-4 blend, 5-7 interpolate; attention factor 0.1 ln 32 + 1); 4 experts, top 2, softmax
        # over the 2 selected router logits, router and expert biases, SwiGLU clamped at 2.0 so
        # that both clamps bite (gate and up have std ~2 here).
        "gptoss_sinks_window": ("GptOssConfig", dict(
            common, vocab_size=104, hidden_size=48, intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            tie_word_embeddings=False, attention_bias=True, sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
            num_local_experts=4, num_experts_per_tok=2, swiglu_limit=2.0, swiglu_alpha=1.702,
            router_aux_loss_coef=0.0, output_router_logits=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 4096})),
    }


def params_reinit(model, gen):
    """Overwrite every parameter from `gen` so the model is far from uniform predictions.

    Norm weights 1 + 0.3 randn (Gemma's (1 + w) norms: w = 0.3 randn, the same scale), biases 0.3 randn, embeddings std 1.0 (0.35 when tied, since the
    same matrix is the LM head), other matrices std 0.3.
    """
    tied = model.config.tie_word_embeddings
    norm_one = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                v = norm_one + 0.3 * r
            elif name.endswith(".bias"):
                v = 0.3 * r
            elif name.endswith(".sinks"):  # gpt-oss: sinks that weigh in the softmax
                v = 1.0 * r
            elif "embed_tokens" in name:
                v = (0.35 if tied else 1.0) * r
            else:
                v = 0.3 * r
            p.copy_(v)


def llama3_regions_check(model, cfg_kwargs):
    """Print default vs llama3 inv_freq and require all three llama3 regions to occur."""
    rp = cfg_kwargs["rope_parameters"]
    dim = cfg_kwargs["head_dim"]
    base = rp["rope_theta"]
    plain = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaled = model.model.rotary_emb.inv_freq.detach().float()
    high_wl = rp["original_max_position_embeddings"] / rp["high_freq_factor"]
    low_wl = rp["original_max_position_embeddings"] / rp["low_freq_factor"]
    regions = []
    print(f"  llama3 inv_freq (high_freq_wavelen {high_wl}, low_freq_wavelen {low_wl}):")
    for i in range(plain.numel()):
        wl = 2 * math.pi / plain[i].item()
        region = "unscaled" if wl < high_wl else ("scaled" if wl > low_wl else "smoothed")
        regions.append(region)
        print(f"    i={i} wavelen={wl:10.3f} plain={plain[i].item():.8e} "
              f"llama3={scaled[i].item():.8e} ratio={plain[i].item() / scaled[i].item():.4f} {region}")
    for want in ("unscaled", "smoothed", "scaled"):
        if want not in regions:
            sys.exit(f"[make_hf_fixtures] llama3 region '{want}' missing: change rope_theta, "
                     "head_dim or original_max_position_embeddings")
    if torch.equal(plain, scaled):
        sys.exit("[make_hf_fixtures] llama3 scaling left inv_freq unchanged")


def tokens_make(vocab, gen):
    return torch.randint(0, vocab, (BATCH, SEQ_LEN), generator=gen, dtype=torch.int64)


def loss_manual(logits, ids):
    """Independent check of HF's shifted mean loss over B*(T-1) positions."""
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1, :].reshape(-1, v).double(), ids[:, 1:].reshape(-1), reduction="mean")


# Each committed fixture's seed, by name: the Phi3 and Gemma fixtures were
# added on separate branches, both at the list's end, so their position in
# model_configs() no longer gives the seed they were made with. A new fixture
# without an entry takes SEED + its position; add it here once committed.
FIXTURE_SEEDS = {
    "llama_gqa_rope3": 1234, "mistral": 1235, "qwen2_bias_tied": 1236, "qwen3_qknorm_hd": 1237,
    "olmo2_postnorm": 1238, "granite_mult": 1239, "smollm3_nope": 1240, "gemma_geglu": 1241,
    "gemma2_softcap_window": 1242, "gemma3_local_rope": 1243, "phi3_longrope_short": 1241,
    "phi4mini_partial_tied": 1242, "gptoss_sinks_window": 1246,
}


def hf_fixture_write(out_dir, name, cls_name, cfg_kwargs, seed):
    cfg = getattr(transformers, cls_name)(**cfg_kwargs)
    torch.manual_seed(seed)
    # MoE models (gpt-oss): the experts' eager loop, as modeling_*.py writes it (the grouped_mm
    # default takes no float64, which the loss_f64 run below needs)
    extra = {"experts_implementation": "eager"} if cfg.model_type == "gpt_oss" else {}
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", **extra)
    model = model.to(torch.float32)
    if model.config._attn_implementation != "eager":
        sys.exit(f"[make_hf_fixtures] {name}: attention is {model.config._attn_implementation}, want eager")
    gen = torch.Generator().manual_seed(seed)
    params_reinit(model, gen)
    ids = tokens_make(cfg.vocab_size, gen)
    if name == "llama_gqa_rope3":
        llama3_regions_check(model, cfg_kwargs)
    if cfg.model_type == "phi3":
        print(f"  phi3 rope_parameters={dict(cfg.rope_parameters)} "
              f"attention_scaling={model.model.rotary_emb.attention_scaling!r}")

    model.train()  # dropout is 0 everywhere; train() only matches how ramtrain uses it
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    logits = out.logits.detach()
    loss = out.loss.detach()
    if cfg.model_type == "phi3" and cfg.rope_parameters["rope_type"] == "longrope":
        rope = model.model.rotary_emb
        want_long = SEQ_LEN > cfg.rope_parameters["original_max_position_embeddings"]
        used_long = not torch.equal(rope.inv_freq, rope.original_inv_freq)
        print(f"  longrope: T={SEQ_LEN} used the {'long' if used_long else 'short'} factors")
        if used_long != want_long:
            sys.exit(f"[make_hf_fixtures] {name}: LongRoPE picked the wrong factors")
    if logits.dtype != torch.float32 or loss.dtype != torch.float32:
        sys.exit(f"[make_hf_fixtures] {name}: expected fp32 logits/loss, got {logits.dtype}/{loss.dtype}")
    lm = loss_manual(logits, ids).item()
    if abs(lm - loss.item()) > 1e-5 * abs(lm):
        sys.exit(f"[make_hf_fixtures] {name}: HF loss {loss.item()} != shifted mean CE {lm}")

    grads = {}
    names = []
    for pname, p in model.named_parameters():
        if p.grad is None:
            sys.exit(f"[make_hf_fixtures] {name}: parameter {pname} got no gradient")
        grads["grad." + pname] = p.grad.detach()
        names.append(pname)
    if cfg.tie_word_embeddings and any(n.startswith("lm_head") for n in names):
        sys.exit(f"[make_hf_fixtures] {name}: tied model lists lm_head as its own parameter")

    model64 = copy.deepcopy(model).to(torch.float64)
    with torch.no_grad():
        loss64 = model64(input_ids=ids, labels=ids).loss.item()

    d = os.path.join(out_dir, "hf", name)
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(d, f))
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        saved_cfg = json.load(f)
    if "rope_parameters" not in saved_cfg:
        sys.exit(f"[make_hf_fixtures] {name}: saved config.json has no rope_parameters "
                 f"(keys: {sorted(saved_cfg)}); this script expects the transformers 5.x dialect")
    with open(os.path.join(d, "tokens.txt"), "w", encoding="utf-8") as f:
        for row in ids.tolist():
            f.write(" ".join(str(t) for t in row) + "\n")
    safetensors_write(os.path.join(d, "reference.safetensors"), {"logits": logits, **grads})
    json_write(os.path.join(d, "reference.json"), {
        "loss": float(loss.item()),
        "loss_f64": float(loss64),
        "n_predicted": BATCH * (SEQ_LEN - 1),
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "vocab": cfg.vocab_size,
        "family": cfg.model_type,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
    })
    lnv = math.log(cfg.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: loss={loss.item()!r} loss_f64={loss64!r} ln(vocab)={lnv:.6f} "
          f"diff={loss.item() - lnv:+.3f} params={n_params} rope_parameters={saved_cfg['rope_parameters']}")
    if abs(loss.item() - lnv) <= 0.5:
        sys.exit(f"[make_hf_fixtures] {name}: loss within 0.5 of ln(vocab); raise init scales")
    print(f"  files: {file_sizes(d)}")
    inv = getattr(model.model.rotary_emb, "inv_freq", None)  # Gemma 3 keeps one per layer type
    return saved_cfg, None if inv is None else inv.detach().clone()


# ---------------------------------------------------------------- Gemma 3 multimodal

# The multimodal fixture: the gemma3_local_rope text model inside a
# Gemma3ForConditionalGeneration with a one-layer SigLIP tower (image 28,
# patch 14: 4 patches) and a projector to mm_tokens_per_image = 4 tokens.
MM_NAME = "gemma3_multimodal"
MM_SEED = 1250
MM_VISION = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2, image_size=28, patch_size=14, num_channels=3)


def mm_text_name(name):
    """A Gemma3ForConditionalGeneration parameter's name in the text model (Gemma3ForCausalLM), or None
    for the vision tower and projector (transformers 5.x names: model.language_model.X -> model.X)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name == "lm_head.weight":
        return name
    return None


def mm_fixture_write(out_dir):
    """<out>/hf/gemma3_multimodal/: as the other model fixtures, for input_ids only (no pixel values),
    from transformers' Gemma3ForConditionalGeneration. model.safetensors holds what save_pretrained wrote
    (5.x names: model.language_model.*, model.vision_tower.*, model.multi_modal_projector.*); the
    reference's "grad.<name>" use the text model's names (model.layers.0..., as ramtrain's weight map),
    for the language model's parameters only (the vision tower gets no gradient from ids alone).
    Checked here: the same weights as a Gemma3ForCausalLM give the same loss and logits."""
    text_kw = dict(model_configs()["gemma3_local_rope"][1])
    cfg = transformers.Gemma3Config(text_config=text_kw, vision_config=dict(MM_VISION), mm_tokens_per_image=4,
                                    boi_token_index=100, eoi_token_index=101, image_token_index=102,
                                    tie_word_embeddings=True)
    torch.manual_seed(MM_SEED)
    model = transformers.Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32)
    gen = torch.Generator().manual_seed(MM_SEED)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in pname and mm_text_name(pname) is not None:
                v = 0.3 * r  # Gemma's (1 + w) norms
            elif "embed_tokens" in pname:
                v = 0.35 * r  # tied
            else:
                v = 0.3 * r
            p.copy_(v)
    ids = tokens_make(cfg.text_config.vocab_size, gen)
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    logits, loss = out.logits.detach(), out.loss.detach()
    lm = loss_manual(logits, ids).item()
    if abs(lm - loss.item()) > 1e-5 * abs(lm):
        sys.exit(f"[make_hf_fixtures] {MM_NAME}: HF loss {loss.item()} != shifted mean CE {lm}")
    grads, n_carried = {}, 0
    for pname, p in model.named_parameters():
        tn = mm_text_name(pname)
        if tn is None:
            n_carried += 1
            if p.grad is not None and p.grad.abs().max().item() != 0.0:
                sys.exit(f"[make_hf_fixtures] {MM_NAME}: vision parameter {pname} got a gradient from ids alone")
            continue
        if p.grad is None:
            sys.exit(f"[make_hf_fixtures] {MM_NAME}: parameter {pname} got no gradient")
        grads["grad." + tn] = p.grad.detach()

    # the same weights as the text model: the same loss and logits
    text = transformers.Gemma3ForCausalLM._from_config(cfg.text_config, attn_implementation="eager")
    text = text.to(torch.float32)
    sd = {mm_text_name(k): v for k, v in model.state_dict().items() if mm_text_name(k) is not None}
    text.load_state_dict(sd, strict=False)
    text.eval()
    with torch.no_grad():
        tout = text(input_ids=ids, labels=ids)
    if not torch.equal(tout.logits, logits):
        sys.exit(f"[make_hf_fixtures] {MM_NAME}: Gemma3ForCausalLM with the same weights gives other logits "
                 f"(max diff {(tout.logits - logits).abs().max().item()})")

    d = os.path.join(out_dir, "hf", MM_NAME)
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(tmp, f), os.path.join(d, f))
    with open(os.path.join(d, "tokens.txt"), "w", encoding="utf-8") as f:
        for row in ids.tolist():
            f.write(" ".join(str(t) for t in row) + "\n")
    safetensors_write(os.path.join(d, "reference.safetensors"), {"logits": logits, **grads})
    json_write(os.path.join(d, "reference.json"), {
        "loss": float(loss.item()),
        "n_predicted": BATCH * (SEQ_LEN - 1),
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "vocab": cfg.text_config.vocab_size,
        "family": cfg.model_type,
        "carried_parameters": n_carried,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": MM_SEED,
    })
    lnv = math.log(cfg.text_config.vocab_size)
    print(f"{MM_NAME}: loss={loss.item()!r} ln(vocab)={lnv:.6f} carried parameters={n_carried}")
    if abs(loss.item() - lnv) <= 0.5:
        sys.exit(f"[make_hf_fixtures] {MM_NAME}: loss within 0.5 of ln(vocab); raise init scales")
    print(f"  files: {file_sizes(d)}")


# ---------------------------------------------------------------- 4.x config dialect variants

def config_variants(saved_cfg):
    """Hand-written transformers 4.x spellings of the llama fixture's config."""
    rp = saved_cfg["rope_parameters"]
    base = {k: v for k, v in saved_cfg.items()
            if k not in ("rope_parameters", "dtype", "torch_dtype", "transformers_version")}
    base["transformers_version"] = "4.46.0"
    base["torch_dtype"] = "float32"
    scaling = {k: rp[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings")}
    v_rope_type = dict(base, rope_theta=rp["rope_theta"], rope_scaling=dict(scaling, rope_type="llama3"))
    v_type_key = dict(base, rope_theta=rp["rope_theta"], rope_scaling=dict(scaling, type="llama3"))
    v_default = dict(base, rope_theta=rp["rope_theta"], rope_scaling=None)
    return {"llama3_rope_type": v_rope_type, "llama3_type_key": v_type_key, "rope_default": v_default}


def configs_write(out_dir, saved_cfg, fixture_inv_freq):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    root = os.path.join(out_dir, "hf", "configs")
    expected = {}
    for vname, vcfg in config_variants(saved_cfg).items():
        d = os.path.join(root, vname)
        os.makedirs(d, exist_ok=True)
        json_write(os.path.join(d, "config.json"), vcfg)
        # How transformers itself reads this spelling.
        loaded = transformers.AutoConfig.from_pretrained(d)
        rp = dict(loaded.rope_parameters)
        inv = LlamaRotaryEmbedding(config=loaded).inv_freq.detach().float()
        entry = {"rope_type": rp["rope_type"], "rope_theta": float(rp["rope_theta"]),
                 "inv_freq": [float(x) for x in inv.tolist()]}
        if rp["rope_type"] == "llama3":
            for k in ("factor", "low_freq_factor", "high_freq_factor"):
                entry[k] = float(rp[k])
            entry["original_max_position_embeddings"] = int(rp["original_max_position_embeddings"])
            if not torch.equal(inv, fixture_inv_freq.float()):
                sys.exit(f"[make_hf_fixtures] config variant {vname}: inv_freq differs from the fixture's")
        elif rp["rope_type"] != "default":
            sys.exit(f"[make_hf_fixtures] config variant {vname}: unexpected rope_type {rp['rope_type']}")
        expected[vname] = entry
        print(f"configs/{vname}: transformers reads rope_parameters={rp}")
    json_write(os.path.join(root, "expected.json"), expected)


# ---------------------------------------------------------------- AdamW fixture

ADAMW_LR = [0.004, 0.008, 0.01, 0.006, 0.002]   # warmup then decay
ADAMW_GRAD_NORM_TARGET = [2.5, 0.6, 1.7, 0.9, 0.35]  # >1 clips (steps 1, 3), <1 does not


def adamw_write(out_dir, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(0.5 * torch.randn(8, 16, generator=gen))
    n = torch.nn.Parameter(1.0 + 0.2 * torch.randn(16, generator=gen))
    beta1, beta2, eps, max_norm = 0.9, 0.95, 1e-8, 1.0
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.1},
                             {"params": [n], "weight_decay": 0.0}],
                            lr=ADAMW_LR[0], betas=(beta1, beta2), eps=eps,
                            foreach=False, fused=False)
    tensors = {"w.init": w.detach().clone(), "n.init": n.detach().clone()}
    grad_norms, clip_coefs = [], []
    for k in range(1, len(ADAMW_LR) + 1):
        gw = torch.randn(8, 16, generator=gen)
        gn = torch.randn(16, generator=gen)
        s = ADAMW_GRAD_NORM_TARGET[k - 1] / torch.sqrt((gw * gw).sum() + (gn * gn).sum())
        gw, gn = gw * s, gn * s
        tensors[f"w.grad.{k}"] = gw.clone()
        tensors[f"n.grad.{k}"] = gn.clone()
        w.grad = gw.clone()
        n.grad = gn.clone()
        total = torch.nn.utils.clip_grad_norm_([w, n], max_norm, foreach=False)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        # The coefficient torch applied, recovered from the clipped gradient as a check.
        if not torch.equal(w.grad, gw * coef):
            sys.exit(f"[make_hf_fixtures] adamw step {k}: clip coefficient mismatch")
        grad_norms.append(float(total.item()))
        clip_coefs.append(float(coef.item()))
        for g, lr in zip(opt.param_groups, (ADAMW_LR[k - 1],) * 2):
            g["lr"] = lr
        opt.step()
        tensors[f"w.step.{k}"] = w.detach().clone()
        tensors[f"n.step.{k}"] = n.detach().clone()
        for pn, p in (("w", w), ("n", n)):
            st = opt.state[p]
            tensors[f"{pn}.exp_avg.{k}"] = st["exp_avg"].clone()
            tensors[f"{pn}.exp_avg_sq.{k}"] = st["exp_avg_sq"].clone()
    clipped = [c < 1.0 for c in clip_coefs]
    if not (any(clipped) and not all(clipped)):
        sys.exit("[make_hf_fixtures] adamw: need both clipped and unclipped steps")
    d = os.path.join(out_dir, "adamw")
    os.makedirs(d, exist_ok=True)
    safetensors_write(os.path.join(d, "adamw.safetensors"), tensors)
    json_write(os.path.join(d, "adamw.json"), {
        "lr": ADAMW_LR, "beta1": beta1, "beta2": beta2, "eps": eps,
        "weight_decay": {"w": 0.1, "n": 0.0}, "max_grad_norm": max_norm,
        "grad_norm": grad_norms, "clip_coef": clip_coefs, "steps": len(ADAMW_LR),
        "seed": seed, "torch_version": torch.__version__,
    })
    print(f"adamw: grad_norm={grad_norms} clip_coef={clip_coefs}")
    print(f"  files: {file_sizes(d)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="fixture root (default tests/fixtures)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="write only these model fixtures (repeatable; seeds as in a full run), "
                         "not the config variants or the AdamW fixture")
    args = ap.parse_args()
    unknown = sorted(set(args.only) - set(model_configs()) - {MM_NAME})
    if unknown:
        sys.exit(f"[make_hf_fixtures] --only {', '.join(unknown)}: no such fixture; "
                 f"choose from {', '.join(list(model_configs()) + [MM_NAME])}")
    setup_determinism()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    llama_cfg, llama_inv = None, None
    for i, (name, (cls_name, kw)) in enumerate(model_configs().items()):
        if args.only and name not in args.only:
            continue
        saved_cfg, inv = hf_fixture_write(args.out, name, cls_name, kw, FIXTURE_SEEDS.get(name, SEED + i))
        if name == "llama_gqa_rope3":
            llama_cfg, llama_inv = saved_cfg, inv
    if not args.only or MM_NAME in args.only:
        mm_fixture_write(args.out)
    if args.only:
        return
    configs_write(args.out, llama_cfg, llama_inv)
    adamw_write(args.out, SEED + 100)


if __name__ == "__main__":
    main()
