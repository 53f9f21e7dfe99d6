#!/usr/bin/env bash
# Issue 20's size point on the 128 GiB host: full-depth Qwen2.5-14B with
# 8-bit Adam moments and the exact (split fp32) master, and Qwen2.5-32B in the
# leanest mode (4-bit moments, bf16 master with stochastic rounding), both
# with --grads fold (no host gradient buffer). Also the MoE sizes of issue 21
# (olmoe: OLMoE-1B-7B at full precision; 30b-a3b: Qwen3-30B-A3B in the leanest
# mode); 7b-muon and 7b-adamw: Qwen2.5-7B with Muon (Newton-Schulz on the
# GPU) and with AdamW, the same tokens per step; 7b-muon4bit, 7b-muon4bit-sr:
# muon4bit with the split and the bf16-sr master. CKPT=1 saves a checkpoint at
# the last step and prints its size on disk next to the estimate (`plan`'s
# checkpoint_bytes, what the free-space warning uses); a 30b-a3b checkpoint is
# ~86 GiB: it needs a disk that holds it. Random init; the fixture
# BPE tokenizer (803 ids) on tinyshakespeare (the data only has to be real
# tokens). Each line of the log gets a wall-clock stamp so init, steps and
# exit show.
# No final export (--export-dtype none): a 32B bf16 export is 65 GB, the lent
# disk 64 GiB.
#   bench/lean_size.sh [path/to/ramtrain] [DATA] [STEPS] [which: 14b 32b olmoe 30b-a3b 7b-muon 7b-muon4bit
#                      7b-muon4bit-sr 7b-adamw; default 14b 32b]
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
    7b-muon4bit) opts=(--preset qwen2.5-7b --optimizer muon4bit --grads fold) ;;
    7b-muon4bit-sr) opts=(--preset qwen2.5-7b --optimizer muon4bit --master bf16-sr --grads fold) ;;
    7b-adamw) opts=(--preset qwen2.5-7b --grads fold) ;;
    *) echo "unknown size $w"; exit 2 ;;
  esac
  echo "== $w: ${opts[*]}"
  ckpt=(); [ "${CKPT:-0}" = 1 ] && ckpt=(--save-every "$STEPS" --keep-checkpoints 1)
  t0=$EPOCHREALTIME
  /usr/bin/time -f "exit %x, wall %e s, max RSS %M KiB" stdbuf -oL "$R" train "${opts[@]}" "${common[@]}" "${ckpt[@]}" \
    --out "$OUT/run_$w" 2>&1 | stamp "$t0" | tee "$OUT/size_$w.log" | grep -v "^ *[0-9.]*s  "
  if [ "${CKPT:-0}" = 1 ]; then
    est=$("$R" plan "${opts[@]}" --seq-len 2048 --micro-batch 16 --json |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["host"]["checkpoint_bytes"])')
    for d in "$OUT/run_$w"/ckpt-*; do
      disk=$(du -sb "$d" | cut -f1)
      python3 -c "import sys; d, e = int(sys.argv[1]), int(sys.argv[2]); print(f'checkpoint {sys.argv[3]}: {d} bytes on disk ({d / 2**30:.2f} GiB), estimate {e} ({e / 2**30:.2f} GiB), estimate / disk {e / d:.4f}')" "$disk" "$est" "$d"
    done
  fi
  rm -rf "$OUT/run_$w"
done
