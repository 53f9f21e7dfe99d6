#!/usr/bin/env python3
"""Check that a model directory exported by ramtrain loads and runs in transformers.

Usage:
    python3 tools/check_hf_export.py DIR [--tokens TOKENS.txt] [--expect-loss X --rtol R]
DIR holds config.json and *.safetensors (one file or HF-sharded with model.safetensors.index.json).
TOKENS.txt (default DIR/tokens.txt): one sequence per line, token ids separated by spaces, all
lines the same length. Loads DIR with AutoModelForCausalLM (fp32, eager attention, CPU, no
network), runs labels=input_ids (HF shifts: mean over B*(T-1) positions, no padding) and
prints one JSON line {"loss": <fp32 loss as Python float repr>, "n_params": <unique params>}.
With --expect-loss X it exits 1 when |loss - X| > rtol * |X| (rtol default 0, i.e. exact).
A Gemma3ForConditionalGeneration export (the multimodal Gemma 3; ramtrain trains its language
model) loads through the same call (transformers maps it to that class) and runs on input_ids
alone; --carried-from SRC (the model directory the run started from) then also checks that every
tensor of SRC outside the language model (vision tower, projector) is in DIR with the same name,
dtype and values, and that DIR holds SRC's tensor names exactly; the JSON line adds
"carried": <that count>; exit 1 when one differs.
Exit 2 on unusable input. Needs torch + transformers 5.x + safetensors.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402


def tokens_read(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append([int(t) for t in line.split()])
    if not rows:
        sys.exit(f"[check_hf_export] {path}: no token lines; write one sequence of ids per line")
    if len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        sys.exit(f"[check_hf_export] {path}: all lines need the same length >= 2 (no padding support)")
    return torch.tensor(rows, dtype=torch.int64)


def safetensors_all(d):
    """{name: tensor} of a model directory (one file or sharded)."""
    from safetensors.torch import load_file
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(d, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        print(f"[check_hf_export] {d}: no model.safetensors or model.safetensors.index.json", file=sys.stderr)
        sys.exit(2)
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def carried_check(exported, source):
    """Every tensor of source outside the language model is in exported, bit for bit; the names agree."""
    def language(n):
        return n.startswith(("language_model.", "model.language_model.")) or n == "lm_head.weight"
    e, s = safetensors_all(exported), safetensors_all(source)
    if set(e) != set(s):
        print(f"[check_hf_export] {exported} and {source} hold other tensor names: only in the export "
              f"{sorted(set(e) - set(s))[:5]}, only in the source {sorted(set(s) - set(e))[:5]}", file=sys.stderr)
        sys.exit(1)
    n = 0
    for k, v in s.items():
        if language(k):
            continue
        n += 1
        if e[k].dtype != v.dtype or e[k].shape != v.shape or not torch.equal(e[k], v):
            print(f"[check_hf_export] carried tensor {k} differs from {source}'s", file=sys.stderr)
            sys.exit(1)
    if n == 0:
        print(f"[check_hf_export] {source} holds no tensor outside the language model", file=sys.stderr)
        sys.exit(1)
    return n


def main():
    ap = argparse.ArgumentParser(description="Load a ramtrain HF export in transformers and print its loss.")
    ap.add_argument("dir", help="exported model directory (config.json + *.safetensors)")
    ap.add_argument("--tokens", help="token file (default DIR/tokens.txt)")
    ap.add_argument("--expect-loss", type=float, help="reference loss; exit 1 when off by more than rtol")
    ap.add_argument("--rtol", type=float, default=0.0, help="relative tolerance for --expect-loss (default 0)")
    ap.add_argument("--carried-from", metavar="SRC",
                    help="multimodal export: check the tensors carried from the source model directory SRC")
    args = ap.parse_args()

    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    if not os.path.isfile(os.path.join(args.dir, "config.json")):
        print(f"[check_hf_export] {args.dir}: no config.json; pass the export directory", file=sys.stderr)
        sys.exit(2)
    tokens_path = args.tokens or os.path.join(args.dir, "tokens.txt")
    if not os.path.isfile(tokens_path):
        print(f"[check_hf_export] {tokens_path}: missing; pass --tokens", file=sys.stderr)
        sys.exit(2)
    ids = tokens_read(tokens_path)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True)
    model.eval()
    vocab = model.config.get_text_config().vocab_size  # Gemma3ForConditionalGeneration: text_config's
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        print(f"[check_hf_export] {tokens_path}: ids outside [0, {vocab})", file=sys.stderr)
        sys.exit(2)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    n_params = sum(p.numel() for p in model.parameters())
    value = float(loss.item())
    result = {"loss": value, "n_params": n_params}
    if args.carried_from:
        result["carried"] = carried_check(args.dir, args.carried_from)
    print(json.dumps(result, sort_keys=True))

    if args.expect_loss is not None:
        err = abs(value - args.expect_loss)
        if not err <= args.rtol * abs(args.expect_loss):  # also fails on NaN
            print(f"[check_hf_export] loss {value!r} differs from expected {args.expect_loss!r} by "
                  f"{err:.3e} > rtol {args.rtol} * |expected|", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
