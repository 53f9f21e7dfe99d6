#!/usr/bin/env bash
# Layers point one way (STYLE.md rule 15): a folder of src/ may include only
# the folders listed for it below, never one above it. Fails, naming each
# offending #include, when a file breaks that. Run by CTest (layering.check).
#   core <- dist, model, tokenizer <- cpu, cuda, state <- optim, io <- data <- engine <- cli
# (dist/ is the collectives and the launch (core only: it knows no model);
# cpu/ and cuda/ are the op backends; state/ is HostState, the training state
# in host memory; engine/cuda/ is the engine's CUDA backend, part of engine/.)
set -euo pipefail
src="${1:-$(cd "$(dirname "$0")/../src" && pwd)}"

declare -A allowed=(
  [core]="core"
  [dist]="core dist"
  [model]="core model"
  [tokenizer]="core tokenizer"
  [cpu]="core model cpu"
  [cuda]="core model cuda"
  [state]="core model state"
  [optim]="core model cpu state optim"  # cpu: Muon's fp32 NS5 runs on the CPU GEMMs (optim/muon.cpp)
  [io]="core model state io"
  [data]="core model state io tokenizer data"
  [engine]="core dist model tokenizer cpu cuda state optim io data engine"
  [cli]="core dist model tokenizer cpu cuda state optim io data engine cli"
)

bad=0
while IFS= read -r -d '' f; do
  rel="${f#"$src"/}"
  folder="${rel%%/*}"
  if [[ -z "${allowed[$folder]+x}" ]]; then
    echo "check_layering: src/$rel is in a folder with no rule (add '$folder' to tests/check_layering.sh)"
    bad=1
    continue
  fi
  while IFS= read -r line; do
    inc="${line#*\"}"
    inc="${inc%%\"*}"
    [[ "$inc" == */* ]] || continue  # a file next to this one, or a system header
    dep="${inc%%/*}"
    [[ -n "${allowed[$dep]+x}" ]] || continue  # not a folder of src/
    if [[ " ${allowed[$folder]} " != *" $dep "* ]]; then
      echo "check_layering: src/$rel includes \"$inc\": $folder/ may include only ${allowed[$folder]}"
      bad=1
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
done < <(find "$src" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) -print0)

if [[ $bad -ne 0 ]]; then
  echo "check_layering: FAILED (STYLE.md rule 15: an interface method instead of an include upward)"
  exit 1
fi
echo "check_layering: every include of src/ points down"
