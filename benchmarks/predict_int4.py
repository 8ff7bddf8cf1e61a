#!/usr/bin/env python
"""Bytes of packed 4-bit weights per cycle that each x86 row's GEMV loop can consume, by llvm-mca.

The INT4 GEMV's goal is the machine's read bandwidth. Whether a row can reach it is a question of its
inner loop: the bytes one iteration reads against the cycles it needs. For each x86 row and block
size, the int8-activation GEMV (1 x N x K, the row's GEMV tile) is built as the library builds it,
its innermost loop (the K-block loop: unpacking, the row's dot products and the per-block epilogue)
simulated on the row's llvm-mca CPU models, and reported as packed bytes per cycle. Multiply by a
core's clock for GB/s per core and compare with the memory's read bandwidth: a loop below the
bandwidth in bytes per clock is compute-bound, and more threads are what reaches the bandwidth.

Each intrinsic instance consumes one vector of unpacked weight bytes (``4 * lanes``), that is
``2 * lanes`` packed bytes. The model sees every load hit L1 (:mod:`tvm_lowprec.perfmodel`).

Examples
--------
python benchmarks/predict_int4.py                    # writes benchmarks/results/int4/predicted.md
python benchmarks/predict_int4.py --block-sizes 32 --out /tmp/int4p
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

if shutil.which("llvm-mca-19"):  # has the Zen 3/4 models (LLVM 14 has neither)
    os.environ.setdefault("LLVM_MCA", "llvm-mca-19")

try:
    import tvm_lowprec  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tvm

from tvm_lowprec.kernels.nbits import NbitsProblem, build_nbits_gemm
from tvm_lowprec.perfmodel import (
    extract_kernel_loop,
    find_llvm_mca,
    mca_block,
    mca_version,
    run_mca,
)
from tvm_lowprec.schedule.nbits import NbitsGemmRule
from tvm_lowprec.targets import registered_targets

HERE = Path(__file__).resolve().parent
# row -> llvm-mca CPU models: the CPUs each row stands for (LLVM 19 names)
ROW_CPUS = {
    "x86-avx512-vnni": ("znver4", "icelake-server", "sapphirerapids"),
    "x86-avx-vnni": ("alderlake",),
    "x86-avx512": ("skylake-avx512",),
    "x86-avx2": ("znver3", "haswell"),
}
def predict_row(row: str, n: int, k: int, block: int) -> list[dict]:
    spec = registered_targets()[row]
    nib = spec.nibble.intrin
    tile = spec.nibble.tiles[0]
    groups = nib.groups_for(block)
    problem = NbitsProblem(1, n, k, block, nib.lanes, "int8", nib.intrins[groups], mr=tile.mr, nr=tile.nr,
                           call_groups=groups)
    sch = NbitsGemmRule().apply(build_nbits_gemm(problem), spec)
    asm = tvm.compile(sch.mod, target=spec.tvm_target(1)).mod.inspect_source("asm")
    loop = extract_kernel_loop(asm, nib.name.split("_")[0])  # "vpdpbusd_zmm": the dot product
    packed = loop.intrinsics * 2 * nib.lanes
    instructions = len(mca_block(loop).splitlines()) - 1
    rows = []
    for cpu in ROW_CPUS[row]:
        result = run_mca(mca_block(loop), cpu)
        rows.append({"row": row, "block": block, "cpu": cpu, "model": result.sched_model,
                     "instructions": instructions, "dot products": loop.intrinsics, "packed bytes": packed,
                     "cycles": round(result.cycles_per_iteration, 2),
                     "bytes/cycle": round(packed / result.cycles_per_iteration, 2)})
    return rows


def report(rows: list[dict], n: int, k: int) -> str:
    keys = list(rows[0])
    lines = [
        "# INT4 GEMV inner loop: packed weight bytes per cycle (llvm-mca)", "",
        (f"`python benchmarks/predict_int4.py` · {mca_version(find_llvm_mca())} · GEMV 1x{n}x{k}, int8 "
         "activations, each row's GEMV tile. One iteration = one K block of one task (unpacking, dot products, "
         "the block's epilogue). Every load is taken to hit L1: this is the loop's own ceiling, not a memory "
         "figure."), "",
        "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
    ]
    lines += ["| " + " | ".join(str(r[key]) for key in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROW_CPUS), help="comma-separated x86 rows")
    parser.add_argument("--block-sizes", default="32,128")
    parser.add_argument("--shape", default="4096x4096", help="NxK of the GEMV")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "int4")
    args = parser.parse_args(argv)
    if find_llvm_mca() is None:
        parser.error("llvm-mca not found (apt-get install llvm-19, or set LLVM_MCA)")
    n, k = (int(v) for v in args.shape.split("x"))
    rows = [r for block in (int(b) for b in args.block_sizes.split(","))
            for row in args.rows.split(",") for r in predict_row(row, n, k, block)]
    text = report(rows, n, k)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predicted.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
