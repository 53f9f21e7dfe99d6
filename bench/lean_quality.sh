#!/usr/bin/env bash
# Issue 20's quality point on the GPU: every lean training-state mode against
# fp32 AdamW, the same model, seed, data order and learning rate, 1000 steps.
# Model: bench/lean_quality/config.json (a 76M-parameter Qwen2 shape, vocab 808)
# with the fixture BPE tokenizer (tests/fixtures/tokenizers/qwen2, 803 ids) on
# tinyshakespeare (464k tokens; 1000 x 4 x 256 tokens = 2.4 epochs). The modes
# run side by side on the one GPU, the host's cores split between them
# (--threads), so the comparison costs one run's time. A bench, not a test:
# it prints a table (final training loss = mean of the last 50 steps, final
# validation loss, each against fp32 AdamW's) and leaves each mode's
# metrics.jsonl in OUT (bench/plot_curves.py draws them). LQ_MUON=1 adds
# the Muon modes, with Muon and fp32 AdamW also at half and twice the learning rate (later
# flags win), so that each is compared at its best of three. LQ_ONLY="names"
# runs only those modes (e.g. after a change to one code). LQ_FP8=1 adds
# --matmul fp8 (the projections in FP8 with block scales, row "fp8") and
# --matmul fp8 --fp8-scaling tensor (one scale per tensor, row "fp8_tensor");
# the "adamw" row is their bf16 twin.
#   bench/lean_quality.sh [path/to/ramtrain] [DATA] [STEPS]
set -uo pipefail
R=${1:-build/cpu/ramtrain}
DATA=${2:-../shared/data/tinyshakespeare.txt}
STEPS=${3:-1000}
WARMUP=$(( STEPS / 20 < 50 ? STEPS / 20 : 50 ))
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/.." && pwd)
common=(--model "$here/bench/lean_quality" --init random --tokenizer "$here/tests/fixtures/tokenizers/qwen2"
        --data "$DATA" --text-split file --truncate split --seq-len 256 --micro-batch 4 --steps "$STEPS"
        --lr 1e-3 --warmup "$WARMUP" --weight-decay 0.1 --seed 7 --eval-every 100 --eval-batches 16 --log-every 100
        --export-dtype none)
# name | options
modes=(
  "adamw|"
  "adamw8bit|--optimizer adamw8bit"
  "adamw4bit|--optimizer adamw4bit"
  "bf16-sr|--master bf16-sr"
  "bf16-kahan|--master bf16-kahan"
  "adamw8bit_bf16-sr|--optimizer adamw8bit --master bf16-sr"
  "adamw4bit_bf16-sr|--optimizer adamw4bit --master bf16-sr"
)
if [ "${LQ_MUON:-0}" = 1 ]; then
  modes+=("adamw_lr5e-4|--lr 5e-4" "adamw_lr2e-3|--lr 2e-3" "muon|--optimizer muon" "muon_lr5e-4|--optimizer muon --lr 5e-4" "muon_lr2e-3|--optimizer muon --lr 2e-3"
          "muon8bit|--optimizer muon8bit" "muon4bit|--optimizer muon4bit"
          "muon4bit_nearest|--optimizer muon4bit --moment-rounding nearest"
          "muon4bit_bf16-sr|--optimizer muon4bit --master bf16-sr")
fi
if [ "${LQ_FP8:-0}" = 1 ]; then  # issue 31's quality point: --matmul fp8 against bf16 (Hopper)
  modes+=("fp8|--matmul fp8" "fp8_tensor|--matmul fp8 --fp8-scaling tensor")
fi
if [ -n "${LQ_ONLY:-}" ]; then  # LQ_ONLY="adamw adamw8bit ...": only these modes (names as above)
  keep=()
  for row in "${modes[@]}"; do [[ " $LQ_ONLY " == *" ${row%%|*} "* ]] && keep+=("$row"); done
  modes=("${keep[@]}")
fi
threads=$(( $(nproc) / ${#modes[@]} ))
(( threads < 1 )) && threads=1
pids=()
for row in "${modes[@]}"; do
  name=${row%%|*}
  opts=${row#*|}
  rm -rf "$OUT/run_$name"
  # shellcheck disable=SC2086
  "$R" train "${common[@]}" $opts --threads "$threads" --out "$OUT/run_$name" \
    --metrics "$OUT/lq_$name.jsonl" > "$OUT/lq_$name.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
ls "$OUT"/lq_*.jsonl > /dev/null 2>&1 && python3 "$here/bench/plot_curves.py" --table "$OUT"/lq_*.jsonl
# one archive of every run's metrics and log (the GPU machine returns a few files only)
(cd "$OUT" && tar cf lean_quality.tar lq_*.jsonl lq_*.log 2> /dev/null)
for row in "${modes[@]}"; do
  name=${row%%|*}
  grep -q "trained" "$OUT/lq_$name.log" || { echo "$name failed:"; tail -5 "$OUT/lq_$name.log"; }
done
exit $rc
