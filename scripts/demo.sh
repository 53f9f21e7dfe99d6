#!/usr/bin/env bash
# The main job on an embedded default: installs dependencies, builds, and
# trains the built-in tiny-byte model (Llama-style, byte-level vocab, ~4M
# parameters) on the text of this checkout (its documentation and sources),
# printing the loss as it falls and a sample before and after training.
# Nothing is downloaded beyond Debian packages.
# With a GPU present (nvidia-smi finds one) it builds the CUDA backend too and
# trains there; otherwise a CPU-only build, which is quicker to compile.
#   Environment: STEPS (default 300); DEMO_BIN=path/to/ramtrain skips the set-up
#   and the build (tests/gpu/run.sh uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-300}
bin=${DEMO_BIN:-}
if [ -z "$bin" ]; then
  bash scripts/setup.sh
  echo "== building =="
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then kind=release; else kind=cpu; fi
  bash scripts/build.sh "$kind"
  bin=./build/$kind/ramtrain
fi
exec "$bin" train --preset tiny-byte \
  --data README.md docs src tools scripts \
  --seq-len 128 --micro-batch 8 --steps "$steps" --lr 2e-3 --warmup 20 \
  --log-every 10 --eval-every 100 --eval-batches 4 \
  --sample-prompt "// Training state lives " --sample-tokens 160 \
  --out runs/demo --overwrite
