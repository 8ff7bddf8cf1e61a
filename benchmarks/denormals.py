#!/usr/bin/env python
"""Kernels whose time depends on the FPU's denormal mode: each reference model's per-kernel profile
(``Compiled.profile``, in the model, one thread) with the default MXCSR and with denormals read and
written as zero (:func:`tvm_lowprec.bench.fpenv.denormals_are_zero`), alternating, fastest of
``--rounds`` each. A kernel that runs faster with DAZ/FTZ computes on denormals, which in a quantized
model means it reads garbage (vector lanes past a small buffer; :mod:`tvm_lowprec.bench.fpenv`):
that is a bug to fix in the kernel, not a mode to set for users. Exits 1 when one is found.

    python benchmarks/denormals.py [--models detector,textdet-decomposed] [--rounds 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the ``models`` package beside this file
try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from models.build import DEFAULT_CACHE, MODELS, ensure_model  # noqa: E402
from tvm_lowprec.bench.cli_args import names_parser  # noqa: E402
from tvm_lowprec.bench.fpenv import denormals_are_zero  # noqa: E402
from tvm_lowprec.bench.hostinfo import cpu_info  # noqa: E402
from tvm_lowprec.compiled import random_inputs  # noqa: E402

RATIO, MIN_MS = 1.3, 0.003  # slower by this factor and at least this much without DAZ/FTZ: flagged


def _fastest(compiled, inputs, rounds: int, daz: bool) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(rounds):
        if daz:
            with denormals_are_zero():
                rows = compiled.profile(**inputs)
        else:
            rows = compiled.profile(**inputs)
        for row in rows:
            best[row["name"]] = min(best.get(row["name"], float("inf")), row["ms"])
    return best


def check_model(name: str, rounds: int, cache: Path) -> tuple[float, float, list[tuple[str, float, float]]]:
    """(summed kernel ms by default, with DAZ/FTZ, the flagged kernels as (name, ms, ms with DAZ/FTZ))."""
    built = ensure_model(MODELS[name], cache)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(built.int8_path)), target="native", num_threads=1)
    inputs = random_inputs(compiled)
    plain, flushed = {}, {}
    for _ in range(rounds):  # alternating, so that both modes see the same machine load
        for mode, best in ((False, plain), (True, flushed)):
            for kernel, ms in _fastest(compiled, inputs, 1, mode).items():
                best[kernel] = min(best.get(kernel, float("inf")), ms)
    flagged = [(k, plain[k], flushed[k]) for k in plain
               if plain[k] > RATIO * flushed[k] and plain[k] - flushed[k] > MIN_MS]
    return sum(plain.values()), sum(flushed.values()), sorted(flagged, key=lambda f: f[2] - f[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=names_parser(MODELS, "model"), default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    host = cpu_info()["model"]
    lines = [f"# Kernels sensitive to denormals ({host}, 1 thread, in-model profile, fastest of {args.rounds})", "",
             "| model | kernels, ms | with DAZ/FTZ, ms | kernel | ms | with DAZ/FTZ |", "|---|---:|---:|---|---:|---:|"]
    found = 0
    for name in args.models:
        plain, flushed, flagged = check_model(name, args.rounds, args.cache)
        found += len(flagged)
        cells = [(k, f"{a:.4f}", f"{b:.4f}") for k, a, b in flagged] or [("none", "", "")]
        for i, (k, a, b) in enumerate(cells):
            lead = f"| {name} | {plain:.3f} | {flushed:.3f} " if i == 0 else "| | | "
            lines.append(f"{lead}| {k} | {a} | {b} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
