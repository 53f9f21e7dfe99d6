#!/usr/bin/env bash
# The main job on an embedded default: installs dependencies, builds, and
# trains the built-in tiny-byte model (Llama-style, byte-level vocab, ~4M
# parameters) on the text of this checkout (its documentation and sources),
# printing the loss as it falls and a sample before and after training.
# Nothing is downloaded beyond Debian packages.
#   Environment: STEPS (default 300), RAMTRAIN_THREADS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== building =="
bash scripts/build.sh cpu
steps=${STEPS:-300}
exec ./build/cpu/ramtrain train --preset tiny-byte \
  --data README.md docs src tools scripts \
  --seq-len 128 --micro-batch 8 --steps "$steps" --lr 2e-3 --warmup 20 \
  --log-every 10 --eval-every 100 --eval-batches 4 \
  --sample-prompt "// Training state lives " --sample-tokens 160 \
  --out runs/demo
