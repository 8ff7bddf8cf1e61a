#!/usr/bin/env python
"""Predict register tiles of the bf16 GEMM (``vdpbf16ps`` zmm, :mod:`tvm_lowprec.kernels.bf16_gemm`) with llvm-mca.

For each shape and candidate tile ``mr x nr`` the kernel is built for the AVX-512 VNNI row's bf16
recipe as the library builds it (any host: nothing runs), its innermost K loop found in the assembly
(:func:`tvm_lowprec.perfmodel.extract_kernel_loop`) and simulated on llvm-mca's ``znver4`` and
``sapphirerapids`` models (LLVM 16 or later has both: ``LLVM_MCA=llvm-mca-19``, the default here).
The ceiling is a block of 24 independent ``vdpbf16ps`` on the same model (register or memory
third operand, the faster). Prints one Markdown row per
shape and tile: instructions per loop iteration, stack spills in the loop, % of the ceiling per CPU.

As with :mod:`tvm_lowprec.perfmodel`, memory is invisible to the model (every load hits L1): GEMV is
bandwidth-bound on a real CPU. These figures are what the bf16 tile table's ``why`` strings quote
(``tvm_lowprec/targets/x86.py``).

Examples
--------
python benchmarks/predict_bf16_tiles.py                                    # 3 shapes x 8 tiles (~1 min)
python benchmarks/predict_bf16_tiles.py --shapes 16x3072x768 --tiles 4x4,6x4
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("LLVM_MCA", "llvm-mca-19")
try:
    import tvm_lowprec  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tvm  # noqa: E402

from tvm_lowprec.bench.cli_args import parse_shapes  # noqa: E402
from tvm_lowprec.kernels.bf16_gemm import Bf16Layout, build_bf16_gemm  # noqa: E402
from tvm_lowprec.perfmodel import extract_kernel_loop, mca_block, run_mca  # noqa: E402
from tvm_lowprec.schedule import schedule_func  # noqa: E402
from tvm_lowprec.targets import registered_targets  # noqa: E402

CPUS = ("znver4", "sapphirerapids")
TILES = "1x4,1x8,2x8,2x12,3x8,4x4,4x6,6x4"
SHAPES = "1x4096x4096,16x3072x768,256x1024x1024"
CEILING_ACCUMULATORS = 24


def ceiling(cpu: str) -> float:
    """``vdpbf16ps`` zmm per cycle on ``cpu``'s model: independent accumulators, the third operand a
    register or memory, whichever the model runs faster (LLVM 19's znver4 model issues the memory form
    more often than the register form)."""
    forms = ("%zmm{b}", "{off}(%rax)")
    best = 0.0
    for form in forms:
        block = "\n".join(f"vdpbf16ps {form.format(b=28 + i % 2, off=64 * i)}, %zmm{30 + i % 2}, %zmm{i}"
                          for i in range(CEILING_ACCUMULATORS))
        best = max(best, CEILING_ACCUMULATORS / run_mca(block + "\n", cpu).cycles_per_iteration)
    return best


def kernel_loop(spec, m: int, n: int, k: int, mr: int, nr: int):
    intrin = spec.bf16.intrin
    layout = Bf16Layout("bfloat16", intrin.intrin, m, n, k, intrin.lanes, mr, nr)
    sch = schedule_func(build_bf16_gemm(layout, "bf16_tile"), spec)
    asm = tvm.compile(sch.mod, target=spec.tvm_target(1)).mod.inspect_source("asm")
    return extract_kernel_loop(asm, "vdpbf16ps")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="MxNxK,... (default %(default)s)")
    parser.add_argument("--tiles", default=TILES, help="mrxnr,... (default %(default)s)")
    args = parser.parse_args(argv)
    spec = registered_targets()["x86-avx512-vnni"]
    ceilings = {cpu: ceiling(cpu) for cpu in CPUS}
    print("ceiling, vdpbf16ps zmm per cycle: " + ", ".join(f"{c} {v:.2f}" for c, v in ceilings.items()))
    print(f"\n| shape | tile | vdpbf16ps / iteration | spills | {' | '.join(CPUS)} |")
    print("|---|---|---:|---:|" + "---:|" * len(CPUS))
    for m, n, k in parse_shapes(args.shapes):
        for tile in args.tiles.split(","):
            mr, nr = (int(x) for x in tile.split("x"))
            loop = kernel_loop(spec, m, n, k, mr, nr)
            spills = sum("(%rsp)" in line and "mm" in line for line in loop.body)  # vector stack traffic
            block = mca_block(loop)
            fractions = [loop.intrinsics / run_mca(block, cpu).cycles_per_iteration / ceilings[cpu] for cpu in CPUS]
            print(f"| {m}x{n}x{k} | {tile} | {loop.intrinsics} | {spills} | "
                  + " | ".join(f"{100 * f:.1f}%" for f in fractions) + " |")


if __name__ == "__main__":
    main()
