#!/usr/bin/env bash
# Stages what tests/gpu/python_cuda.sh needs to run `pip install .` on the
# lent GPU machine, which reaches no package index and is not Debian (Ubuntu,
# without the -dev packages scripts/setup.sh installs here):
#   DIR/wheels  the build tools from PyPI (scikit-build-core, nanobind, pytest,
#               cmake, ninja) and HF datasets with what it needs beyond numpy, pandas
#               and pyarrow, for the GPU machine's Python (PYVER)
#   DIR/prefix  a prefix with this machine's Debian -dev files of the C++
#               dependencies (headers, shared libraries, pkg-config files made
#               relocatable): toml++, pcre2, sentencepiece, xxhash, OpenBLAS
#   [PYVER=3.12] tests/gpu/stage_pydeps.sh [DIR]   (default build/pydeps; PYVER: the GPU machine's Python)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/pydeps}
rm -rf "$out"; mkdir -p "$out/wheels" "$out/prefix/include" "$out/prefix/lib/pkgconfig"
py=${PYTHON:-python3}
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --platform manylinux2014_x86_64 \
  --python-version "${PYVER:-3.12}" -d "$out/wheels" "scikit-build-core>=0.10" "nanobind>=2.0" pytest cmake ninja
# HF datasets for the Dataset case (without numpy, pandas, pyarrow: the GPU machine has those)
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --python-version "${PYVER:-3.12}" \
  -d "$out/wheels" datasets
rm -f "$out"/wheels/numpy-* "$out"/wheels/pandas-* "$out"/wheels/pyarrow-*
pre=$out/prefix
for pc in tomlplusplus libpcre2-8 sentencepiece libxxhash; do
  dir=$(pkg-config --variable=pcfiledir "$pc")
  # prefix and libdir relative to the .pc file's own directory
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
      -e 's|^includedir=.*|includedir=${prefix}/include|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
      "$dir/$pc.pc" > "$pre/lib/pkgconfig/$pc.pc"
done
cp -r /usr/include/toml++ "$pre/include/"
cp /usr/include/pcre2.h /usr/include/xxhash.h "$pre/include/"
cp /usr/include/sentencepiece_processor.h /usr/include/sentencepiece_trainer.h "$pre/include/"
mkdir -p "$pre/include/openblas"
cp /usr/include/x86_64-linux-gnu/openblas-pthread/*.h "$pre/include/openblas/"
for lib in libtomlplusplus libpcre2-8 libsentencepiece libsentencepiece_train libxxhash; do
  so=/usr/lib/x86_64-linux-gnu/$lib.so
  cp -L "$so" "$pre/lib/$(basename "$(readlink -f "$so")")"
  soname=$(objdump -p "$so" | awk '/SONAME/ {print $2}')
  ln -sf "$(basename "$(readlink -f "$so")")" "$pre/lib/$soname"
  ln -sf "$soname" "$pre/lib/$lib.so"
done
# OpenBLAS (pthread build) and what it links: libgfortran, libquadmath; sentencepiece's protobuf-lite
cp -L /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 "$pre/lib/"
ln -sf libopenblas.so.0 "$pre/lib/libopenblas.so"
for dep in $(ldd /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 /usr/lib/x86_64-linux-gnu/libsentencepiece.so \
             | grep -E 'gfortran|quadmath|protobuf' | awk '{print $3}' | sort -u); do
  cp -L "$dep" "$pre/lib/"
done
du -sh "$out/wheels" "$out/prefix"
