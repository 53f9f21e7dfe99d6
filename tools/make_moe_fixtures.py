#!/usr/bin/env python3
"""Generate the transformers reference fixtures for ramtrain's mixture-of-experts tests.

Run (from the repository root, CPU only, no network):
    python3 tools/make_moe_fixtures.py --out tests/fixtures
Needs torch + transformers (4.x or 5.x) + safetensors; reuses tools/make_hf_fixtures.py
(determinism, writers, parameter re-init, tokens). Deterministic like it.

What it writes, for family in qwen3_moe, qwen2_moe, mixtral, olmoe (tiny configs, 2 layers):

<out>/moe/<family>/
  config.json        what save_pretrained wrote (output_router_logits true, so the
                     load-balancing loss is part of the training loss).
  model.safetensors  fp32 weights under the hub checkpoints' per-expert names
                     (Qwen3-MoE/Qwen2-MoE/OLMoE: model.layers.{i}.mlp.gate.weight,
                     mlp.experts.{e}.{gate,up,down}_proj.weight; Qwen2-MoE also
                     mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight; Mixtral:
                     block_sparse_moe.gate.weight, block_sparse_moe.experts.{e}.w1/w3/w2),
                     written here (transformers 5.x keeps experts fused in memory);
                     checked by loading the directory back with from_pretrained and
                     requiring identical logits.
  tokens.txt         B lines of T token ids.
  reference.safetensors
                     "logits" [B, T, V]; "grad.<hub name>" for every tensor of
                     model.safetensors: the gradient of `loss` below.
  reference.json     {"loss": ce_loss + router_aux_loss_coef * aux_loss (fp32, the
                      training loss transformers reports with labels and
                      output_router_logits), "ce_loss", "aux_loss",
                      "router_aux_loss_coef", "hf_aux_loss": transformers' own
                      out.aux_loss for the same forward (null if it gave none),
                      "hf_aux_agrees": |hf_aux_loss - aux_loss| <= 1e-6 |aux_loss|,
                      "tokens_per_expert": [layer][expert] tokens routed,
                      "min_topk_gap": the smallest gap between a token's k-th and
                      (k+1)-th router probability (near-ties would make the routing
                      fragile; required > 1e-4), "n_predicted", "batch", "seq_len",
                      "vocab", "family", "seed", versions}

aux_loss is computed here from each router's raw logits (the gate's input captured by
a forward hook, times the gate weight), as load_balancing_loss_func does with
attention_mask None: over all R = layers x tokens rows, f_e = (rows whose top-k holds
e) / R, P_e = mean router probability, aux = E * sum_e f_e P_e. The gradient flows
through that recomputation (the same function of the same tensors as the gate). It is
compared with transformers' aux_loss: 5.x releases with huggingface/transformers issue
45120 (routers returning softmax output as router_logits, softmaxed again by the loss)
disagree, and the fixture then still holds the intended (4.x) loss; the script says so.
"""

import argparse
import json
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_fixtures as hf  # noqa: E402  (sets the offline env, imports torch/transformers)

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

AUX_COEF = 0.05  # above the families' defaults so the aux gradient is well above fp32 noise


def model_configs():
    common = dict(num_hidden_layers=2, max_position_embeddings=64, hidden_act="silu", use_cache=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                  output_router_logits=True, router_aux_loss_coef=AUX_COEF)
    return {
        # head_dim 12 != hidden/heads; top-2 of 6 renormalised
        "qwen3_moe": ("Qwen3MoeConfig", dict(
            common, vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=24,
            num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-6,
            num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], use_sliding_window=False, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # q/k/v biases, a gated shared expert, top-2 of 5 without renormalisation
        "qwen2_moe": ("Qwen2MoeConfig", dict(
            common, vocab_size=88, hidden_size=32, intermediate_size=64, moe_intermediate_size=20,
            shared_expert_intermediate_size=28, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            num_experts=5, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            use_sliding_window=False, qkv_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # top-2 of 4, always renormalised
        "mixtral": ("MixtralConfig", dict(
            common, vocab_size=80, hidden_size=32, intermediate_size=24, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2,
            router_jitter_noise=0.0, sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # top-3 of 8 without renormalisation; q/k norms over the whole projection, GQA
        "olmoe": ("OlmoeConfig", dict(
            common, vocab_size=112, hidden_size=32, intermediate_size=20, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, num_experts=8, num_experts_per_tok=3,
            norm_topk_prob=False, clip_qkv=None, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    }


def moe_dims(cfg):
    e = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")
    f = cfg.moe_intermediate_size if cfg.model_type in ("qwen3_moe", "qwen2_moe") else cfg.intermediate_size
    return e, cfg.num_experts_per_tok, f, cfg.hidden_size


def hub_tensors(family, name, t, E, F, C):
    """(hub name, tensor) pairs for one parameter/gradient of the in-memory model (4.x per-expert
    modules or 5.x fused experts)."""
    m = re.match(r"(model\.layers\.\d+)\.(mlp|block_sparse_moe)\.(.*)$", name)
    if not m:
        return [(name, t)]
    layer, rest = m.group(1), m.group(3)
    pre = layer + (".block_sparse_moe." if family == "mixtral" else ".mlp.")
    hub = ({"gate": "w1", "up": "w3", "down": "w2"} if family == "mixtral"
           else {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    if rest == "gate.weight":
        return [(pre + "gate.weight", t)]
    if rest.startswith("shared_expert.") or rest == "shared_expert_gate.weight":  # Qwen2-MoE, unchanged
        return [(pre + rest, t)]
    if rest == "experts.gate_up_proj":
        if tuple(t.shape) == (E, 2 * F, C):
            g, u = t[:, :F, :], t[:, F:, :]
        elif tuple(t.shape) == (E, C, 2 * F):
            g, u = t[:, :, :F].transpose(1, 2), t[:, :, F:].transpose(1, 2)
        else:
            sys.exit(f"[make_moe_fixtures] {name}: unexpected fused shape {tuple(t.shape)}")
        return ([(f"{pre}experts.{e}.{hub['gate']}.weight", g[e]) for e in range(E)] +
                [(f"{pre}experts.{e}.{hub['up']}.weight", u[e]) for e in range(E)])
    if rest == "experts.down_proj":
        if tuple(t.shape) == (E, C, F):
            d = t
        elif tuple(t.shape) == (E, F, C):
            d = t.transpose(1, 2)
        else:
            sys.exit(f"[make_moe_fixtures] {name}: unexpected fused shape {tuple(t.shape)}")
        return [(f"{pre}experts.{e}.{hub['down']}.weight", d[e]) for e in range(E)]
    m2 = re.match(r"experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$", rest)
    if m2:
        kind = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}[m2.group(2)]
        return [(f"{pre}experts.{m2.group(1)}.{hub[kind]}.weight", t)]
    sys.exit(f"[make_moe_fixtures] unexpected MoE tensor {name} {tuple(t.shape)}")


def to_hub(family, named, dims):
    E, _, F, C = dims
    out = {}
    for name, t in named:
        for hn, ht in hub_tensors(family, name, t, E, F, C):
            if hn in out:
                sys.exit(f"[make_moe_fixtures] {hn} produced twice")
            out[hn] = ht.detach().contiguous().clone()
    return out


def router_gates(model, E, C):
    """The router modules in layer order: a '.gate' with a weight [E, C]."""
    gates = []
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if name.endswith(".gate") and isinstance(w, torch.Tensor) and tuple(w.shape) == (E, C):
            gates.append((int(re.search(r"layers\.(\d+)\.", name).group(1)), mod))
    gates.sort(key=lambda p: p[0])
    return [m for _, m in gates]


def load_balancing(logits, E, K):
    """Switch-Transformer load-balancing loss over rows of raw router logits [R, E]."""
    p = torch.softmax(logits, dim=-1)
    _, sel = torch.topk(p, K, dim=-1)
    mask = torch.nn.functional.one_hot(sel, E).float()  # [R, K, E]
    f = mask.mean(dim=0)                                 # [K, E]
    P = p.mean(dim=0)                                    # [E]
    return (f * P.unsqueeze(0)).sum() * E


def fixture_write(out_dir, family, cls_name, cfg_kwargs, seed):
    cfg = getattr(transformers, cls_name)(**cfg_kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    hf.params_reinit(model, gen)
    ids = hf.tokens_make(cfg.vocab_size, gen)
    dims = moe_dims(model.config)
    E, K, F, C = dims
    gates = router_gates(model, E, C)
    if len(gates) != cfg.num_hidden_layers:
        sys.exit(f"[make_moe_fixtures] {family}: found {len(gates)} routers, want {cfg.num_hidden_layers}")
    captured = []
    def capture(mod, args, kwargs, output):  # the router's input, however it is passed
        captured.append((mod, args[0] if args else kwargs["hidden_states"]))

    hooks = [g.register_forward_hook(capture, with_kwargs=True) for g in gates]

    model.train()  # dropout 0; no router jitter
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids)
    for h in hooks:
        h.remove()
    if len(captured) != len(gates):
        sys.exit(f"[make_moe_fixtures] {family}: {len(captured)} router calls, want {len(gates)}")
    logits = out.logits
    V = cfg.vocab_size
    ce = torch.nn.functional.cross_entropy(logits[:, :-1, :].reshape(-1, V).float(), ids[:, 1:].reshape(-1))
    router_logits = [torch.nn.functional.linear(x.reshape(-1, C), mod.weight) for mod, x in captured]
    aux = load_balancing(torch.cat(router_logits, dim=0), E, K)
    loss = ce + AUX_COEF * aux
    loss.backward()
    if abs(ce.item() - math.log(V)) <= 0.5:
        sys.exit(f"[make_moe_fixtures] {family}: loss within 0.5 of ln(vocab); raise init scales")

    hf_aux = getattr(out, "aux_loss", None)
    hf_aux = None if hf_aux is None else float(hf_aux.detach().item())
    agrees = hf_aux is not None and abs(hf_aux - aux.item()) <= 1e-6 * abs(aux.item())
    if not agrees:
        twice = load_balancing(torch.softmax(torch.cat(router_logits, 0).detach(), -1), E, K).item()
        print(f"  NOTE {family}: transformers' aux_loss {hf_aux!r} differs from load_balancing_loss_func on the "
              f"raw router logits {aux.item()!r} (on softmaxed logits: {twice!r}; see huggingface/transformers "
              f"issue 45120). The fixture holds the latter.")

    tokens, gap = [], 1.0
    with torch.no_grad():
        for rl in router_logits:
            p = torch.softmax(rl, dim=-1)
            top = torch.topk(p, min(K + 1, E), dim=-1).values
            if K < E:
                gap = min(gap, float((top[:, K - 1] - top[:, K]).min().item()))
            sel = torch.topk(p, K, dim=-1).indices
            tokens.append(torch.bincount(sel.reshape(-1), minlength=E).tolist())
    if gap <= 1e-4:
        sys.exit(f"[make_moe_fixtures] {family}: a top-k near-tie (gap {gap}); change the seed")

    weights = to_hub(family, model.named_parameters(), dims)
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            sys.exit(f"[make_moe_fixtures] {family}: parameter {name} got no gradient")
    for hn, g in to_hub(family, [(n, p.grad) for n, p in model.named_parameters()], dims).items():
        grads["grad." + hn] = g

    d = os.path.join(out_dir, "moe", family)
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "config.json"), encoding="utf-8") as f:
            config_text = f.read()
        # the hub layout, loaded back by transformers itself: identical logits or no fixture
        for fn in os.listdir(tmp):
            if fn.endswith(".safetensors") or (fn.endswith(".json") and fn != "config.json"):
                os.remove(os.path.join(tmp, fn))
        save_file(weights, os.path.join(tmp, "model.safetensors"), metadata=dict(hf.ST_METADATA))
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="eager")
        back = back.to(torch.float32)
        back.train()
        with torch.no_grad():
            relogits = back(input_ids=ids).logits
        # identical, unless the loader picks another experts kernel (summation order only);
        # a wrong name or split moves the logits by O(1)
        diff = (relogits - logits.detach()).abs().max().item()
        if diff > 1e-5 * logits.detach().abs().max().item():
            sys.exit(f"[make_moe_fixtures] {family}: the hub-format weights load back to different logits "
                     f"(max diff {diff}); hub_tensors is wrong")
        if diff:
            print(f"  note {family}: reloaded logits differ by {diff:.3g} (rounding)")
    saved_cfg = json.loads(config_text)
    if saved_cfg.get("output_router_logits") is not True or saved_cfg.get("router_aux_loss_coef") != AUX_COEF:
        # ramtrain adds the load-balancing loss only when the file says so, as transformers does
        print(f"  note {family}: save_pretrained wrote output_router_logits={saved_cfg.get('output_router_logits')!r}"
              f", router_aux_loss_coef={saved_cfg.get('router_aux_loss_coef')!r}; setting true and {AUX_COEF}")
        saved_cfg["output_router_logits"] = True
        saved_cfg["router_aux_loss_coef"] = AUX_COEF
        hf.json_write(os.path.join(d, "config.json"), saved_cfg)
    else:
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            f.write(config_text)
    hf.safetensors_write(os.path.join(d, "model.safetensors"), weights)
    with open(os.path.join(d, "tokens.txt"), "w", encoding="utf-8") as f:
        for row in ids.tolist():
            f.write(" ".join(str(t) for t in row) + "\n")
    hf.safetensors_write(os.path.join(d, "reference.safetensors"), {"logits": logits.detach(), **grads})
    hf.json_write(os.path.join(d, "reference.json"), {
        "loss": float(loss.item()), "ce_loss": float(ce.item()), "aux_loss": float(aux.item()),
        "router_aux_loss_coef": AUX_COEF, "hf_aux_loss": hf_aux, "hf_aux_agrees": agrees,
        "tokens_per_expert": tokens, "min_topk_gap": gap,
        "n_predicted": hf.BATCH * (hf.SEQ_LEN - 1), "batch": hf.BATCH, "seq_len": hf.SEQ_LEN, "vocab": V,
        "family": family, "seed": seed, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    })
    print(f"{family}: loss={loss.item()!r} ce={ce.item()!r} aux={aux.item()!r} hf_aux={hf_aux!r} "
          f"tokens_per_expert={tokens} min_topk_gap={gap:.3g} tensors={len(weights)}")
    print(f"  files: {hf.file_sizes(d)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="fixture root (default tests/fixtures)")
    args = ap.parse_args()
    hf.setup_determinism()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for i, (family, (cls_name, kw)) in enumerate(model_configs().items()):
        fixture_write(args.out, family, cls_name, kw, hf.SEED + 200 + i)


if __name__ == "__main__":
    main()
