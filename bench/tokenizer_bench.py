#!/usr/bin/env python3
"""HF reference numbers for bench/tokenizer_bench.cpp (same text, same checksum).

Usage: RAYON_NUM_THREADS=1 python3 bench/tokenizer_bench.py MODEL_DIR TEXT_FILE [REPS]
       python3 bench/tokenizer_bench.py --train-llama3 OUT_DIR TEXT_FILE VOCAB
The second form trains a larger Llama-3-layout tokenizer (for a benchmark with a
realistic vocabulary size; not a fixture). Reports, single thread when
RAYON_NUM_THREADS=1: encode of the whole text in one call, encode_batch of all
lines, and a Python loop of encode per line.
"""
import os
import sys
import time


def fnv1a(ids, h=1469598103934665603):
    for i in ids:
        h ^= i
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def bench(model_dir, path, reps):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    text = open(path, encoding="utf-8").read()
    lines = text.splitlines(keepends=True)
    mb = len(text.encode("utf-8")) / 1e6
    print(f"tokenizers, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}, {mb:.3f} MB, {len(lines)} lines")

    def timed(f):
        first, best, out = None, 1e30, None
        for r in range(reps):
            t0 = time.perf_counter()
            out = f()
            s = time.perf_counter() - t0
            first = s if first is None else first
            best = min(best, s)
        return out, first, best

    ids, first, best = timed(lambda: tok.encode(text, add_special_tokens=False).ids)
    print(f"encode whole text : {len(ids)} tokens, checksum {fnv1a(ids):016x}, first {mb/first:.2f} MB/s, best {mb/best:.2f} MB/s")
    encs, first, best = timed(lambda: tok.encode_batch(lines, add_special_tokens=False))
    h, n = 1469598103934665603, 0
    for e in encs:
        h = fnv1a(e.ids, h)
        n += len(e.ids)
    print(f"encode_batch lines: {n} tokens, checksum {h:016x}, first {mb/first:.2f} MB/s, best {mb/best:.2f} MB/s")
    _, first, best = timed(lambda: [tok.encode(l, add_special_tokens=False).ids for l in lines])
    print(f"encode per line   : first {mb/first:.2f} MB/s, best {mb/best:.2f} MB/s")
    _, first, best = timed(lambda: tok.decode(ids))
    print(f"decode            : best {mb/best:.2f} MB/s")


def train_llama3(out_dir, path, vocab):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import json
    import make_tokenizer_fixtures as mk
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(mk.LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([path], trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    print(f"trained vocab {tok.get_vocab_size()} into {out_dir}")


if __name__ == "__main__":
    if sys.argv[1] == "--train-llama3":
        train_llama3(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        bench(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)
