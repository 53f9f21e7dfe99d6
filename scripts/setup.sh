#!/usr/bin/env bash
# Installs the Debian packages ramtrain builds with. Idempotent and
# non-interactive: when everything is present it changes nothing.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-pthread-dev  # BLAS for the CPU backend (thread-safe build; ramtrain calls it with 1 thread per task)
  nlohmann-json3-dev       # JSON: config.json, safetensors headers
  libtomlplusplus-dev      # --config FILE.toml
  libxxhash-dev            # checkpoint checksums
  libpcre2-dev             # tokenizer split regexes
  libsentencepiece-dev     # SentencePiece tokenizers
  libgtest-dev             # tests
  python3
  python3-dev python3-venv # the Python package (pip install ., scripts/test_python.sh)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build dependencies present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
