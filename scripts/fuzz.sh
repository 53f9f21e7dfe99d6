#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) with clang, ASan and UBSan in
# build/fuzz and runs each for a bounded time from a seed corpus.
#   scripts/fuzz.sh [SECONDS_PER_TARGET=30] [TARGET...]
# Installs clang and libclang-rt when missing (Debian packages). Exit status is
# non-zero when any target finds a crash; crash inputs land in build/fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
bash scripts/setup.sh
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang "$(apt-cache search --names-only '^libclang-rt-[0-9]+-dev$' | sort -V | tail -1 | cut -d' ' -f1)"
fi
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DRAMTRAIN_CUDA=OFF -DRAMTRAIN_TESTS=OFF -DRAMTRAIN_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build/fuzz -j "${RAMTRAIN_BUILD_JOBS:-$(nproc)}" --target fuzz_targets

# Seed corpora: committed seeds, the test fixtures, and a small generated safetensors file.
corpus=build/fuzz/corpus
mkdir -p "$corpus"/{safetensors_header_fuzz,config_json_fuzz,token_data_fuzz,checkpoint_manifest_fuzz,records_fuzz,jinja_template_fuzz} build/fuzz/crashes
cp fuzz/corpus/checkpoint_manifest/* "$corpus/checkpoint_manifest_fuzz/"
cp fuzz/corpus/token_data/* "$corpus/token_data_fuzz/"
cp fuzz/corpus/records/* "$corpus/records_fuzz/"
i=0; for f in $(find tests/fixtures -name config.json); do cp "$f" "$corpus/config_json_fuzz/seed$i.json"; i=$((i+1)); done
i=0; for f in $(find tests/fixtures -name tokens.txt); do cp "$f" "$corpus/token_data_fuzz/tokens$i.txt"; i=$((i+1)); done
python3 - "$corpus/safetensors_header_fuzz" <<'PY'
import json, struct, sys
h = {"__metadata__": {"format": "pt"},
     "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
     "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
     "c": {"dtype": "F16", "shape": [0], "data_offsets": [32, 32]}}
t = json.dumps(h).encode(); t += b" " * ((8 - len(t) % 8) % 8)
open(sys.argv[1] + "/seed.safetensors", "wb").write(struct.pack("<Q", len(t)) + t + bytes(range(32)))
PY
printf 'RTTOKENS' > "$corpus/token_data_fuzz/magic.bin"
python3 - "$corpus/jinja_template_fuzz" <<'PY'
import json, sys
for name, t in json.load(open("tests/fixtures/chat_templates/templates.json", encoding="utf-8")).items():
    open(f"{sys.argv[1]}/{name}.jinja", "w", encoding="utf-8").write(t["template"])
PY

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(safetensors_header_fuzz config_json_fuzz token_data_fuzz checkpoint_manifest_fuzz records_fuzz jinja_template_fuzz); fi
status=0
for t in "${targets[@]}"; do
  echo "== fuzz: $t for ${secs}s =="
  if ! UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
      "build/fuzz/fuzz/$t" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="build/fuzz/crashes/$t-" -print_final_stats=1 "$corpus/$t" 2>build/fuzz/$t.log; then
    echo "fuzz: $t FAILED (see build/fuzz/$t.log and build/fuzz/crashes/)"; tail -40 "build/fuzz/$t.log"; status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added|cov: " "build/fuzz/$t.log" | tail -3
  fi
done
exit $status
