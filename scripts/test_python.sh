#!/usr/bin/env bash
# The Python package's tests: a venv in build/pyenv with the build tools and
# the test dependencies from PyPI (scikit-build-core, nanobind, pytest,
# pyarrow, pandas, HF datasets), then
# a wheel built from the checkout CPU-only (`pip wheel .`, what `pip install .`
# builds too; CMake build directory build/python, kept between runs, so a
# second run rebuilds only what changed), installed, and pytest python/tests,
# run from outside the source tree so that the installed package is the one
# imported.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=$PWD/build/pyenv
if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "scikit-build-core>=0.10" "nanobind>=2.0" pytest pyarrow pandas datasets
export CMAKE_BUILD_PARALLEL_LEVEL=${RAMTRAIN_BUILD_JOBS:-$(nproc)}
rm -rf build/wheel
"${pip[@]}" wheel --no-build-isolation --no-deps -w build/wheel \
  -C build-dir=build/python -C cmake.define.RAMTRAIN_CUDA=OFF .
"${pip[@]}" install --force-reinstall --no-deps build/wheel/ramtrain-*.whl
cd build
"$venv/bin/python" -m pytest -q -p no:cacheprovider ../python/tests "$@"
