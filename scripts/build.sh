#!/usr/bin/env bash
# Configures and builds one build directory.
#   scripts/build.sh [release|debug|sanitize|cpu] [extra cmake args...]
# release: Release, CUDA on when nvcc is found (build/release)
# cpu:     Release, CPU only (build/cpu)
# sanitize: ASan+UBSan, CPU only (build/sanitize)
# debug:   Debug, CPU only (build/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
shift || true
case "$kind" in
  release)  args=(-DCMAKE_BUILD_TYPE=Release -DRAMTRAIN_CUDA=AUTO) ;;
  cpu)      args=(-DCMAKE_BUILD_TYPE=Release -DRAMTRAIN_CUDA=OFF) ;;
  sanitize) args=(-DCMAKE_BUILD_TYPE=Sanitize -DRAMTRAIN_CUDA=OFF) ;;
  debug)    args=(-DCMAKE_BUILD_TYPE=Debug -DRAMTRAIN_CUDA=OFF) ;;
  *) echo "usage: $0 [release|cpu|sanitize|debug]" >&2; exit 2 ;;
esac
jobs=${RAMTRAIN_BUILD_JOBS:-$(nproc)}
cmake -S . -B "build/$kind" -G Ninja "${args[@]}" "$@" >/dev/null
cmake --build "build/$kind" -j "$jobs"
