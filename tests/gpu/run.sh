#!/usr/bin/env bash
# Runs on the GPU machine, in one call: CUDA ops vs CPU, the streaming engine
# tests, the 7B-shape benchmark (streaming and resident), the attention
# benchmark against PyTorch SDPA, HF fixture regeneration, and a transformers
# load of a ramtrain export. Prints a summary table last.
#   tests/gpu/run.sh [BIN_DIR]   BIN_DIR holds ramtrain, the test and bench
#   binaries, lib/ (shared libraries the GPU machine may lack) and data/
#   (tinyshakespeare.txt); see tests/gpu/stage.sh, which makes it here.
# Logs go to $OUT when set. Set RAMTRAIN_GPU_QUICK=1 to skip the 7B bench.
set -u -o pipefail
bin=${1:-build/gpu-run}
here=$(cd "$(dirname "$0")/../.." && pwd)
logs=${OUT:-/tmp/ramtrain_gpu_logs}
mkdir -p "$logs"
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RAMTRAIN_SHARED_DATA_DIR="$bin/data"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; free -g | head -2
summary=()
run() {  # name timeout command...
  local name=$1 t=$2; shift 2
  echo "== $name =="
  local t0=$(date +%s)
  timeout "$t" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$logs/$name.log"
  summary+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
}
run cuda_ops_test 120 "$bin/gpu_cuda_ops_test"
run engine_test 300 "$bin/gpu_engine_test"
if [ "${RAMTRAIN_GPU_QUICK:-0}" != 1 ]; then
  run bench_7b_2048 300 "$bin/ramtrain_bench" --preset qwen2.5-7b --seq-len 2048 --micro-batch 16 --steps 3 --warmup 2 \
    --modes streaming,resident --trace "$logs/trace_7b"
fi
run attention_bench 120 "$bin/attention_bench" --B 1,2
run attention_sdpa 120 env PYTHONUNBUFFERED=1 python3 "$here/bench/attention_sdpa.py" --B 1,2
# HF fixtures regenerated here must equal the committed ones
run fixtures_regen 120 bash -c "python3 '$here/tools/make_hf_fixtures.py' --out /tmp/fx && diff -r /tmp/fx/hf '$here/tests/fixtures/hf' && diff -r /tmp/fx/adamw '$here/tests/fixtures/adamw' && echo FIXTURES-IDENTICAL"
# a ramtrain export loads in transformers with the same loss
run export_check 200 bash -c "
  set -e; d=/tmp/exp; rm -rf \$d; mkdir -p \$d
  '$bin/ramtrain' train --preset tiny-byte --data '$here/README.md' '$here/src' --steps 5 --seq-len 64 --micro-batch 4 \
     --device cpu --export-dtype fp32 --out \$d/run >/dev/null
  python3 -c \"import random; random.seed(0); [print(' '.join(str(random.randrange(258)) for _ in range(48))) for _ in range(3)]\" > \$d/tokens.txt
  '$bin/ramtrain' loss --model \$d/run/final --tokens \$d/tokens.txt --json | tee \$d/ours.json
  ours=\$(python3 -c \"import json; print(json.load(open('\$d/ours.json'))['loss'])\")
  python3 '$here/tools/check_hf_export.py' \$d/run/final --tokens \$d/tokens.txt --expect-loss \$ours --rtol 1e-5
  '$bin/ramtrain' train --preset tiny-byte --data '$here/README.md' --steps 3 --seq-len 64 --micro-batch 4 --device cpu --out \$d/run16 >/dev/null
  python3 '$here/tools/check_hf_export.py' \$d/run16/final --tokens \$d/tokens.txt && echo EXPORT-OK"
echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
grep -E "^\[  (PASSED|FAILED)" "$logs/cuda_ops_test.log" "$logs/engine_test.log" | sed 's/^/  /'
grep -E "\[engine\]" "$logs/engine_test.log" | head -20
grep -E "^(mode|streaming|resident|bf16 GEMM|model|FLOPs)" "$logs/bench_7b_2048.log" 2>/dev/null
grep -E "^[0-9]" "$logs/attention_bench.log" | sed 's/^/ramtrain attn /'
grep -E "^[0-9]" "$logs/attention_sdpa.log" | sed 's/^/sdpa attn     /'
grep -E "IDENTICAL|EXPORT-OK|loss" "$logs/fixtures_regen.log" "$logs/export_check.log" | tail -6
