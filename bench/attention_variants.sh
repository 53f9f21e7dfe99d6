#!/usr/bin/env bash
# Builds attention_bench variants (tile shapes via -D, and the kernel of a
# git revision to compare against in the same GPU run) for sm_90 into
# OUT_DIR (default build/gpu-run/attn). tests/gpu/run.sh part `attnvar` times
# every binary there next to the staged attention_bench (the current kernel). Run here, where nvcc is; the GPU machine only runs them.
#   bench/attention_variants.sh [OUT_DIR] [BASE_REV]
# Variants: the build lines below; base = src/cuda/attention.cu and
# bench/attention_bench.cu at BASE_REV (default HEAD), default tile shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-run/attn}
rev=${2:-HEAD}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
flags=(-std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -Isrc)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git show "$rev:src/cuda/attention.cu" > "$tmp/attention_base.cu"
git show "$rev:bench/attention_bench.cu" > "$tmp/attention_bench_base.cu"
mkdir -p "$tmp/cuda"; git show "$rev:src/cuda/ops.h" > "$tmp/cuda/ops.h"  # found before src/ for the base
# the Hopper kernels (attention_sm90.cu) build for sm_90a alone, into an object linked beside attention.cu
sm90=(-std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Isrc -c)
"$nvcc" "${sm90[@]}" src/cuda/attention_sm90.cu -o "$tmp/sm90_current.o"
base_extra=()
if git cat-file -e "$rev:src/cuda/attention_sm90.cu" 2>/dev/null; then
  git show "$rev:src/cuda/attention_sm90.cu" > "$tmp/attention_sm90_base.cu"
  git show "$rev:src/cuda/attention_sm90.h" > "$tmp/cuda/attention_sm90.h"
  "$nvcc" "${sm90[@]}" -I"$tmp" "$tmp/attention_sm90_base.cu" -o "$tmp/sm90_base.o"
  base_extra=("$tmp/sm90_base.o")
fi
pids=()
build() {  # name bench-source kernel-source flags...
  local name=$1 bench=$2 src=$3; shift 3
  "$nvcc" "$@" "${flags[@]}" "$bench" "$src" -o "$out/attention_bench_$name" &
  pids+=($!)
}
build "base-$(git rev-parse --short "$rev")" "$tmp/attention_bench_base.cu" "$tmp/attention_base.cu" -I"$tmp" \
  "${base_extra[@]}"
build fwd_mt1 bench/attention_bench.cu src/cuda/attention.cu -DRAMTRAIN_ATTN_FWD_MT=1 "$tmp/sm90_current.o"
for p in "${pids[@]}"; do wait "$p"; done
ls "$out"
