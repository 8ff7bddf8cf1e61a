#!/usr/bin/env bash
# Makes .dev/, the TVM bundle that benchmarks/gpu_check.sh unpacks on the borrowed GPU machine, which has
# no network and no TVM. The carried tree may hold at most 64 MiB, and the apache-tvm wheel is 100 MB,
# so the bundle is two files:
#   .dev/site.tar.xz             apache-tvm's Python package and runtime libraries (its bundled CUTLASS
#                                sources left out), apache-tvm-ffi and tornado, for Python ${PYVER}
#   .dev/libtvm_compiler.so.xz   the wheel's compiler library, xz with the x86 BCJ filter (~58 MB of 259)
# Takes about 6 minutes on 2 cores (the xz -9e pass). Usage: bash benchmarks/device_bundle.sh [3.12]
set -euo pipefail
PYVER=${1:-3.12}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WORK/wheels" \
    apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 tornado
mkdir -p "$WORK/site" "$REPO/.dev"
for wheel in "$WORK"/wheels/*.whl; do unzip -q -o "$wheel" -d "$WORK/site"; done
mv "$WORK/site/tvm/lib/libtvm_compiler.so" "$WORK/libtvm_compiler.so"
rm -rf "$WORK/site/tvm/3rdparty"
find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$WORK/site" -cf - . | xz -9e -T1 > "$REPO/.dev/site.tar.xz"
xz --x86 --lzma2=preset=9e,dict=192MiB -c "$WORK/libtvm_compiler.so" > "$REPO/.dev/libtvm_compiler.so.xz"
grep -qx "/.dev/" "$(git -C "$REPO" rev-parse --git-path info/exclude)" ||
    echo "/.dev/" >> "$(git -C "$REPO" rev-parse --git-path info/exclude)"
du -b "$REPO"/.dev/*
