#!/usr/bin/env bash
# The one prepared run for the project's borrowed GPU machine (an H200 with 16 x86 cores, no network):
# its CPU's VNNI rows natively (tests, GEMM grid, models, a short tuning run that ships records), and
# the CUDA checks (tests/test_cuda_*.py, benchmarks/gpu_gemm.py, benchmarks/cuda_models.py) on the GPU, in one command that
# stays inside BUDGET_S seconds (default 580). Every section has its own time limit; a failing
# section is logged and the run goes on. Results land in benchmarks/results/host-<cpu>/ and
# benchmarks/results/gpu/, packed into $OUT/results.tar.gz after every section.
#
# TVM is not installed there and nothing can be downloaded, so it travels as a bundle in .dev/
# (ignored by git; made by benchmarks/device_bundle.sh): apache-tvm's Python package and runtime,
# its compiler library compressed with xz, apache-tvm-ffi and tornado for that machine's Python.
# Without .dev/ the script uses whatever `python3` imports. xgboost does not fit in the carried tree,
# so the tuning section uses the random cost model.
#
#   OUT=/tmp/check bash benchmarks/gpu_check.sh          # on the device machine, from the repo root
#   QUICK=1 BUDGET_S=400 bash benchmarks/gpu_check.sh    # smoke test of every section, anywhere
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
SITE=${SITE:-/tmp/lowprec-site}
if [ -n "${QUICK:-}" ]; then
    TESTS=(tests/test_targets.py) GRID=(--quick --shapes 64x64x64) MODELS=(--quick --models cnn --threads 1)
    TUNE=(--shapes 64x64x64 --trials 2 --threads 1)
else
    TESTS=(tests)
    GRID=(--shapes 256x256x256,1024x1024x1024,1x3072x768,1x4096x4096,16x3072x768,128x3072x768,128x768x3072)
    MODELS=(--models encoder,cnn --threads 1,2) TUNE=(--shapes 1024x1024x1024,128x768x3072 --trials 16 --threads 1,2)
fi
JOBS=${JOBS:-$(($(nproc) > 2 ? $(nproc) - 2 : 1))}
DEADLINE=$((SECONDS + ${BUDGET_S:-580}))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1  # every runtime with its default thread policy (benchmarks quiesce between runtimes)

CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | tr 'A-Z' 'a-z' | sed 's/([^)]*)//g; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
HOSTDIR=benchmarks/results/host-${CPU:-unknown}
mkdir -p "$HOSTDIR" benchmarks/results/gpu

left() { echo $((DEADLINE - SECONDS)); }
section() { echo; echo "=== $1 [$(date -u +%T), $(left) s left]"; }
# within SECONDS COMMAND...: run COMMAND for at most SECONDS (less if the budget is shorter)
within() {
    local limit=$1 rest
    shift
    rest=$(left)
    if [ "$rest" -lt 15 ]; then echo "skipped: budget spent"; return 124; fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    timeout -k 5 "$limit" "$@"
    local rc=$?
    echo "rc=$rc"
    return $rc
}
pack() {
    tar -czf "$OUT/results.tar.gz" "$HOSTDIR" benchmarks/results/gpu schedules 2>/dev/null
}

section "host"
grep -m1 "model name" /proc/cpuinfo
echo "cores: $(nproc); VNNI: $(grep -o -m1 -w 'avx512_vnni' /proc/cpuinfo || echo none); AVX-VNNI: $(grep -o -m1 -w 'avx_vnni' /proc/cpuinfo || echo none)"
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx|avx_vnni)' | tr '\n' ' '; echo
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3
{ grep -m1 "model name" /proc/cpuinfo; nproc; grep -m1 flags /proc/cpuinfo; nvidia-smi 2>&1 | head -15; } > "$HOSTDIR/host.txt"

section "environment"
if [ -f .dev/site.tar.xz ]; then
    mkdir -p "$SITE"
    tar -xJf .dev/site.tar.xz -C "$SITE" &&
        "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" \
            .dev/libtvm_compiler.so.xz "$SITE/tvm/lib/libtvm_compiler.so" ||
        echo "bundle: unpacking failed"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$SITE/bin"  # the console script that `pip install` would make (tests/test_docs.py runs it)
printf '#!/bin/sh\nexec "%s" -m tvm_lowprec.cli "$@"\n' "$(command -v "$PY")" > "$SITE/bin/tvm-lowprec"
chmod +x "$SITE/bin/tvm-lowprec"
export PATH="$SITE/bin:$PATH"
within 60 "$PY" -c "
import tvm, tvm_ffi, numpy, onnx, onnxruntime, tvm_lowprec
from tvm_lowprec.targets import native_target
print('python', __import__('sys').version.split()[0], 'tvm', tvm.__version__, 'tvm_ffi', tvm_ffi.__version__,
      'numpy', numpy.__version__, 'onnx', onnx.__version__, 'onnxruntime', onnxruntime.__version__)
print('native row:', native_target().name)" || { echo "tvm_lowprec does not import: stopping"; pack; exit 1; }

section "peak (one thread, then all cores)"
if gcc -O2 -mavx512f -mavx512vl -mavx512vnni -pthread benchmarks/peak/peak_vnni.c -o /tmp/peak_vnni 2>&1; then
    within 30 /tmp/peak_vnni 1 3 | tee "$HOSTDIR/peak.txt"
    within 20 /tmp/peak_vnni "$(nproc)" 1 | tee -a "$HOSTDIR/peak.txt"
fi
gcc -O2 -mavx2 benchmarks/peak/read_bw.c -o /tmp/read_bw && within 20 /tmp/read_bw 16 3 | tee -a "$HOSTDIR/peak.txt"

section "GPU checks (first, alone: kernel builds starve beside the CPU suite)"
if command -v nvidia-smi > /dev/null; then
    # TVM's CUDA runtime (whole models) needs libcuda and libcudart.so.13; its kernel compiler nvcc or NVRTC
    command -v nvcc > /dev/null && export TVM_CUDA_COMPILE_MODE=nvcc
    "$PY" -c "import tvm; from tvm_lowprec.cuda.run import tvm_cuda_available, cuda_device_available as c
print('TVM CUDA runtime:', tvm.runtime.enabled('cuda'), 'device:', tvm_cuda_available(), '| cupy:', c())" 2>&1 | tail -2
    within 200 "$PY" -m pytest -v -p no:cacheprovider -rs tests/test_cuda_mma.py tests/test_cuda_lowbit.py \
        tests/test_cuda_models.py 2>&1 | tee benchmarks/results/gpu/tests.txt |
        grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|rc="
    within 70 "$PY" benchmarks/gpu_gemm.py --out benchmarks/results/gpu 2>&1 | tee benchmarks/results/gpu/gemm_log.txt | tail -30
    within 90 "$PY" benchmarks/cuda_models.py --rows cuda-sm90 --repeat 10 --out benchmarks/results/gpu/models 2>&1 | tail -8
else
    echo "no GPU here"
fi
pack

section "test suite, natively ($JOBS workers)"
XDIST=(-n "$JOBS")
"$PY" -c "import xdist" 2>/dev/null || { XDIST=(); echo "no pytest-xdist: one worker"; }
within 140 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" -rs --ignore=tests/test_cuda_mma.py --ignore=tests/test_cuda_lowbit.py --ignore=tests/test_cuda_models.py \
    --junitxml="$HOSTDIR/tests.xml" "${TESTS[@]}" 2>&1 | tee "$HOSTDIR/tests.txt" | tail -40
pack

section "GEMM grid"
within 90 "$PY" benchmarks/matmul_grid.py --providers tvm-lowprec,ort-qlinearmatmul,ort-matmulinteger,torch-qlinear,numpy-fp32 \
    --threads 1,2 --measure-peak --no-predict --out "$HOSTDIR/matmul" \
    "${GRID[@]}" 2>&1 | tail -40
pack

section "reference models"
within 100 "$PY" benchmarks/model_bench.py "${MODELS[@]}" --runtimes ort-int8,ort-fp32,tvm-lowprec-int8 \
    --out "$HOSTDIR/models" --cache /tmp/models 2>&1 | tail -60
pack

section "tuning (random cost model: no xgboost there), shipped to schedules/"
within 80 "$PY" benchmarks/tune_bench.py --models none "${TUNE[@]}" --quick --cost-model random --work-dir /tmp/tuning --ship schedules --out "$HOSTDIR/tuning" 2>&1 | tail -30
pack

section "done"
ls -la "$OUT"
