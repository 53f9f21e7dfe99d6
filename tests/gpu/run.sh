#!/usr/bin/env bash
# Runs on the GPU machine: the CUDA ops test binary, then the attention
# benchmark (ours and PyTorch SDPA, same shapes and FLOP counts), then a
# large-shape correctness check of our attention against an fp32 reference.
# Prints a short table last. Usage: tests/gpu/run.sh [build_dir] (default
# build/release, a build with -DRAMTRAIN_CUDA=ON). Logs go to $OUT when set.
set -u -o pipefail
build=${1:-build/release}
here=$(cd "$(dirname "$0")/../.." && pwd)
logs=${OUT:-/tmp/ramtrain_gpu_logs}
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true

test_bin="$build/tests/gpu_cuda_ops_test"
bench_bin="$build/bench/attention_bench"
status_test=missing
if [ -x "$test_bin" ]; then
  if "$test_bin" 2>&1 | tee "$logs/cuda_ops_test.log" | grep -E "^\[  (FAILED|  OK|  SKIPPED) |PASSED|FAILED|rel_l2|Failure" ; then :; fi
  if grep -q "\[  PASSED  \]" "$logs/cuda_ops_test.log" && ! grep -q "\[  FAILED  \]" "$logs/cuda_ops_test.log"; then
    status_test=pass
  else
    status_test=FAIL
  fi
fi

dump=/tmp/ramtrain_attn_dump
mkdir -p "$dump"
echo "== ramtrain attention (causal) =="
"$bench_bin" --B 1,2 --dump "$dump" 2>&1 | tee "$logs/attention_bench.log"
"$bench_bin" --B 2 --G 8 --reps 10 2>&1 | tail -n 1 | tee -a "$logs/attention_bench.log"
echo "== PyTorch SDPA (causal) =="
PYTHONUNBUFFERED=1 python3 "$here/bench/attention_sdpa.py" --B 1,2 2>&1 | tee "$logs/attention_sdpa.log"
PYTHONUNBUFFERED=1 python3 "$here/bench/attention_sdpa.py" --B 2 --G 8 --reps 10 2>&1 | tail -n 1 | tee -a "$logs/attention_sdpa.log"
echo "== large-shape check of ramtrain attention (B=1 T=4096 H=32 D=128) =="
PYTHONUNBUFFERED=1 python3 "$here/bench/attention_sdpa.py" --check "$dump" 2>&1 | tee "$logs/attention_check.log"

echo
echo "================ summary ================"
echo "cuda_ops_test: $status_test ($(grep -c '^\[       OK \]' "$logs/cuda_ops_test.log" 2>/dev/null || echo 0) ok)"
printf "%-10s %s\n" "who" "B T H G D fwd_ms bwd_ms fwd_TF/s bwd_TF/s fb_TF/s"
grep -E "^[0-9]" "$logs/attention_bench.log" | sed 's/^/ramtrain   /'
grep -E "^[0-9]" "$logs/attention_sdpa.log" | sed 's/^/sdpa       /'
grep -E "rel_l2" "$logs/attention_check.log" | sed 's/^/check /'
