#!/usr/bin/env bash
# Issue 20's size point on the 128 GiB host: full-depth Qwen2.5-14B with
# 8-bit Adam moments and the exact (split fp32) master, and Qwen2.5-32B in the
# leanest mode (4-bit moments, bf16 master with stochastic rounding), both
# with --grads fold (no host gradient buffer). Also the MoE sizes of issue 21
# (olmoe: OLMoE-1B-7B at full precision; 30b-a3b: Qwen3-30B-A3B in the leanest
# mode); 7b-muon and 7b-adamw: Qwen2.5-7B with Muon (Newton-Schulz on the
# GPU) and with AdamW, the same tokens per step. Random init; the fixture
# BPE tokenizer (803 ids) on tinyshakespeare (the data only has to be real
# tokens). Each line of the log gets a wall-clock stamp so init, steps and
# exit show.
# No final export (--export-dtype none): a 32B bf16 export is 65 GB, the lent
# disk 64 GiB.
#   bench/lean_size.sh [path/to/ramtrain] [DATA] [STEPS] [which: 14b 32b olmoe 30b-a3b 7b-muon 7b-adamw; default 14b 32b]
set -uo pipefail
R=${1:-build/cpu/ramtrain}
DATA=${2:-../shared/data/tinyshakespeare.txt}
STEPS=${3:-3}
which=${4:-14b 32b}
OUT=${OUT:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
common=(--tokenizer "$here/tests/fixtures/tokenizers/qwen2" --data "$DATA" --text-split file --truncate split
        --seq-len 2048 --micro-batch 16 --val-fraction 0 --export-dtype none --lr 1e-5 --warmup 1
        --steps "$STEPS")
stamp() { local t0=$1; while IFS= read -r l; do awk -v a="$t0" -v b="$EPOCHREALTIME" -v l="$l" 'BEGIN { printf "%6.1fs %s\n", b - a, l }'; done; }
for w in $which; do
  case $w in
    14b) opts=(--preset qwen2.5-14b --optimizer adamw8bit --grads fold) ;;
    32b) opts=(--preset qwen2.5-32b --optimizer adamw4bit --master bf16-sr --grads fold) ;;
    olmoe) opts=(--preset olmoe-1b-7b) ;;  # issue 21: fp32 master (split) + fp32 Adam
    30b-a3b) opts=(--preset qwen3-30b-a3b --optimizer adamw4bit --master bf16-sr --grads fold) ;;
    7b-muon) opts=(--preset qwen2.5-7b --optimizer muon --grads fold) ;;  # Muon's NS5 on the GPU: step time vs 7b-adamw
    7b-adamw) opts=(--preset qwen2.5-7b --grads fold) ;;
    *) echo "unknown size $w"; exit 2 ;;
  esac
  echo "== $w: ${opts[*]}"
  t0=$EPOCHREALTIME
  /usr/bin/time -f "exit %x, wall %e s, max RSS %M KiB" stdbuf -oL "$R" train "${opts[@]}" "${common[@]}" --out "$OUT/run_$w" 2>&1 |
    stamp "$t0" | tee "$OUT/size_$w.log" | grep -v "^ *[0-9.]*s  "
  rm -rf "$OUT/run_$w"
done
