#!/usr/bin/env python3
"""HF tokenizers reference for `ramtrain tokenize` (same input, same documents).

Usage: python3 bench/tokenize_bench.py MODEL_DIR TEXT_FILE [blank-lines|file] [RAMTRAIN_OUT.tok]

Splits TEXT_FILE into documents as `ramtrain tokenize --text-split` does
(blank-lines: maximal runs of non-blank lines, joined without their last line
break; file: the whole file), encodes them with tokenizers' encode_batch
(add_special_tokens=True, + EOS after each document, as ramtrain writes them),
and prints MB/s. The thread count is tokenizers' own (RAYON_NUM_THREADS, default
all cores). With RAMTRAIN_OUT.tok it also checks that ramtrain wrote the same ids.
"""
import json
import os
import sys
import time


def documents(text, split):
    if split == "file":
        return [text]
    docs, cur = [], []
    for line in text.split("\n"):
        if line.strip(" \t\r") == "":
            if cur:
                docs.append("\n".join(cur))
                cur = []
        else:
            cur.append(line)
    if cur:
        docs.append("\n".join(cur))
    return docs


def main():
    from tokenizers import Tokenizer
    model_dir, path = sys.argv[1], sys.argv[2]
    split = sys.argv[3] if len(sys.argv) > 3 else "blank-lines"
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    eos = None
    cfg = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg):
        name = json.load(open(cfg)).get("eos_token")
        if isinstance(name, dict):
            name = name.get("content")
        eos = tok.token_to_id(name) if name else None
    raw = open(path, "rb").read()
    mb = len(raw) / 1e6
    t0 = time.perf_counter()
    docs = documents(raw.decode("utf-8"), split)
    encs = tok.encode_batch(docs, add_special_tokens=True)
    ids = []
    for e in encs:
        ids.extend(e.ids)
        if eos is not None:
            ids.append(eos)
    s = time.perf_counter() - t0
    threads = os.environ.get("RAYON_NUM_THREADS", f"all {os.cpu_count()}")
    print(f"HF tokenizers encode_batch: {len(docs)} documents, {mb:.1f} MB -> {len(ids)} tokens in {s:.2f} s: "
          f"{mb / s:.2f} MB/s (threads: {threads})")
    if len(sys.argv) > 4:
        import numpy as np
        d = open(sys.argv[4], "rb").read()
        width = int.from_bytes(d[12:16], "little")
        ours = np.frombuffer(d[32:], dtype=np.uint16 if width == 2 else np.uint32)
        same = len(ours) == len(ids) and bool((ours == np.asarray(ids, dtype=ours.dtype)).all())
        print(f"ramtrain output {sys.argv[4]}: {len(ours)} tokens, identical to HF: {same}")


if __name__ == "__main__":
    main()
