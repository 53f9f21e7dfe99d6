#!/usr/bin/env bash
# The Python package's tests: a venv in build/pyenv with the build tools and
# the test dependencies from PyPI (scikit-build-core, nanobind, pytest,
# pyarrow, pandas; HF `datasets` is tested only when it is importable), then
# `pip install .` CPU-only (CMake build directory build/python, kept between
# runs, so a second run rebuilds only what changed) and pytest python/tests,
# run from outside the source tree so that the installed package is the one
# imported.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=build/pyenv
if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "scikit-build-core>=0.10" "nanobind>=2.0" pytest pyarrow pandas
export CMAKE_BUILD_PARALLEL_LEVEL=${RAMTRAIN_BUILD_JOBS:-$(nproc)}
"${pip[@]}" install --no-build-isolation -C build-dir=build/python -C cmake.define.RAMTRAIN_CUDA=OFF .
cd build
"$venv/bin/python" -m pytest -q -p no:cacheprovider ../python/tests "$@"
