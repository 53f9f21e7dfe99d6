#!/usr/bin/env bash
# The test command: installs dependencies, builds the release configuration
# (with the CUDA backend when nvcc exists) and the sanitizer configuration
# (ASan + UBSan, CPU only), runs the whole suite under both (the numerics
# label a second and third time under other OpenBLAS kernels), then the
# libFuzzer targets for RAMTRAIN_FUZZ_SECONDS each (default 20; 0 skips them),
# and the Python package's tests (scripts/test_python.sh: pip install . of a
# CPU-only build into a venv under build/, then pytest python/tests).
# GPU-only checks live in tests/gpu/run.sh and run on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== build: release =="
bash scripts/build.sh release
echo "== build: sanitize (ASan + UBSan) =="
bash scripts/build.sh sanitize
status=0
echo "== tests: release =="
ctest --test-dir build/release --output-on-failure -j "$(nproc)" || status=1
# The tests labelled numerics (fp32 sums in BLAS-dependent orders) once more
# under other OpenBLAS kernel families: Haswell and Zen (AVX2), whichever the
# machine picked for the run above (SkylakeX on AVX-512 CPUs). Only on x86-64
# with AVX2, which both need; OpenBLAS builds without DYNAMIC_ARCH ignore it.
if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo; then
  for core in Haswell Zen; do
    echo "== tests: release, numerics label, OPENBLAS_CORETYPE=$core =="
    OPENBLAS_CORETYPE=$core ctest --test-dir build/release --output-on-failure -j "$(nproc)" -L numerics || status=1
  done
fi
echo "== tests: sanitize =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/sanitize --output-on-failure -j "$(nproc)" -LE slow || status=1
echo "== tests: python (pip install . CPU-only, pytest python/tests) =="
bash scripts/test_python.sh || status=1
fuzz_secs=${RAMTRAIN_FUZZ_SECONDS:-20}
if [ "$fuzz_secs" != 0 ]; then
  echo "== fuzz: libFuzzer targets, ${fuzz_secs}s each =="
  bash scripts/fuzz.sh "$fuzz_secs" || status=1
fi
exit $status
