"""The AMX int8 GEMM micro-kernel (tvm_lowprec.kernels.amx_gemm) against ONNX Runtime's MatMulInteger, one
run, one table (issue 27).

On a host with AMX (``amx_int8`` in /proc/cpuinfo): the process asks Linux for the tile data
(tvm_lowprec.amx.request_permission), builds the kernel for the host's CPU, checks it exactly against numpy at
every shape, then times it and ORT's ``MatMulInteger`` (uint8 x int8 -> int32, the same matrices) interleaved,
quiesced, at 1 thread and at the machine's thread count: GOPS, the ratio, and % of the AMX peak (2048 int8
ops per cycle per core, Intel's figure, at the clock given by ``--ghz``). Elsewhere it checks the same
kernel emulated at a small shape and times nothing (emulated code says nothing about speed).

    python benchmarks/amx_kernel.py --out benchmarks/results/amx/kernel      # on the AMX machine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SHAPES = ((1024, 1024, 1024), (256, 768, 768), (128, 3072, 768))
AMX_OPS_PER_CYCLE = 2048  # int8 ops (a multiply and an add each) per cycle per core: Intel's figure


def build(m, n, k, native: bool):
    import tvm

    from tvm_lowprec.kernels.amx_gemm import build_amx_gemm
    from tvm_lowprec.targets import host_cpu

    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu() if native else "sapphirerapids"})
    return tvm.compile(tvm.IRModule({"amx_gemm": build_amx_gemm(m, n, k)}), target=target)


def check(module, m, n, k, seed=0):
    """Runs ``module`` on random data; returns ``(inputs as TVM tensors, exact?)``."""
    import tvm

    from tvm_lowprec.kernels.amx_gemm import pack_b

    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    args = [tvm.runtime.tensor(a), tvm.runtime.tensor(pack_b(w)), tvm.runtime.tensor(np.zeros((m, n), np.int32))]
    module["amx_gemm"](*args)
    return args, (a, w), bool(np.array_equal(args[2].numpy(), a.astype(np.int64) @ w.astype(np.int64)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/amx/kernel"))
    parser.add_argument("--ghz", type=float, default=2.0, help="core clock for the % of peak (default 2.0)")
    args = parser.parse_args(argv)
    from tvm_lowprec.amx import AmxPermissionError, request_permission
    from tvm_lowprec.bench.hostinfo import collect_metadata, host_line
    from tvm_lowprec.bench.report import markdown_table
    from tvm_lowprec.targets import real_host_features

    meta = collect_metadata(benchmark="amx_kernel")
    args.out.mkdir(parents=True, exist_ok=True)
    if "amxint8" not in real_host_features():
        from tvm_lowprec.emulation import known_semantics, load_emulated
        from tvm_lowprec.intrin.amx_semantics import AMX_SEMANTICS

        module, _ = load_emulated(build(64, 64, 128, native=False).mod, {**known_semantics(), **AMX_SEMANTICS})
        exact = check(module, 64, 64, 128)[2]
        print(f"{host_line(meta)}\nno AMX here: the kernel ran emulated at 64x64x128, exact: {exact}; nothing timed")
        return 0 if exact else 1
    try:
        request_permission()
    except AmxPermissionError as err:
        print(f"tvm-lowprec amx_kernel: {err}", file=sys.stderr)
        return 2
    from tvm_lowprec.bench.providers import OrtMatMulInteger
    from tvm_lowprec.bench.timing import measure_interleaved, wall_loop

    import tvm

    from tvm_lowprec._threads import default_threads

    rows = []
    for threads in sorted({1, default_threads()}):
        tvm.get_global_func("runtime.config_threadpool")(1, threads)  # the pool, as Compiled narrows it
        for m, n, k in SHAPES:
            lib = build(m, n, k, native=True)
            tensors, _, exact = check(lib, m, n, k)
            ort = OrtMatMulInteger().prepare(m, n, k, np.random.default_rng(0), threads=threads)
            evaluator = lib.time_evaluator("amx_gemm", tvm.cpu(), number=1, repeat=1)
            times = measure_interleaved({"tvm": lambda number: float(np.mean([evaluator(*tensors).mean
                                                                              for _ in range(number)])),
                                         "ort": wall_loop(ort.run)}, quiesce=True)
            ops = 2 * m * n * k
            ours, theirs = ops / times["tvm"].seconds / 1e9, ops / times["ort"].seconds / 1e9
            peak = AMX_OPS_PER_CYCLE * args.ghz * threads
            rows.append({"shape": f"{m}x{n}x{k}", "threads": threads, "exact": exact, "tvm_gops": ours,
                         "ort_gops": theirs, "ratio": ours / theirs, "pct_peak": 100 * ours / peak})
            print(rows[-1], flush=True)
    head = ["M×N×K", "threads", "exact", "tvm-lowprec AMX GOPS", "ORT MatMulInteger GOPS", "ratio", "% of AMX peak"]
    body = [[r["shape"], r["threads"], r["exact"], f"{r['tvm_gops']:.0f}", f"{r['ort_gops']:.0f}", f"**{r['ratio']:.2f}x**",
             f"{r['pct_peak']:.0f}%"] for r in rows]
    text = "\n".join(["# AMX GEMM micro-kernel vs ONNX Runtime MatMulInteger", "", host_line(meta), "",
                      f"peak: {AMX_OPS_PER_CYCLE} int8 ops/cycle/core at {args.ghz} GHz (--ghz)", "",
                      *markdown_table(head, body)])
    (args.out / "report.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(text)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
