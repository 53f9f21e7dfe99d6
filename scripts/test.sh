#!/usr/bin/env bash
# The test command: installs dependencies, builds the release configuration
# (with the CUDA backend when nvcc exists) and the sanitizer configuration
# (ASan + UBSan, CPU only), runs the whole suite under both, then the
# libFuzzer targets for RAMTRAIN_FUZZ_SECONDS each (default 20; 0 skips them).
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
echo "== tests: sanitize =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/sanitize --output-on-failure -j "$(nproc)" -LE slow || status=1
fuzz_secs=${RAMTRAIN_FUZZ_SECONDS:-20}
if [ "$fuzz_secs" != 0 ]; then
  echo "== fuzz: libFuzzer targets, ${fuzz_secs}s each =="
  bash scripts/fuzz.sh "$fuzz_secs" || status=1
fi
exit $status
