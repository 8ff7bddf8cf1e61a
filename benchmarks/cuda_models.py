#!/usr/bin/env python
"""The reference models on the GPU rows: compiled for each row here (no GPU needed: nvcc builds the
PTX and the cubin), and, where TVM's runtime sees a CUDA device, run and timed against the same
FP32 model through TVM's own CUDA pipeline (dlight rules) in the same process.

Examples
--------
python benchmarks/cuda_models.py                                   # encoder, cnn on every GPU row
python benchmarks/cuda_models.py --models encoder --rows cuda-sm90 --out /tmp/cuda

Output in ``--out`` (default ``benchmarks/results/cuda-models``): ``report.md`` (per model and row:
kernels, integer GEMM kernels on mma, the PTX's mma instructions, cubin size, compile time; with a
GPU: latency, FP32 latency, their ratio, and the largest difference from ONNX Runtime on CPU in
output steps) and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from models.build import MODELS, ensure_model, make_feed

import tvm_lowprec
from tvm_lowprec.cuda.run import cuda_device_available, tvm_cuda_available
from tvm_lowprec.targets import registered_targets


def _fp32_on_gpu(path, spec):
    """TVM's own CUDA pipeline on the FP32 model (the baseline): (VM, device)."""
    import tvm
    from tvm import relax

    mod = tvm_lowprec.from_onnx(str(path))
    ex = tvm.compile(mod, target=spec.tvm_target())
    dev = tvm.cuda(0)
    return relax.VirtualMachine(ex, dev), dev


def _time_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_one(name, spec, repeat, gpu):
    built = ensure_model(MODELS[name])
    row = {"model": name, "row": spec.name, "arch": spec.arch}
    t0 = time.perf_counter()
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(built.int8_path)), target=spec)
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    kernels = compiled.kernels()
    gemms = [k for k in kernels if k.op == "qgemm"]
    row.update(kernels=len(kernels), qgemm=len(gemms), qgemm_on_mma=sum(k.intrinsic in spec.mma.values() for k in gemms),
               unscheduled=sum(k.schedule == "none" for k in kernels))
    if compiled.cuda is not None:
        row.update(device_kernels=len(compiled.cuda.kernel_names), mma=compiled.cuda.mma,
                   ptx_kb=round(len(compiled.cuda.ptx) / 1024), cubin_kb=round(len(compiled.cuda.cubin) / 1024))
    if gpu:
        import onnxruntime as ort

        feed = make_feed(MODELS[name])
        out = compiled(feed)[0]
        ref = ort.InferenceSession(str(built.int8_path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
        row["max_abs_diff_vs_ort"] = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
        row["int8_ms"] = round(compiled.benchmark(feed, number=10, repeat=repeat), 3)
        vm, dev = _fp32_on_gpu(built.fp32_path, spec)
        import tvm

        args = [tvm.runtime.tensor(v, dev) for v in feed.values()]
        row["fp32_ms"] = round(_time_ms(lambda: (vm["main"](*args), dev.sync()), repeat), 3)
        row["fp32_over_int8"] = round(row["fp32_ms"] / row["int8_ms"], 2)
    return row


def report(rows, gpu_text) -> str:
    lines = [f"# Reference models on the GPU rows\n\nHost: {platform.node()}; GPU: {gpu_text}\n",
             ("| model | row | compile s | kernels | integer GEMM/conv on mma | unscheduled | device kernels | PTX mma "
              "| cubin KiB | INT8 ms | FP32 ms (TVM dlight) | FP32/INT8 |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['row']} | failed: {r['error'][:120]} |")
            continue
        mma = "; ".join(f"{k.split('.')[3]}.{'.'.join(k.split('.')[-3:-1])} x{v}" for k, v in r.get("mma", {}).items())
        lines.append(f"| {r['model']} | {r['row']} | {r['compile_s']} | {r['kernels']} | {r['qgemm_on_mma']}/{r['qgemm']} "
                     f"| {r['unscheduled']} | {r.get('device_kernels', '-')} | {mma or '-'} | {r.get('cubin_kb', '-')} "
                     f"| {r.get('int8_ms', '-')} | {r.get('fp32_ms', '-')} | {r.get('fp32_over_int8', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="encoder,cnn")
    parser.add_argument("--rows", default=",".join(registered_targets("cuda")))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default=str(HERE / "results" / "cuda-models"))
    args = parser.parse_args(argv)
    gpu = tvm_cuda_available()
    gpu_text = cuda_device_available()[1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        for row_name in args.rows.split(","):
            spec = registered_targets()[row_name]
            try:
                rows.append(run_one(name, spec, args.repeat, gpu))
            except Exception as err:  # noqa: BLE001  (one failure never stops the rest)
                message = str(err).strip().splitlines()
                rows.append({"model": name, "row": row_name, "error": f"{type(err).__name__}: {message[-1] if message else ''}"})
            print(json.dumps(rows[-1]), flush=True)
            (out / "results.json").write_text(json.dumps({"gpu": gpu_text, "rows": rows}, indent=1))
            (out / "report.md").write_text(report(rows, gpu_text))
    print(report(rows, gpu_text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
