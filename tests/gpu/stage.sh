#!/usr/bin/env bash
# Builds the CUDA configuration for the GPU machine (sm_90 only, to keep the
# build short) and stages what tests/gpu/run.sh needs into build/gpu-run:
# binaries, the shared libraries the GPU image may lack, and the test data.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DRAMTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "$@" >/dev/null
cmake --build build/gpu -j "$(nproc)"
out=build/gpu-run
rm -rf "$out"; mkdir -p "$out/lib" "$out/data"
cp build/gpu/ramtrain $(ls build/gpu/tests/gpu_*_test) \
   build/gpu/bench/ramtrain_bench build/gpu/bench/attention_bench build/gpu/bench/ramtrain_optim_bench \
   build/gpu/bench/ramtrain_muon_bench build/gpu/bench/fp8_gemm_bench build/gpu/bench/fp8_lt_probe \
   build/gpu/bench/moe_bench build/gpu/bench/moe_gemm_probe \
   build/gpu/tests/optim_adamw_test "$out/"
for b in "$out"/ramtrain "$out"/gpu_* "$out"/*_bench "$out"/*_test; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -E 'openblas|gfortran|quadmath|tomlplusplus|pcre2|sentencepiece|protobuf|xxhash' | xargs -r -I{} cp -L {} "$out/lib/"
if [ -f build/gpu/bench/libramtrain_kernel_profile.so ]; then  # the kprof part's CUPTI recorder and its library
  cp build/gpu/bench/libramtrain_kernel_profile.so "$out/"
  ldd "$out/libramtrain_kernel_profile.so" | awk '/libcupti/{print $3}' | xargs -r -I{} cp -L {} "$out/lib/"
fi
strip "$out"/ramtrain "$out"/gpu_* "$out"/*_bench "$out"/*_test
cp ../shared/data/tinyshakespeare.txt "$out/data/"
if [ "${RAMTRAIN_STAGE_ATTN:-1}" != 0 ]; then  # RAMTRAIN_STAGE_ATTN=0: no attnvar binaries (a shorter build)
  bash bench/attention_variants.sh "$out/attn" "${RAMTRAIN_ATTN_BASE:-HEAD}" >/dev/null  # RAMTRAIN_ATTN_BASE: the revision attnvar compares against
  strip "$out"/attn/*
fi
du -sh "$out"
