#!/usr/bin/env python
"""Quantized GEMM grid: tvm-lowprec against ONNX Runtime, PyTorch and NumPy, 1 and 2 threads.

Examples
--------
python benchmarks/matmul_grid.py --quick
python benchmarks/matmul_grid.py --providers tvm-lowprec,ort-qlinearmatmul --threads 1 --shapes 1x768x3072
python benchmarks/matmul_grid.py --providers tvm-lowprec,ort-qlinearmatmul --threads 1 --measure-peak \
    --shapes 1024x1024x1024,16x3072x768,1x4096x4096 --out benchmarks/results/matmul-predicted
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Several runtimes share this process and its two cores, each timed with its default thread policy
# (TVM's, ORT's, OpenMP's and OpenBLAS's workers spin between calls, as a user's do); every point starts
# once the previous point's workers sleep (tvm_lowprec.bench.quiesce, called by bench.grid.run_point),
# or the runtime timed next would compete with them (torch at 2 threads once fell to 0.07 GOPS).

try:
    import tvm_lowprec.bench as bench
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import tvm_lowprec.bench as bench
from tvm_lowprec.bench.cli_args import names_parser, parse_shapes, parse_threads  # noqa: E402

SQUARE = [(s, s, s) for s in (256, 512, 1024, 2048)]
TRANSFORMER = [(m, n, k) for m in (1, 16, 128, 512) for n, k in ((3072, 768), (768, 3072), (4096, 4096))]
DEFAULT_SHAPES = SQUARE + TRANSFORMER
QUICK_SHAPES = [(256, 256, 256), (1, 3072, 768), (128, 768, 3072)]
DEFAULT_PROVIDERS = ["tvm-lowprec", "tvm-lowprec-int8w", "ort-qlinearmatmul", "ort-matmulinteger", "torch-qlinear", "torch-int-mm",
                     "numpy-fp32"]

PEAK_DIR = Path(__file__).resolve().parent / "peak"
# intrinsic row -> (peak program, the label of its figure in the program's output)
PEAK_PROGRAMS = {
    "vpmaddubsw_ymm": ("peak_avx2.c", "vpmaddubsw ymm"),
    "vpmaddwd_ymm": ("peak_avx2.c", "vpmaddwd ymm"),
    "vpdpbusd_zmm": ("peak_vnni.c", "vpdpbusd zmm"),
    "vpdpbusd_ymm": ("peak_vnni.c", "vpdpbusd ymm"),
}
# peak program -> the compiler flags it needs
PEAK_FLAGS = {
    "peak_avx2.c": ["-mavx2"],
    "peak_vnni.c": ["-mavx512f", "-mavx512vl", "-mavx512vnni"],
    "read_bw.c": ["-mavx2", "-pthread"],
}


def _compile_and_run(source: str, args: list[str]) -> str:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise SystemExit("--measure-peak needs gcc")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "peak"
        subprocess.run([compiler, "-O2", *PEAK_FLAGS[source], "-pthread", str(PEAK_DIR / source), "-o", str(exe)],
                       check=True)
        return subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout


def measure_gemm_peak(reps: int = 3) -> tuple[float, str]:
    """``(GOPS, description)``: the best of ``reps`` one-thread runs of the peak program for the host
    row's first recipe (the one 7-bit weights take). ``SystemExit`` without a program for it or gcc."""
    from tvm_lowprec.targets import native_target

    intrin = native_target().recipes()[0].intrin.name
    if intrin not in PEAK_PROGRAMS:
        raise SystemExit(f"no peak program for {intrin}; pass --peak-gops")
    source, label = PEAK_PROGRAMS[intrin]
    out = _compile_and_run(source, ["1", str(reps)])
    peak = max(float(x) for x in re.findall(rf"{re.escape(label)}: ([\d.]+) GOPS", out))
    return peak, f"measured: best of {reps} runs of peak/{source}, {label}"


def measure_peak(shapes, reps: int = 3) -> tuple[float, float, str]:
    """``(GOPS, GB/s, description)``: :func:`measure_gemm_peak`, and the best of ``reps`` runs of
    ``peak/read_bw.c`` over as many bytes as the largest int8 weights of ``shapes`` (the memory side of
    the roofline)."""
    peak, source = measure_gemm_peak(reps)
    mib = max(n * k for _, n, k in shapes) / 2**20
    bandwidth = max(float(x) for x in re.findall(r"([\d.]+) GB/s", _compile_and_run("read_bw.c", [f"{mib:.3f}", str(reps)])))
    return peak, bandwidth, (f"{source}; read bandwidth: "
                             f"peak/read_bw.c over {mib:.1f} MiB, the largest weights of the grid")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 shapes and shorter timing")
    parser.add_argument("--providers", type=names_parser(bench.PROVIDERS, "provider"), default=DEFAULT_PROVIDERS,
                        help=f"comma-separated, in column order (default: {','.join(DEFAULT_PROVIDERS)})")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2], help="comma-separated (default: 1,2)")
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="comma-separated MxNxK list (default: the full grid, or the quick subset)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/matmul"), help="output folder")
    parser.add_argument("--peak-gops", type=float, default=None,
                        help="peak GOPS of one thread; adds a %% of peak column")
    parser.add_argument("--measure-peak", action="store_true",
                        help="measure one thread's peak (peak/peak_avx2.c, the host's first recipe) and read "
                             "bandwidth (peak/read_bw.c); adds %% of peak and the roofline prediction")
    parser.add_argument("--predict", action=argparse.BooleanOptionalAction, default=True,
                        help="add llvm-mca predictions (tvm_lowprec.perfmodel; default on)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input data")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    grid = bench.Benchmark(name="Quantized GEMM (uint8 x int8)" + (" — quick" if args.quick else ""),
                           shapes=tuple(shapes), providers=tuple(args.providers), threads=tuple(args.threads))
    timing = bench.QUICK_TIMING if args.quick else bench.DEFAULT_TIMING
    peak, bandwidth, source = args.peak_gops, None, "given" if args.peak_gops else ""
    if args.measure_peak:
        peak, bandwidth, source = measure_peak(shapes)
        print(f"peak: {peak:.1f} GOPS per thread, read {bandwidth:.1f} GB/s ({source})", file=sys.stderr)
    bench.run_benchmark(grid, args.out, peak_gops=peak, timing=timing, seed=args.seed, predict=args.predict,
                        peak_source=source, read_gbs=bandwidth)
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
