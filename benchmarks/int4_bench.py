#!/usr/bin/env python
"""INT4 weight-only GEMV/GEMM: tvm-lowprec against ONNX Runtime's com.microsoft.MatMulNBits, 1 and 2 threads.

Examples
--------
python benchmarks/int4_bench.py                   # 3 shapes x 5 providers x 1, 2 threads
python benchmarks/int4_bench.py --quick           # shorter timing (a slow point: one call)
python benchmarks/int4_bench.py --selftest        # tiny shapes, 1 thread: outputs checked, exit 1 on failure
python benchmarks/int4_bench.py --threads 1 --shapes 1x4096x4096 --block-size 128 --out /tmp/int4

Every point (shape x thread count) builds one MatMulNBits model (4-bit weights, float32 scales, 4-bit zero
points by default) and an int8 QDQ model over the same input, checks each provider's first output
against a numpy reference, then times the providers interleaved. The read bandwidth of this host
(``peak/read_bw.c``) is measured over as many bytes as each row's weights, at each thread count, so a
row's "% of read bandwidth" compares it with streaming the same bytes. Output: ``results.csv``,
``results.json``, ``report.md`` and ``report.png`` in ``--out`` (default ``benchmarks/results/int4``).
"""

from __future__ import annotations

import os

import argparse  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # model_bench (git_revision) beside this file
try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from model_bench import LOWPREC_ROOT, git_revision  # noqa: E402
from tvm_lowprec.bench.cli_args import names_parser, parse_shapes, parse_threads  # noqa: E402
from tvm_lowprec.bench.grid import POINT_ERRORS  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, load_average  # noqa: E402
from tvm_lowprec.bench.nbits import (  # noqa: E402
    INT4_DATA, INT8_DATA, Int8Problem, NBitsProblem, int8_weight_bytes, make_int8_problem, make_nbits_problem,
    matmul_nbits_model, nbits_weight_bytes, qdq_matmul_model,
)
from tvm_lowprec.bench.providers import describe_compiled, ort_errors, ort_runner, ort_session  # noqa: E402
from tvm_lowprec.bench.quiesce import thread_policy  # noqa: E402
from tvm_lowprec.bench.report import json_safe, write_csv, write_json, write_latency_plot  # noqa: E402
from tvm_lowprec.bench.timing import Timing, compiled_loop, measure_interleaved, wall_loop  # noqa: E402

Shape = tuple[int, int, int]
DEFAULT_SHAPES: tuple[Shape, ...] = ((1, 4096, 4096), (1, 11008, 4096), (16, 4096, 4096))
SELFTEST_SHAPES: tuple[Shape, ...] = ((1, 256, 256), (4, 128, 256))
DEFAULT_OUT = HERE / "results" / "int4"
READ_BW = HERE / "peak" / "read_bw.c"
ENVIRONMENT = ("TVM_THREAD_POOL_SPIN_COUNT", "OMP_WAIT_POLICY", "TVM_NUM_THREADS")

# Each point: an inner loop of >= min_time s, median of `repeat` interleaved rounds; a provider whose
# first timed call takes `budget` s or more is measured by that one call (the unscheduled paths: seconds).
TIMINGS = {
    "full": Timing(min_time=0.2, repeat=7, budget=5.0),
    "quick": Timing(min_time=0.05, repeat=3, budget=0.5),
    "selftest": Timing(min_time=0.002, repeat=1, budget=0.5),
}
BANDWIDTH_REPS = {"full": 3, "quick": 2, "selftest": 1}


# ---------------------------------------------------------------- providers and checks

@dataclass(frozen=True)
class Check:
    """How a provider's output is compared with its numpy reference: ``error(out, ref, step) <= limit``."""

    name: str
    limit: float
    error: Callable[[np.ndarray, np.ndarray, float], float]


def _max_rel(out, ref, step):
    return float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def _l2_rel(out, ref, step):
    return float(np.linalg.norm(out - ref) / max(float(np.linalg.norm(ref)), 1e-30))


def _steps(out, ref, step):
    return float(np.abs(out - ref).max() / step)


CHECKS = {
    # float32 sums in another order than numpy's float64 one: a few ulps of the largest output
    "float": Check("max|err| / max|ref|", 1e-4, _max_rel),
    # activations rounded to int8 per K block (max|x| / 127): about 0.3-0.5 % of the output's norm
    "int8-act": Check("‖err‖ / ‖ref‖", 0.02, _l2_rel),
    # requantized uint8 output: a tie may round the other way (float32 requant vs the float64 reference)
    "uint8-out": Check("max|err| in output steps", 1.0 + 1e-3, _steps),
}


@dataclass(frozen=True)
class Provider:
    """One column of the benchmark.

    Attributes
    ----------
    key : str
        Name in the CSV and on the command line.
    label : str
        Name in the report.
    runtime : {"ort", "tvm"}
        Which :data:`PREPARERS` entry builds it.
    weights : {"int4", "int8"}
        The model it runs (MatMulNBits or the int8 QDQ model) and so the weight bytes it is charged.
    activations : {"float", "int8"}
        ORT's ``accuracy_level`` 0 / 4, tvm-lowprec's ``WeightOnlyConfig(activations=...)``.
    check : str
        Key of :data:`CHECKS`.
    peer : str or None
        The ORT provider at the same accuracy (the "vs ORT" ratio).
    """

    key: str
    label: str
    runtime: str
    weights: str
    activations: str
    check: str
    peer: str | None = None

    @property
    def accuracy_level(self) -> int:
        return {"float": 0, "int8": 4}[self.activations]


PROVIDERS = (
    Provider("ort-nbits-acc0", "ORT MatMulNBits acc0 (float act)", "ort", "int4", "float", "float"),
    Provider("ort-nbits-acc4", "ORT MatMulNBits acc4 (int8 act)", "ort", "int4", "int8", "int8-act"),
    Provider("tvm-lowprec-int4-float", "tvm-lowprec int4 (float act)", "tvm", "int4", "float", "float",
             peer="ort-nbits-acc0"),
    Provider("tvm-lowprec-int4-int8", "tvm-lowprec int4 (int8 act)", "tvm", "int4", "int8", "int8-act",
             peer="ort-nbits-acc4"),
    Provider("tvm-lowprec-int8", "tvm-lowprec int8 (QDQ, integer GEMM)", "tvm", "int8", "int8", "uint8-out"),
)
BY_KEY = {p.key: p for p in PROVIDERS}
INT8_BASELINE = "tvm-lowprec-int8"


@dataclass(frozen=True)
class Problems:
    """The data of one point: the MatMulNBits problem and the int8 QDQ problem on the same input."""

    int4: NBitsProblem
    int8: Int8Problem

    def of(self, provider: Provider) -> NBitsProblem | Int8Problem:
        return self.int4 if provider.weights == "int4" else self.int8


def weight_bytes(provider: Provider, shape: Shape, block: int, zero_points: bool) -> int:
    """The bytes ``provider``'s weights take as stored (what its "weight GB/s" is charged)."""
    _, n, k = shape
    return nbits_weight_bytes(n, k, block, zero_points) if provider.weights == "int4" else int8_weight_bytes(n, k)


def make_problems(shape: Shape, block: int, seed: int, zero_points: bool, seven_bit: bool) -> Problems:
    m, n, k = shape
    rng = np.random.default_rng([seed, m, n, k, block])  # the same data at every thread count
    int4 = make_nbits_problem(m, n, k, block, rng, zero_points=zero_points)
    return Problems(int4, make_int8_problem(int4.x, n, rng, seven_bit=seven_bit))


@dataclass(frozen=True)
class Runner:
    """A prepared provider: ``run()`` returns its output; ``loop(number)`` seconds per call."""

    run: Callable[[], np.ndarray]
    loop: Callable[[int], float]
    timer: str
    target: str = ""
    kernels: str = ""


def prepare_ort(provider: Provider, problems: Problems, threads: int) -> Runner:
    problem = problems.of(provider)
    session = ort_session(matmul_nbits_model(problem, provider.accuracy_level), threads)
    return Runner(run=lambda: session.run(None, {"A": problem.x})[0], loop=wall_loop(ort_runner(session, problem.x)),
                  timer="wall clock (session.run_with_iobinding)", target="onnxruntime CPUExecutionProvider")


def _tvm_model(provider: Provider, problems: Problems):
    if provider.weights == "int8":
        return qdq_matmul_model(problems.int8), None
    return matmul_nbits_model(problems.int4), tvm_lowprec.WeightOnlyConfig(activations=provider.activations)


def prepare_tvm(provider: Provider, problems: Problems, threads: int) -> Runner:
    model, weight_only = _tvm_model(provider, problems)
    options = {} if weight_only is None else {"weight_only": weight_only}
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", num_threads=threads, **options)
    x = problems.of(provider).x
    kernels = "; ".join(f"{k.name} [{k.intrinsic}, {k.schedule}]" for k in compiled.kernels())
    return Runner(run=lambda: compiled(x)[0], loop=compiled_loop(compiled, x),
                  timer="TVM time_evaluator (single calls: wall clock)", target=describe_compiled(compiled),
                  kernels=kernels)


PREPARERS = {"ort": prepare_ort, "tvm": prepare_tvm}


def point_errors() -> tuple[type[BaseException], ...]:
    """What preparing or running one provider may raise (recorded as the row's reason)."""
    return POINT_ERRORS + ort_errors() + (tvm_lowprec.LowPrecError, KeyError, IndexError, AssertionError)


# ---------------------------------------------------------------- one point

def _error_text(err: BaseException, limit: int = 400) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = (lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}") if lines else "(no message)"
    return f"{type(err).__name__}: {text}"[:limit]


def _base_row(provider: Provider, problems: Problems, threads: int, block: int) -> dict:
    m, n, k = problems.int4.shape
    return {"threads": threads, "M": m, "N": n, "K": k, "block_size": block, "provider": provider.key,
            "label": provider.label, "status": "ok", "ms": math.nan, "seconds": math.nan, "gflops": math.nan,
            "weight_bytes": problems.of(provider).weight_bytes(), "weight_gbs": math.nan, "read_gbs": math.nan,
            "pct_read_bw": math.nan, "vs_ort": math.nan, "vs_ort_provider": provider.peer or "",
            "vs_int8": math.nan, "check": CHECKS[provider.check].name, "check_error": math.nan,
            "check_limit": CHECKS[provider.check].limit, "timer": "", "number": 0, "repeat": 0, "slow": False,
            "setup_s": math.nan, "warm_s": math.nan, "target": "", "kernels": "", "reason": ""}


def prepare_provider(provider: Provider, problems: Problems, threads: int, row: dict, refs: dict):
    """Build, run once and check ``provider``: ``(runner or None, row)``."""
    try:
        start = time.perf_counter()
        runner = PREPARERS[provider.runtime](provider, problems, threads)
        setup = time.perf_counter() - start
        start = time.perf_counter()
        out = np.asarray(runner.run(), np.float64)
        warm = time.perf_counter() - start
    except point_errors() as err:
        return None, {**row, "status": "error", "reason": _error_text(err)}
    check = CHECKS[provider.check]
    ref, step = refs[provider.weights]
    error = check.error(out, ref, step) if out.shape == ref.shape else math.inf
    row = {**row, "setup_s": round(setup, 3), "warm_s": round(warm, 4), "check_error": error, "timer": runner.timer,
           "target": runner.target, "kernels": runner.kernels}
    if not error <= check.limit:
        why = f"shape {out.shape} != {ref.shape}" if out.shape != ref.shape else f"{check.name} = {error:.3g}"
        row.update(status="mismatch", reason=f"output check failed: {why} > {check.limit:g}")
    return runner, row


def bench_point(shape: Shape, threads: int, providers, args, timing: Timing, log) -> list[dict]:
    """Every provider at one (shape, threads): prepared and checked one by one, then timed interleaved."""
    problems = make_problems(shape, args.block_size, args.seed, args.zero_points, args.int8_weights == "7bit")
    refs = {"int4": (problems.int4.reference(), 0.0), "int8": (problems.int8.reference(), problems.int8.y_scale)}
    runners, rows = {}, {}
    for provider in providers:
        runner, rows[provider.key] = prepare_provider(provider, problems, threads,
                                                      _base_row(provider, problems, threads, args.block_size), refs)
        if runner is not None:
            runners[provider.key] = runner
    try:
        timed = measure_interleaved({key: r.loop for key, r in runners.items()}, timing, quiesce=True)
    except point_errors() as err:
        timed = {}
        for key in runners:
            rows[key].update(status="error", reason=f"timing failed: {_error_text(err)}")
    m, n, k = shape
    for key, t in timed.items():
        rows[key].update(seconds=t.seconds, ms=t.seconds * 1e3, gflops=2.0 * m * n * k / t.seconds / 1e9,
                         weight_gbs=rows[key]["weight_bytes"] / t.seconds / 1e9, number=t.number,
                         repeat=t.repeat, slow=t.number == t.repeat == 1 and t.seconds >= (timing.budget or math.inf))
    del runners
    gc.collect()  # drop sessions, compiled modules and their pools before the next point
    for row in rows.values():
        log(f"[t={threads}] {m}x{n}x{k} {row['label']:40s} {row['status']:8s} "
            + (f"{row['ms']:9.3f} ms" if math.isfinite(row["ms"]) else row["reason"][:120]))
    return list(rows.values())


def add_ratios(rows: list[dict], bandwidth: dict) -> None:
    """Fill the columns that compare rows of one point: vs ORT at the same accuracy, vs tvm-lowprec int8,
    and % of the read bandwidth measured over the row's weight bytes at its thread count."""
    seconds = {(r["threads"], r["M"], r["N"], r["K"], r["provider"]): r["seconds"] for r in rows}
    for r in rows:
        point = (r["threads"], r["M"], r["N"], r["K"])
        peer = seconds.get((*point, r["vs_ort_provider"]), math.nan)
        r["vs_ort"] = peer / r["seconds"] if r["vs_ort_provider"] else math.nan
        int8 = seconds.get((*point, INT8_BASELINE), math.nan)
        r["vs_int8"] = int8 / r["seconds"] if BY_KEY[r["provider"]].weights == "int4" else math.nan
        r["read_gbs"] = bandwidth.get((r["weight_bytes"], r["threads"]), {}).get("gbs", math.nan)
        r["pct_read_bw"] = 100.0 * r["weight_gbs"] / r["read_gbs"]


# ---------------------------------------------------------------- read bandwidth (peak/read_bw.c)

def compile_read_bw(folder: Path) -> Path:
    """``peak/read_bw.c`` built as ``matmul_grid.py --measure-peak`` builds it."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise OSError("no C compiler (gcc or cc) for peak/read_bw.c")
    exe = folder / "read_bw"
    subprocess.run([compiler, "-O2", "-mavx2", "-pthread", str(READ_BW), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    return exe


def read_bandwidth(exe: Path, nbytes: int, threads: int, reps: int) -> float:
    """GB/s of read_bw over ``nbytes`` read by ``threads`` threads of one process, each its contiguous
    share (as a parallel kernel's threads read their parts of the weights), a pass timed across all of
    them: the best repetition."""
    out = subprocess.run([str(exe), f"{nbytes / 2**20:.4f}", str(reps), str(threads)], capture_output=True, text=True)
    if out.returncode:
        raise OSError(f"read_bw exited with {out.returncode}: {out.stderr.strip()[:200]}")
    rates = [float(x) for x in re.findall(r"([\d.]+) GB/s", out.stdout)]
    if not rates:
        raise ValueError(f"unexpected read_bw output: {out.stdout!r}")
    return max(rates)


def measure_bandwidths(sizes: list[int], threads: list[int], reps: int, log) -> tuple[dict, str]:
    """``{(bytes, threads): {"gbs": ..., "mib": ...}}`` for every row size and thread count, and an error
    text (empty when measured)."""
    out = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe = compile_read_bw(Path(tmp))
            for nbytes in sorted(set(sizes)):
                for t in threads:
                    out[(nbytes, t)] = {"gbs": read_bandwidth(exe, nbytes, t, reps), "mib": nbytes / 2**20}
                    gbs = out[(nbytes, t)]["gbs"]
                    log(f"read bandwidth over {nbytes / 2**20:.2f} MiB, {t} thread(s): {gbs:.1f} GB/s")
    except (OSError, subprocess.CalledProcessError, ValueError) as err:
        return out, _error_text(err)
    return out, ""


# ---------------------------------------------------------------- report

def _num(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}f}{suffix}" if abs(value) < 1000 else f"{value:.0f}{suffix}"


def _ms(value) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _ratio(value) -> str:
    """``2.19x``; small ratios keep two significant digits (``0.0034x``), not ``0.00x``."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _check_cell(row: dict) -> str:
    if row["status"] in ("error", "skipped"):
        return row["status"]
    text = f"{row['check_error']:.1e}"
    return f"**MISMATCH** {text}" if row["status"] == "mismatch" else f"ok {text}"


def results_table(rows: list[dict], threads: int) -> list[str]:
    head = ["M×N×K", "provider", "ms", "GFLOP/s", "weights MiB", "weight GB/s", "read BW GB/s", "% of read BW",
            "speedup vs ORT (same act)", "speedup vs tvm-lowprec int8", "check (error)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 3) + "---|"]
    for r in (r for r in rows if r["threads"] == threads):
        label = f"**{r['label']}**" if r["provider"].startswith("tvm-lowprec-int4") else r["label"]
        cells = [f"{r['M']}x{r['N']}x{r['K']}", label, _ms(r["ms"]) + (" (1 call)" if r["slow"] else ""),
                 _num(r["gflops"], 1), _num(r["weight_bytes"] / 2**20, 2), _num(r["weight_gbs"], 1),
                 _num(r["read_gbs"], 1), _num(r["pct_read_bw"], 1, "%"), _ratio(r["vs_ort"]),
                 _ratio(r["vs_int8"]), _check_cell(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def bandwidth_table(bandwidth: dict, threads: list[int], error: str) -> list[str]:
    lines = ["## Read bandwidth of this host (`peak/read_bw.c`)", "",
             "Measured in this run over as many bytes as each row's weights (a buffer that fits in the caches "
             "is read from them, as a kernel's weights are when it is called repeatedly; the L3 is listed by "
             "`lscpu`). More than one thread: that many threads of one read_bw process, each over its share of "
             "the bytes, a pass timed across all of them (best of the repetitions).", ""]
    if error:
        lines += [f"Not measured: {error}", ""]
    sizes = sorted({nbytes for nbytes, _ in bandwidth})
    if not sizes:
        return lines
    lines += ["| weights MiB | " + " | ".join(f"{t} thread(s) GB/s" for t in threads) + " |",
              "|---:|" + "---:|" * len(threads)]
    for nbytes in sizes:
        cells = [_num(bandwidth.get((nbytes, t), {}).get("gbs"), 1) for t in threads]
        lines.append(f"| {nbytes / 2**20:.2f} | " + " | ".join(cells) + " |")
    return lines + [""]


def kernels_section(rows: list[dict]) -> list[str]:
    """What tvm-lowprec compiled each of its providers to (first point that built): the kernels, their
    tensor intrinsic (``none``: not tensorized) and schedule (``none``: no rule took it, loops as written)."""
    lines = ["## tvm-lowprec kernels", ""]
    for p in (p for p in PROVIDERS if p.runtime == "tvm"):
        row = next((r for r in rows if r["provider"] == p.key and r["kernels"]), None)
        if row is None:
            continue
        lines.append(f"- {p.label} (`{row['target']}`, {row['M']}x{row['N']}x{row['K']}): {row['kernels']}")
        if all(k.endswith(", none]") for k in row["kernels"].split("; ")):
            lines.append("  (no schedule rule took any of its kernels: loops as written, serial and scalar)")
    return lines + [""]


def notes(rows: list[dict]) -> list[str]:
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["reason"]:
            grouped.setdefault((r["label"], r["reason"]), []).append(f"{r['M']}x{r['N']}x{r['K']}@{r['threads']}t")
        if r["slow"]:
            grouped.setdefault((r["label"], "slow: timed by one call"), []).append(
                f"{r['M']}x{r['N']}x{r['K']}@{r['threads']}t")
    return [f"- {label} ({', '.join(where)}): {reason}" for (label, reason), where in grouped.items()]


def _header(meta: dict) -> list[str]:
    cpu, versions, run = meta["host"]["cpu"], meta["versions"], meta["run"]
    flags = ", ".join(f for f, on in cpu["flags"].items() if on) or "none"
    timing = run["timing"]
    return [
        "# INT4 weight-only GEMV/GEMM: tvm-lowprec vs ONNX Runtime MatMulNBits"
        + (f" ({run['mode']})" if run["mode"] != "full" else ""), "",
        f"- date: {meta['date']}; host: {cpu['model']} ({cpu['logical_cpus']} logical CPUs; {flags}); "
        f"LLVM host CPU {meta['target']['llvm_host_cpu']}",
        f"- tvm-lowprec {meta['tvm_lowprec']['version']} @ {meta['tvm_lowprec']['git']}; TVM {versions['tvm']}; "
        f"ONNX Runtime {versions['onnxruntime']}; onnx {versions['onnx']}; numpy {versions['numpy']}",
        f"- load average (1/5/15 min) at start {meta['loadavg_start']}, at end {meta['loadavg_end']} "
        "(other work on these cores distorts the figures, 2 threads most)",
        f"- MatMulNBits: bits 4, block_size {run['block_size']}, "
        f"{'asymmetric (4-bit zero points)' if run['zero_points'] else 'symmetric (no zero points: 8)'}; "
        f"int8 weights: {run['int8_weights']}",
        f"- data: {INT4_DATA}. int8 model: {INT8_DATA}",
        f"- timing: each point's providers timed interleaved (median of {timing['repeat']} rounds, each an inner "
        f"loop of ≥ {timing['min_time']} s); a provider whose first timed call takes ≥ {timing['budget']} s is "
        "timed by that one call. ORT: wall clock around `run_with_iobinding`; tvm-lowprec: TVM's time evaluator. "
        "Each runtime with its default thread policy (workers spin between calls), every loop started once the "
        "previous runtime's workers sleep (`tvm_lowprec.bench.quiesce`).",
        "- GFLOP/s = 2·M·N·K / median seconds. Weight GB/s = the bytes the format stores (int4: packed "
        "weights + float32 scales + packed zero points; int8: weights + float32 scales) / seconds, whatever "
        "the kernel actually reads (a float matmul of dequantized weights reads 8x the int4 bytes). "
        "Speedups: the other row's time / this row's time, same point (above 1: this row is faster); "
        "\"same act\": ORT acc0 for float activations, acc4 for int8 activations.",
        "- check: the first output against numpy (float64) — int4 float act: max|err| / max|ref| ≤ 1e-4; "
        "int8 act: ‖err‖ / ‖ref‖ ≤ 2% against the float reference; int8 QDQ: ≤ 1 output step against its "
        "own reference (ONNX rounding).", "",
    ]


def render_report(rows: list[dict], meta: dict) -> str:
    run = meta["run"]
    lines = _header(meta) + bandwidth_table(run["bandwidth_by_size"], run["threads"], run["bandwidth_error"])
    for t in run["threads"]:
        lines += [f"## threads = {t}", "", *results_table(rows, t), ""]
    lines += kernels_section(rows)
    extra = notes(rows)
    return "\n".join(lines + (["## Notes", "", *extra, ""] if extra else [])) + "\n"


CSV_FIELDS = ("threads", "M", "N", "K", "block_size", "provider", "label", "status", "ms", "gflops", "weight_bytes",
              "weight_gbs", "read_gbs", "pct_read_bw", "vs_ort", "vs_ort_provider", "vs_int8", "check",
              "check_error", "check_limit", "timer", "number", "repeat", "slow", "seconds", "setup_s", "warm_s",
              "target", "kernels", "reason")


def _json_meta(meta: dict) -> dict:
    """The metadata with the bandwidth table keyed by strings (JSON has no tuple keys)."""
    run = dict(meta["run"])
    run["bandwidth"] = [{"bytes": b, "threads": t, **v} for (b, t), v in run.pop("bandwidth_by_size").items()]
    return json_safe({**meta, "run": run})


def write_outputs(rows: list[dict], meta: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv", CSV_FIELDS)
    write_json(rows, _json_meta(meta), out / "results.json")
    report = render_report(rows, meta)
    plot_rows = [{"model": f"{r['M']}x{r['N']}x{r['K']}", "runtime": r["provider"], "threads": r["threads"],
                  "status": r["status"], "ms": r["ms"]} for r in rows]
    shapes = list(dict.fromkeys(p["model"] for p in plot_rows))
    labels = {p.key: p.label for p in PROVIDERS if any(r["provider"] == p.key for r in rows)}
    if write_latency_plot(plot_rows, shapes, labels, meta["run"]["threads"], out / "report.png"):
        report += "\n![ms per call, per shape and provider](report.png)\n"
    (out / "report.md").write_text(report)
    return report


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="shorter timing; a slow point is timed by one call")
    mode.add_argument("--selftest", action="store_true",
                      help="tiny shapes (1x256x256, 4x128x256), 1 thread, output checks; exit 1 if one fails")
    parser.add_argument("--threads", type=parse_threads, default=None,
                        help="comma-separated (default: 1,2; selftest: 1)")
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="comma-separated MxNxK (default: 1x4096x4096,1x11008x4096,16x4096x4096)")
    parser.add_argument("--block-size", type=int, default=32, help="MatMulNBits block_size (default 32)")
    parser.add_argument("--no-zero-points", dest="zero_points", action="store_false",
                        help="symmetric int4 weights: no zero-point input (default: 4-bit zero points)")
    parser.add_argument("--int8-weights", choices=("full", "7bit"), default="full",
                        help="int8 QDQ weights in [-127, 127] (default; AVX2: the exact vpmaddwd recipe) or 7-bit "
                             "[-64, 63] (proven not to saturate: the denser vpmaddubsw recipe)")
    parser.add_argument("--providers", type=names_parser(BY_KEY, "provider"), default=list(BY_KEY),
                        help=f"comma-separated (default: {','.join(BY_KEY)})")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: {DEFAULT_OUT.relative_to(HERE.parent)}; "
                             "selftest: a temporary one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data")
    return parser


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, mode: str) -> tuple[list[dict], dict]:
    """Measure the bandwidths, then every (threads, shape) point; return the rows and the metadata."""
    shapes = args.shapes or (SELFTEST_SHAPES if mode == "selftest" else DEFAULT_SHAPES)
    threads = args.threads or ([1] if mode == "selftest" else [1, 2])
    providers = [BY_KEY[key] for key in args.providers]
    timing, load_start, git_start = TIMINGS[mode], load_average(), git_revision(LOWPREC_ROOT)
    sizes = [weight_bytes(p, s, args.block_size, args.zero_points) for s in shapes for p in providers]
    bandwidth, bw_error = measure_bandwidths(sizes, threads, BANDWIDTH_REPS[mode], _log)
    rows = [row for t in threads for shape in shapes for row in bench_point(shape, t, providers, args, timing, _log)]
    add_ratios(rows, bandwidth)
    git_end = git_revision(LOWPREC_ROOT)
    meta = collect_metadata(
        benchmark="int4 weight-only GEMV/GEMM", loadavg_start=load_start,
        tvm_lowprec={"version": tvm_lowprec.__version__, "path": str(LOWPREC_ROOT),
                     "git": git_start if git_end == git_start else f"{git_start} at start, {git_end} at end"},
        environment={k: os.environ.get(k) for k in ENVIRONMENT},
        ort_session={"intra_op_num_threads": "threads", "inter_op_num_threads": 1, "graph_optimization_level":
                     "ORT_ENABLE_ALL (default)", "session.intra_op.allow_spinning": "default (on)"},
        thread_policy=thread_policy(),
        run={"mode": mode, "shapes": [list(s) for s in shapes], "threads": threads, "providers": args.providers,
             "labels": {p.key: p.label for p in providers}, "block_size": args.block_size,
             "zero_points": args.zero_points, "int8_weights": args.int8_weights, "seed": args.seed,
             "timing": asdict(timing), "checks": {k: {"metric": c.name, "limit": c.limit} for k, c in CHECKS.items()},
             "bandwidth_by_size": bandwidth, "bandwidth_error": bw_error,
             "bandwidth_source": "benchmarks/peak/read_bw.c (gcc -O2 -mavx2 -pthread), one thread per kernel thread"})
    return rows, meta


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mode = "selftest" if args.selftest else "quick" if args.quick else "full"
    out = args.out or (Path(tempfile.mkdtemp(prefix="int4_selftest_")) if mode == "selftest" else DEFAULT_OUT)
    rows, meta = run(args, mode)
    report = write_outputs(rows, meta, out)
    print(report)
    if mode != "selftest":
        return 0
    failed = [r for r in rows if r["status"] != "ok" or not math.isfinite(r["ms"])]
    for r in failed:
        _log(f"SELFTEST FAILED: {r['label']} {r['M']}x{r['N']}x{r['K']}: {r['status']} {r['reason']}")
    _log(f"selftest: {len(rows) - len(failed)}/{len(rows)} rows ok; outputs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
