#!/usr/bin/env bash
# Runs on the GPU machine: issue 34's acceptance with CUDA. A fresh virtualenv,
# `pip install .` of this checkout with CUDA, then tests/gpu/python_cuda.py
# (tiny-byte trained on the GPU from a parquet file and from a
# datasets.Dataset with a per-step callback, the export loaded by
# transformers), then pytest python/tests.
#   tests/gpu/python_cuda.sh DEPS_DIR [CUDA_ARCH]
# DEPS_DIR is what tests/gpu/stage_pydeps.sh made here: the lent machine
# reaches no package index and lacks the Debian -dev packages, so the build
# tools come from DEPS_DIR/wheels and the C++ dependencies from
# DEPS_DIR/prefix (found through PKG_CONFIG_PATH, as a system's would be).
# The venv sees the machine's Python packages (torch, transformers, pyarrow,
# pandas, datasets where present) through a .pth file: the machine keeps them
# in a venv of its own, which --system-site-packages would not reach.
# Logs go to $OUT when set.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
deps=$(cd "${1:?usage: python_cuda.sh DEPS_DIR [CUDA_ARCH]}" && pwd)
wheels=$deps/wheels pre=$deps/prefix
arch=${2:-90}
logs=${OUT:-/tmp/ramtrain_gpu_logs}
mkdir -p "$logs"
work=$(mktemp -d)
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv "$work/venv"
py=$work/venv/bin/python
echo "$site" > "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_site.pth"
pip=("$py" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --no-index --find-links "$wheels" "scikit-build-core>=0.10" "nanobind>=2.0" pytest cmake ninja
"${pip[@]}" install -q --no-index --find-links "$wheels" datasets \
  || echo "HF datasets did not install from $wheels: the Dataset case is skipped"
export PATH=$work/venv/bin:$PATH${CUDA_HOME:+:$CUDA_HOME/bin}:/usr/local/cuda/bin
"$py" -c "import sys, importlib.util as u; print(sys.version.split()[0], {m: bool(u.find_spec(m)) for m in ('torch', 'transformers', 'pyarrow', 'pandas', 'datasets')})"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export PKG_CONFIG_PATH=$pre/lib/pkgconfig LD_LIBRARY_PATH=$pre/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LDFLAGS="-Wl,-rpath-link,$pre/lib"
t0=$(date +%s)
(cd "$here" && "${pip[@]}" install -v --no-build-isolation --no-deps . -C build-dir="$work/build" \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" -C cmake.define.OPENBLAS_INCLUDE_DIR="$pre/include/openblas" \
  -C cmake.define.OPENBLAS_LIBRARY="$pre/lib/libopenblas.so") > "$logs/python_cuda_install.log" 2>&1 \
  || { tail -40 "$logs/python_cuda_install.log"; exit 1; }
echo "pip install . (CUDA, sm_$arch): $(( $(date +%s) - t0 )) s"
grep -h "ramtrain CUDA backend" "$logs/python_cuda_install.log" || true
grep -E "^RAMTRAIN_CUDA:|^CMAKE_CUDA_COMPILER:" "$work/build/CMakeCache.txt" || true
cd "$work"
"$py" "$here/tests/gpu/python_cuda.py" "$here" "$work/runs" 2>&1 | tee "$logs/python_cuda.log"
"$py" -m pytest -q -p no:cacheprovider "$here/python/tests" 2>&1 | tee "$logs/python_pytest.log"
