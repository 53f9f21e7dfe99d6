#!/usr/bin/env bash
# Loss curves of the lean training-state modes (docs/lean_state.md) against
# fp32 AdamW: the tiny-byte preset on tinyshakespeare, on the CPU backend (the
# reference), the same seed and data order for every mode. Prints the
# training loss (mean of 10 steps around each mark), the final validation loss
# and its difference from fp32 AdamW's. A bench, not a test (no pass/fail).
#   bench/lean_curves.sh [STEPS] [path/to/ramtrain] [DATA]
# Defaults: 200 steps, build/cpu/ramtrain, ../shared/data/tinyshakespeare.txt.
set -euo pipefail
STEPS=${1:-200}
R=${2:-build/cpu/ramtrain}
DATA=${3:-../shared/data/tinyshakespeare.txt}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
common=(--preset tiny-byte --data "$DATA" --device cpu --steps "$STEPS" --seq-len 64 --micro-batch 4
        --lr 3e-3 --warmup 20 --eval-batches 8 --log-every 1000 --seed 1)
# name | options
modes=(
  "adamw (fp32)|"
  "adamw8bit|--optimizer adamw8bit"
  "adamw8bit nearest|--optimizer adamw8bit --moment-rounding nearest"
  "adamw4bit|--optimizer adamw4bit"
  "adamw4bit nearest|--optimizer adamw4bit --moment-rounding nearest"
  "bf16-sr master|--master bf16-sr"
  "bf16-kahan master|--master bf16-kahan"
  "adamw8bit + bf16-sr|--optimizer adamw8bit --master bf16-sr"
  "adamw4bit + bf16-kahan|--optimizer adamw4bit --master bf16-kahan"
  "muon|--optimizer muon"
  "muon8bit|--optimizer muon8bit"
  "muon4bit|--optimizer muon4bit"
  "muon4bit nearest|--optimizer muon4bit --moment-rounding nearest"
  "muon4bit + bf16-sr|--optimizer muon4bit --master bf16-sr"
)
# MODES="name1,name2": only those rows (the first listed is the reference of "vs"; default: all)
if [[ -n "${MODES:-}" ]]; then
  keep=()
  IFS=',' read -ra want <<< "$MODES"
  for w in "${want[@]}"; do
    for row in "${modes[@]}"; do [[ "${row%%|*}" == "$w" ]] && keep+=("$row"); done
  done
  modes=("${keep[@]}")
fi
marks=()
for f in 4 2 1; do marks+=($((STEPS / f))); done
printf "%-24s %9s" "mode" "B/param"
for m in "${marks[@]}"; do printf " %9s" "loss@$m"; done
printf " %9s %8s\n" "val" "vs fp32"
ref=""
i=0
for row in "${modes[@]}"; do
  name=${row%%|*}
  opts=${row#*|}
  dir="$OUT/m$i"
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$R" train "${common[@]}" $opts --out "$dir" > "$dir.log" 2>&1 || { echo "$name: failed, see:"; tail -5 "$dir.log"; continue; }
  bpp=$(grep -o '[0-9.]* B/param host state' "$dir.log" | head -1 | cut -d' ' -f1)
  python3 - "$dir/metrics.jsonl" "$name" "$bpp" "${ref:-none}" "${marks[@]}" > "$dir.row" <<'PY'
import json, sys
path, name, bpp, ref = sys.argv[1:5]
marks = [int(x) for x in sys.argv[5:]]
loss, val = {}, None
for line in open(path):
    r = json.loads(line)
    if "loss" in r: loss[r["step"]] = r["loss"]
    if r.get("final"): val = r["val_loss"]
def near(s):
    xs = [loss[k] for k in range(s - 9, s + 1) if k in loss]
    return sum(xs) / len(xs)
row = "%-24s %9s" % (name, bpp) + "".join(" %9.4f" % near(m) for m in marks) + " %9.4f" % val
row += " %+7.2f%%" % (100 * (val / float(ref) - 1)) if ref != "none" else "        -"
print(row)
print(val, file=sys.stderr)
PY
  cat "$dir.row"
  [[ -z "$ref" ]] && ref=$(python3 -c "import json;print([json.loads(l) for l in open('$dir/metrics.jsonl')][-1]['val_loss'])")
done
