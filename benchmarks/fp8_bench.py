#!/usr/bin/env python
"""FP8 weights with a float32 matmul: tvm-lowprec's float8-weight kernel against the same layer with
float32 weights (compiled by tvm-lowprec, and run by ONNX Runtime), 1 and 2 threads.

Examples
--------
python benchmarks/fp8_bench.py                    # M = 1, 16 x N = K = 4096, e4m3fn, 1 and 2 threads
python benchmarks/fp8_bench.py --quick            # shorter timing (a slow point: one call)
python benchmarks/fp8_bench.py --formats e4m3fn,e5m2 --shapes 1x4096x4096 --threads 1 --out /tmp/fp8

Every point builds ``DequantizeLinear(W_fp8 [K, N], per-column scale) -> MatMul(x, W)`` and the same
layer with the dequantized weights stored as float32 (``MatMul(x, W_f32)``: the numbers are identical).
Providers: ``tvm-lowprec-fp8`` (the fp8 model on the float32 path: weights kept as bytes, widened in
registers), ``tvm-lowprec-fp8-bf16`` (the fp8 model on the bf16 GEMM: weights widened to bf16 at
compile time, activations rounded to bf16, ``vdpbf16ps``; only on a host with AVX512_BF16, where
``native`` has the bf16 recipe: elsewhere it would run emulated, whose times mean nothing, so the
column is left out and the report says so), ``tvm-lowprec-fp32`` (the float32 model through
tvm-lowprec: a plain float matmul, which its rules do not schedule today), ``ort-fp32`` (ONNX Runtime
on the float32 model). Each output is checked against numpy (float64; for the bf16 provider with the
activations rounded to bf16 first, the arithmetic it implements) first; the providers of a point are then timed interleaved, so a busy phase of a shared
machine hits them alike, each with its default thread policy and the previous one's workers asleep
(``tvm_lowprec.bench.quiesce``). Output: ``results.csv``, ``results.json`` and ``report.md`` in ``--out``
(default ``benchmarks/results/fp8``).
"""

from __future__ import annotations

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from tvm_lowprec.bench.cli_args import parse_threads  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, load_average  # noqa: E402
from tvm_lowprec.bench.providers import ort_errors, ort_session  # noqa: E402
from tvm_lowprec.bench.quiesce import thread_policy  # noqa: E402
from tvm_lowprec.bench.report import write_csv, write_json  # noqa: E402
from tvm_lowprec.bench.timing import Timing, compiled_loop, measure_interleaved, wall_loop  # noqa: E402

Shape = tuple[int, int, int]
DEFAULT_SHAPES: tuple[Shape, ...] = ((1, 4096, 4096), (16, 4096, 4096))
DEFAULT_OUT = HERE / "results" / "fp8"
TIMINGS = {"full": Timing(min_time=0.2, repeat=7, budget=5.0), "quick": Timing(min_time=0.05, repeat=3, budget=0.5)}
FORMATS = {"e4m3fn": "FLOAT8E4M3FN", "e5m2": "FLOAT8E5M2"}
CHECK_LIMIT = 1e-4  # max|err| / max|ref|: float32 sums in another order than numpy's float64 one
FIELDS = ("threads", "M", "N", "K", "format", "provider", "status", "ms", "gflops", "weight_bytes", "weight_gbs",
          "vs_tvm_fp32", "vs_ort_fp32", "check_error", "number", "repeat", "slow", "kernels", "reason")


# ---------------------------------------------------------------- models and data

@dataclass(frozen=True)
class Problem:
    """One point's data: fp8 weight bytes, per-column scale, the float32 weights they stand for, x."""

    fmt: str
    x: np.ndarray
    w_bytes: np.ndarray
    scale: np.ndarray

    @property
    def w_float(self) -> np.ndarray:
        import ml_dtypes

        mdt = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[self.fmt]
        return (self.w_bytes.view(mdt).astype(np.float32) * self.scale).astype(np.float32)

    def reference(self, bf16: bool = False) -> np.ndarray:
        """float64 ``x @ W``; ``bf16``: with ``x`` rounded to bf16 first (what the bf16 GEMM multiplies)."""
        x = self.x
        if bf16:
            from tvm_lowprec.kernels.bf16_gemm import bf16_to_float32, round_to_bf16

            x = bf16_to_float32(round_to_bf16(x))
        return x.astype(np.float64) @ self.w_float.astype(np.float64)


def make_problem(shape: Shape, fmt: str, seed: int) -> Problem:
    import ml_dtypes

    m, n, k = shape
    rng = np.random.default_rng([seed, m, n, k])
    mdt = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    w = (rng.standard_normal((k, n)) * 64).clip(-440, 440).astype(mdt).view(np.uint8)  # a spread of exponents
    scale = (rng.uniform(0.5, 1.5, n) / (64 * math.sqrt(k))).astype(np.float32)
    return Problem(fmt, rng.standard_normal((m, k)).astype(np.float32), w, scale)


def _graph(problem: Problem, nodes, inits):
    from onnx import TensorProto, helper

    m, k = problem.x.shape
    n = problem.w_bytes.shape[1]
    graph = helper.make_graph(nodes, "fp8_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def fp8_model(problem: Problem):
    from onnx import TensorProto, helper, numpy_helper

    k, n = problem.w_bytes.shape
    w = helper.make_tensor("w", getattr(TensorProto, FORMATS[problem.fmt]), [k, n], problem.w_bytes.tobytes(), raw=True)
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=1), helper.make_node("MatMul", ["x", "wd"], ["y"])]
    return _graph(problem, nodes, [w, numpy_helper.from_array(problem.scale, "s")])


def fp32_model(problem: Problem):
    from onnx import helper, numpy_helper

    return _graph(problem, [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(problem.w_float, "w")])


# ---------------------------------------------------------------- providers

@dataclass(frozen=True)
class Runner:
    run: Callable[[], np.ndarray]
    loop: Callable[[int], float]
    weight_bytes: int
    kernels: str = ""
    bf16: bool = False  # the activations are rounded to bf16: checked against that reference


def _native(bf16: bool):
    """This host's row with its bf16 recipe (where it has one), or without it (the float32 path)."""
    spec = tvm_lowprec.native_target()
    return spec if bf16 else dataclasses.replace(spec, bf16=None)


def _tvm(model, problem: Problem, threads: int, weight_bytes: int, bf16: bool = False) -> Runner:
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=_native(bf16), num_threads=threads)
    kernels = "; ".join(f"{k.name} [{k.schedule}]" for k in compiled.kernels() if k.op not in ("reshape",))
    return Runner(lambda: compiled(problem.x)[0], compiled_loop(compiled, problem.x), weight_bytes, kernels, bf16)


def _ort(model, problem: Problem, threads: int, weight_bytes: int) -> Runner:
    session = ort_session(model, threads)
    binding = session.io_binding()
    binding.bind_cpu_input("x", problem.x)
    binding.bind_output("y")
    return Runner(lambda: session.run(None, {"x": problem.x})[0], wall_loop(lambda: session.run_with_iobinding(binding)),
                  weight_bytes)


PROVIDERS: dict[str, Callable[[Problem, int], Runner]] = {
    "tvm-lowprec-fp8": lambda p, t: _tvm(fp8_model(p), p, t, p.w_bytes.size),
    "tvm-lowprec-fp32": lambda p, t: _tvm(fp32_model(p), p, t, 4 * p.w_bytes.size),
    "ort-fp32": lambda p, t: _ort(fp32_model(p), p, t, 4 * p.w_bytes.size),
}
# the bf16 GEMM (vdpbf16ps, 2 bytes a weight) where this host runs it natively; elsewhere it would run
# emulated, and an emulated build is never timed
HAS_BF16 = _native(True).bf16 is not None
if HAS_BF16:
    PROVIDERS["tvm-lowprec-fp8-bf16"] = lambda p, t: _tvm(fp8_model(p), p, t, 2 * p.w_bytes.size, bf16=True)


def point_errors() -> tuple[type[BaseException], ...]:
    return ort_errors() + (tvm_lowprec.LowPrecError, RuntimeError, ValueError, ImportError, MemoryError)


# ---------------------------------------------------------------- one point

def bench_point(shape: Shape, fmt: str, threads: int, timing: Timing, seed: int, log) -> list[dict]:
    m, n, k = shape
    problem = make_problem(shape, fmt, seed)
    refs = {False: problem.reference(), True: problem.reference(bf16=True) if HAS_BF16 else None}
    rows, runners = {}, {}
    for name, make in PROVIDERS.items():
        row = {"threads": threads, "M": m, "N": n, "K": k, "format": fmt, "provider": name, "status": "ok",
               "ms": math.nan, "gflops": math.nan, "weight_bytes": 0, "weight_gbs": math.nan, "vs_tvm_fp32": math.nan,
               "vs_ort_fp32": math.nan, "check_error": math.nan, "number": 0, "repeat": 0, "slow": False,
               "kernels": "", "reason": ""}
        try:
            runner = make(problem, threads)
            ref = refs[runner.bf16]
            error = float(np.abs(runner.run() - ref).max() / np.abs(ref).max())
        except point_errors() as err:
            rows[name] = {**row, "status": "error", "reason": f"{type(err).__name__}: {str(err).strip()[:300]}"}
            continue
        rows[name] = {**row, "weight_bytes": runner.weight_bytes, "check_error": error, "kernels": runner.kernels}
        if not error <= CHECK_LIMIT:
            rows[name].update(status="mismatch", reason=f"max|err| / max|ref| = {error:.3g} > {CHECK_LIMIT:g}")
        runners[name] = runner
    for name, t in measure_interleaved({key: r.loop for key, r in runners.items()}, timing, quiesce=True).items():
        rows[name].update(ms=t.seconds * 1e3, gflops=2.0 * m * n * k / t.seconds / 1e9, number=t.number, repeat=t.repeat,
                          weight_gbs=rows[name]["weight_bytes"] / t.seconds / 1e9,
                          slow=t.number == t.repeat == 1 and t.seconds >= (timing.budget or math.inf))
    for row in rows.values():
        for peer, column in (("tvm-lowprec-fp32", "vs_tvm_fp32"), ("ort-fp32", "vs_ort_fp32")):
            if peer in rows and row["provider"] != peer:
                row[column] = rows[peer]["ms"] / row["ms"]
        log(f"[t={threads}] {m}x{n}x{k} {fmt:7s} {row['provider']:18s} {row['status']:8s} "
            + (f"{row['ms']:9.3f} ms" if math.isfinite(row["ms"]) else row["reason"][:120]))
    del runners
    gc.collect()
    return list(rows.values())


# ---------------------------------------------------------------- report

def _num(value, digits=2, suffix=""):
    return f"{value:.{digits}f}{suffix}" if isinstance(value, (int, float)) and math.isfinite(value) else "—"


def _header(meta: dict) -> list[str]:
    cpu, timing = meta["host"]["cpu"], meta["timing"]
    return [
        f"# FP8 weights, float32 matmul: tvm-lowprec fp8 kernel vs float32 weights ({meta['mode']})", "",
        (f"- date: {meta['date']}; host: {cpu.get('model', '?')} ({cpu.get('logical_cpus', '?')} logical CPUs); "
         f"LLVM host CPU {meta['target']['llvm_host_cpu']}"),
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items() if v)}",
        (f"- load average (1/5/15 min) at start {meta['loadavg_start']}, at end {meta['loadavg_end']} (other work on "
         "these cores distorts the figures, 2 threads most)"),
        f"- command: `{meta['command']}`",
        ("- providers: **tvm-lowprec-fp8**: DequantizeLinear(fp8 W, per-column scale) -> MatMul, weights kept as "
         "bytes; tvm-lowprec-fp32: the same layer with float32 weights through tvm-lowprec (a float matmul its rules "
         "do not schedule); ort-fp32: ONNX Runtime CPU on the float32 model; tvm-lowprec-fp8-bf16: the fp8 layer on "
         "the bf16 GEMM (vdpbf16ps, activations rounded to bf16, checked against that arithmetic) "
         + ("(this host has AVX512_BF16)" if HAS_BF16 else "(left out: this host lacks AVX512_BF16, and an emulated "
            "build is not timed)")),
        (f"- timing: median of {timing['repeat']} interleaved rounds of >= {timing['min_time']} s; a provider whose "
         f"first call takes >= {timing['budget']} s is timed by that one call. Weight GB/s = stored weight bytes (1 "
         "per fp8 weight, 2 widened to bf16, 4 per float32) / seconds. Speedups: the other provider's time / this one's."),
        f"- check: max|err| / max|ref| against numpy float64, limit {CHECK_LIMIT:g}", "",
    ]


def _check_cell(row: dict) -> str:
    if row["status"] == "error":
        return "error"
    return f"{row['status']} {row['check_error']:.1e}"


def _table(rows: list[dict], threads: int) -> list[str]:
    lines = [f"## threads = {threads}", "",
             "| M×N×K | format | provider | ms | GFLOP/s | weight GB/s | vs tvm-lowprec fp32 | vs ORT fp32 | check |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in (r for r in rows if r["threads"] == threads):
        name = f"**{r['provider']}**" if r["provider"].startswith("tvm-lowprec-fp8") else r["provider"]
        ms = _num(r["ms"], 3) + (" (1 call)" if r["slow"] else "")
        lines.append(f"| {r['M']}x{r['N']}x{r['K']} | {r['format']} | {name} | {ms} | {_num(r['gflops'], 1)} | "
                     f"{_num(r['weight_gbs'], 1)} | {_num(r['vs_tvm_fp32'], 2, 'x')} | {_num(r['vs_ort_fp32'], 2, 'x')} | "
                     f"{_check_cell(r)} |")
    return lines + [""]


def render_report(rows: list[dict], meta: dict) -> str:
    lines = _header(meta)
    for threads in sorted({r["threads"] for r in rows}):
        lines += _table(rows, threads)
    kernels = sorted({(r["provider"], r["kernels"]) for r in rows if r["kernels"]})
    lines += ["## Kernels (name [schedule: a rule's, or none])", ""] + [f"- {p}: {k}" for p, k in kernels] + [""]
    notes = [f"- {r['provider']} {r['M']}x{r['N']}x{r['K']} t={r['threads']}: {r['reason']}" for r in rows if r["reason"]]
    return "\n".join(lines + (["## Notes", ""] + notes + [""] if notes else []))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing")
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in DEFAULT_SHAPES), help="MxNxK,...")
    parser.add_argument("--formats", default="e4m3fn", help=f"comma-separated, of {sorted(FORMATS)}")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    formats = args.formats.split(",")
    if any(f not in FORMATS for f in formats) or any(len(s) != 3 for s in shapes):
        parser.error(f"formats must be of {sorted(FORMATS)}, shapes MxNxK")
    mode = "quick" if args.quick else "full"
    start_load = load_average()
    rows = [row for threads in args.threads for shape in shapes for fmt in formats
            for row in bench_point(shape, fmt, threads, TIMINGS[mode], args.seed, print)]
    timing = TIMINGS[mode]
    meta = collect_metadata(benchmark="fp8_weights", mode=mode, loadavg_start=start_load, shapes=shapes, formats=formats,
                            threads=args.threads, command="python benchmarks/fp8_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
                            timing={"min_time": timing.min_time, "repeat": timing.repeat, "budget": timing.budget},
                            thread_policy=thread_policy())
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "results.csv", fields=FIELDS)
    write_json(rows, meta, args.out / "results.json")
    report = render_report(rows, meta)
    (args.out / "report.md").write_text(report)
    print(report)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
