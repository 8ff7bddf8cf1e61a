#!/usr/bin/env python
"""Reference models end to end: tvm-lowprec INT8 against ONNX Runtime INT8/FP32 and tvm-lowprec FP32, 1 and 2 threads.

Examples
--------
python benchmarks/model_bench.py                                  # every model of models/build.py, 1 and 2 threads
python benchmarks/model_bench.py --quick --models encoder --threads 1
python benchmarks/model_bench.py --quick --models textdet-decomposed --threads 1
python benchmarks/model_bench.py --models cnn,minilm --repeat 20 --out /tmp/models

The models are built (or downloaded) and quantized by ``benchmarks/models/build.py`` into its cache on
first use. Output: ``results.csv``, ``results.json``, ``report.md`` and ``report.png`` (latency per
model and runtime; with matplotlib) in ``--out``.

Four runtimes share this process and its cores, each timed with its default thread policy (TVM's and
ORT's workers spin between calls, as a user's do); before every timed loop the workers of the runtime
timed before it are let fall asleep (``tvm_lowprec.bench.quiesce``), so none competes with them.
"""

from __future__ import annotations

import os

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the ``models`` package beside this file
try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from models.build import (  # noqa: E402
    DEFAULT_CACHE, MODELS, BuiltModel, ModelSpec, ModelUnavailable, ensure_model, make_feed,
)
from tvm_lowprec.bench.hostinfo import collect_metadata, load_average  # noqa: E402
from tvm_lowprec.bench.cli_args import names_parser, parse_threads  # noqa: E402
from tvm_lowprec.bench.providers import ort_session  # noqa: E402
from tvm_lowprec.bench.quiesce import quiesce, thread_policy  # noqa: E402
from tvm_lowprec.bench.report import (format_bytes, json_safe, profile_figures, write_csv,  # noqa: E402
                                      write_latency_plot)
from tvm_lowprec.bench.bandwidth import copy_bandwidth  # noqa: E402

LOWPREC_ROOT = Path(tvm_lowprec.__file__).resolve().parents[1]  # the checkout actually imported

RUNTIMES = ("ort-int8", "ort-fp32", "tvm-lowprec-int8", "tvm-lowprec-fp32")
LABELS = {
    "ort-int8": "ORT INT8 (fused)",
    "ort-fp32": "ORT FP32",
    "tvm-lowprec-int8": "tvm-lowprec INT8",
    "tvm-lowprec-fp32": "tvm-lowprec FP32",
}
COSINE_OK = 0.9999
PERTURBATION = 1e-6  # relative input noise of the QDQ graph's sensitivity check (float inputs only)
PROFILE_TOP = 10
DEFAULT_OUT = HERE / "results" / "models"
CSV_FIELDS = ("model", "runtime", "threads", "status", "ms", "number", "repeat", "slow", "timer", "setup_s",
              "cos_vs_ort_int8_qdq", "max_abs_diff_vs_ort_int8_qdq", "cos_vs_ort_int8", "cos_vs_ort_fp32", "error")

# What a failing runtime may raise. TVM 0.27 maps its C++ errors to RuntimeError/ValueError/TypeError/
# IndexError/AttributeError (tvm_ffi), schedules raise ScheduleError (a RuntimeError).
TVM_ERRORS = (tvm_lowprec.LowPrecError, NotImplementedError, RuntimeError, ValueError, TypeError, KeyError,
              IndexError, AttributeError, AssertionError, MemoryError)


def ort_errors() -> tuple[type[BaseException], ...]:
    """ONNX Runtime's exception classes (they derive from Exception only) plus the usual Python ones."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoSuchFile", "NotImplemented",
             "RuntimeException", "EPFail", "EngineError")
    return tuple(getattr(state, n) for n in names if hasattr(state, n)) + (RuntimeError, ValueError, MemoryError)


# ---------------------------------------------------------------- timing

@dataclass(frozen=True)
class Timing:
    """How each runtime is timed: after a warm-up call, an inner loop of ``number`` calls sized to last
    ``min_time`` seconds, the median of ``repeat`` loops (interleaved between runtimes). A runtime whose warm call takes ``slow_s`` or
    more is timed by ``slow_repeat`` single calls."""

    repeat: int = 10
    min_time: float = 0.2
    slow_s: float = 1.0
    slow_repeat: int = 3
    profile_repeat: int = 5


DEFAULT_TIMING = Timing()
QUICK_TIMING = Timing(repeat=3, min_time=0.05, slow_s=0.5, slow_repeat=1, profile_repeat=2)


@dataclass(frozen=True)
class Runner:
    """A prepared runtime: ``run()`` returns the graph outputs in order; ``time(number, repeat)`` the
    median seconds per call."""

    run: Callable[[], list[np.ndarray]]
    time: Callable[[int, int], float]
    timer: str
    setup_s: float
    compiled: object = None  # the tvm_lowprec.Compiled, for profiling
    # tvm-lowprec: the kernels alone (TVM's time evaluator, no Python call), timed beside ``time``
    kernel_time: Callable[[int, int], float] | None = None


@dataclass(frozen=True)
class Timed:
    seconds: float
    number: int
    repeat: int
    slow: bool = False  # timed by single calls (the warm call took Timing.slow_s or more)
    kernel_seconds: float | None = None  # Runner.kernel_time's median, where the runner has one


def _wall(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def wall_clock_timer(fn: Callable[[], object]) -> Callable[[int, int], float]:
    def timer(number: int, repeat: int) -> float:
        return statistics.median(_wall(fn, number) / number for _ in range(repeat))

    return timer


def measure_interleaved(runners: dict[str, tuple[Runner, float]], timing: Timing) -> dict[str, Timed]:
    """Time every runner (each already called once, taking the given seconds) as :class:`Timing` says,
    interleaved: each of the ``repeat`` rounds runs one inner loop of every fast runner in turn, so a
    slow phase of the machine (other tenants, frequency changes) hits all runtimes alike and their
    ratios stay meaningful. Slow runners are timed by single calls afterwards. Every probe and loop
    starts once the previous runtime's workers sleep (:func:`quiesce`)."""
    timed, fast, numbers = {}, {}, {}
    for key, (runner, warm_s) in runners.items():
        if warm_s >= timing.slow_s:
            continue
        fast[key] = runner
        quiesce()
        probe = _wall(runner.run, 1)
        numbers[key] = max(1, math.ceil(timing.min_time / max(probe, 1e-6)))
    samples: dict[str, list[float]] = {key: [] for key in fast}
    kernel: dict[str, list[float]] = {key: [] for key, runner in fast.items() if runner.kernel_time is not None}
    for _ in range(timing.repeat):
        for key, runner in fast.items():
            quiesce()
            samples[key].append(runner.time(numbers[key], 1))
            if key in kernel:  # the same round: the kernel-only figure sees the same machine
                quiesce()
                kernel[key].append(runner.kernel_time(numbers[key], 1))
    for key in runners:
        if key in fast:
            timed[key] = Timed(statistics.median(samples[key]), numbers[key], timing.repeat,
                               kernel_seconds=statistics.median(kernel[key]) if key in kernel else None)
        else:
            runner = runners[key][0]
            quiesce()
            seconds = runner.time(1, timing.slow_repeat)
            quiesce()
            kernel_s = runner.kernel_time(1, timing.slow_repeat) if runner.kernel_time is not None else None
            timed[key] = Timed(seconds, 1, timing.slow_repeat, slow=True, kernel_seconds=kernel_s)
    return timed


# ---------------------------------------------------------------- runtimes

def ort_runner(path: Path, feed: dict, threads: int, optimize: bool = True) -> Runner:
    start = time.perf_counter()
    session = ort_session(path, threads, optimize)
    setup = time.perf_counter() - start

    def run():
        return session.run(None, feed)

    return Runner(run, wall_clock_timer(run), "wall clock (session.run)", setup)


def tvm_runner(path: Path, spec: ModelSpec, feed: dict, threads: int) -> Runner:
    start = time.perf_counter()
    mod = tvm_lowprec.from_onnx(str(path), shape_dict=spec.shape_dict)
    compiled = tvm_lowprec.compile(mod, target="native", num_threads=threads)
    setup = time.perf_counter() - start

    def kernels(number: int, repeat: int) -> float:
        return compiled.benchmark(feed, number=number, repeat=repeat)

    def run():
        return compiled(feed)

    # timed as a user calls it (numpy in, numpy out), the kernels alone (TVM's time evaluator) beside it
    return Runner(run, wall_clock_timer(run), "wall clock (Compiled.__call__)", setup, compiled, kernels)


def make_runner(runtime: str, built: BuiltModel, feed: dict, threads: int) -> Runner:
    if runtime == "ort-int8":
        return ort_runner(built.int8_path, feed, threads)
    if runtime == "ort-fp32":
        return ort_runner(built.fp32_path, feed, threads)
    if runtime == "tvm-lowprec-int8":
        return tvm_runner(built.int8_path, built.spec, feed, threads)
    if runtime == "tvm-lowprec-fp32":
        return tvm_runner(built.fp32_path, built.spec, feed, threads)
    raise ValueError(f"unknown runtime {runtime!r}")


def runtime_errors(runtime: str) -> tuple[type[BaseException], ...]:
    return ort_errors() if runtime.startswith("ort") else TVM_ERRORS


# ---------------------------------------------------------------- correctness

def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        return float("nan")
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom > 0 else float("nan")


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.shape == b.shape else float("nan")


@dataclass(frozen=True)
class References:
    """The compared output (``spec.output``) from ORT: INT8 as written (no graph optimizations), INT8
    fused and FP32, at one thread; ``index`` is that output's position among the graph outputs."""

    index: int
    count: int
    int8_qdq: np.ndarray
    int8_fused: np.ndarray
    fp32: np.ndarray
    qdq_sensitivity: float | None  # cosine of the QDQ output after a PERTURBATION of the input, or None


def _ort_output(path: Path, feed: dict, name: str, optimize: bool) -> np.ndarray:
    return ort_session(path, 1, optimize).run([name], feed)[0]


def perturbed(feed: dict, seed: int = 0) -> dict | None:
    """``feed`` with every float input scaled by ``1 + PERTURBATION * N(0, 1)``; None if one is not float."""
    if not all(np.issubdtype(v.dtype, np.floating) for v in feed.values()):
        return None
    rng = np.random.default_rng(seed)
    return {k: (v * (1 + PERTURBATION * rng.standard_normal(v.shape))).astype(v.dtype) for k, v in feed.items()}


def reference_outputs(built: BuiltModel, feed: dict) -> References:
    """ORT's outputs for the checks. ``qdq_sensitivity`` says how far the QDQ graph's own output moves
    when the input moves by a few float32 ulps (quantization steps flip at rounding boundaries):
    the noise floor against which tvm-lowprec's cosine can be read."""
    session = ort_session(built.int8_path, 1, optimize=False)
    names = [o.name for o in session.get_outputs()]
    qdq = session.run([built.spec.output], feed)[0]
    noisy_feed = perturbed(feed)
    sensitivity = None if noisy_feed is None else cosine(qdq, session.run([built.spec.output], noisy_feed)[0])
    fused = _ort_output(built.int8_path, feed, built.spec.output, True)
    fp32 = _ort_output(built.fp32_path, feed, built.spec.output, True)
    return References(names.index(built.spec.output), len(names), qdq, fused, fp32, sensitivity)


def _pick_output(outputs: list[np.ndarray], refs: References) -> np.ndarray:
    if len(outputs) != refs.count:
        raise ValueError(f"returned {len(outputs)} outputs, the graph has {refs.count}")
    return outputs[refs.index]


def check_row(runtime: str, out: np.ndarray, refs: References) -> dict:
    """Comparison columns and the status: tvm-lowprec INT8 must match ORT's QDQ graph, tvm-lowprec FP32 ORT's
    FP32 output, with cosine >= :data:`COSINE_OK`; ORT's own rows are the references. Where the QDQ
    graph's own output moves further than that under a 1e-6 input perturbation (quantization steps
    flipping at rounding boundaries: the BERT-sized encoder, 0.99941), a tvm-lowprec output at least
    as close as that is rounding noise, not a mismatch."""
    cols = {
        "cos_vs_ort_int8_qdq": cosine(out, refs.int8_qdq),
        "max_abs_diff_vs_ort_int8_qdq": max_abs_diff(out, refs.int8_qdq),
        "cos_vs_ort_int8": cosine(out, refs.int8_fused),
        "cos_vs_ort_fp32": cosine(out, refs.fp32),
    }
    gate = {"tvm-lowprec-int8": "cos_vs_ort_int8_qdq", "tvm-lowprec-fp32": "cos_vs_ort_fp32"}.get(runtime)
    threshold = COSINE_OK
    if runtime == "tvm-lowprec-int8" and refs.qdq_sensitivity is not None:
        threshold = min(COSINE_OK, refs.qdq_sensitivity)
    ok = gate is None or cols[gate] >= threshold
    return {**cols, "status": "ok" if ok else "mismatch"}


# ---------------------------------------------------------------- one model

def error_text(err: BaseException, limit: int = 600) -> str:
    """``Type: first line ... last line`` of an exception (TVM's messages carry whole TIR dumps)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    if isinstance(err, tvm_lowprec.LowPrecError):  # short messages: every line counts (one per operator)
        text = " ".join(lines)
    else:
        text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(err).__name__}: {text}"[:limit]


def _row(model: str, runtime: str, threads: int, **values) -> dict:
    return {"model": model, "runtime": runtime, "threads": threads, **values}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare_runtime(runtime: str, built: BuiltModel, feed: dict, threads: int, refs: References):
    """Prepare one (runtime, threads) point and check its output: (runner, warm-call seconds, checks),
    or an error row when it fails."""
    name = built.spec.name
    try:
        runner = make_runner(runtime, built, feed, threads)
        start = time.perf_counter()
        out = _pick_output(runner.run(), refs)
        warm = time.perf_counter() - start
        return runner, warm, check_row(runtime, out, refs)
    except runtime_errors(runtime) as err:
        _log(f"  {name:8s} {runtime:17s} t={threads}: error: {error_text(err, 200)}")
        return _row(name, runtime, threads, status="error", error=error_text(err))


def bench_threads(built: BuiltModel, feed: dict, threads: int, refs: References, timing: Timing,
                  runtimes: tuple[str, ...] = RUNTIMES):
    """The runtimes at one thread count, timed interleaved: (rows in ``runtimes`` order, runners)."""
    name = built.spec.name
    prepared = {runtime: prepare_runtime(runtime, built, feed, threads, refs) for runtime in runtimes}
    ready = {r: p for r, p in prepared.items() if isinstance(p, tuple)}
    timed = measure_interleaved({r: (p[0], p[1]) for r, p in ready.items()}, timing)
    rows, runners = [], {}
    for runtime in runtimes:
        if runtime not in ready:
            rows.append(prepared[runtime])
            continue
        runner, _, checks = ready[runtime]
        t = timed[runtime]
        _log(f"  {name:8s} {runtime:17s} t={threads}: {t.seconds * 1e3:10.2f} ms  "
             f"(setup {runner.setup_s:.1f} s, {checks['status']})")
        kernel_ms = round(t.kernel_seconds * 1e3, 4) if t.kernel_seconds is not None else None
        rows.append(_row(name, runtime, threads, ms=round(t.seconds * 1e3, 4), kernel_ms=kernel_ms, number=t.number,
                         repeat=t.repeat, slow=t.slow, timer=runner.timer, setup_s=round(runner.setup_s, 2), error="",
                         **checks))
        runners[runtime] = runner
    return rows, runners


def profile_kernels(runner: Runner, feed: dict, timing: Timing, threads: int, isolated: bool = True) -> dict:
    """tvm-lowprec's per-kernel times (all kernels, slowest first) and their sum, with the copy
    bandwidth their ``pct_copy`` divides by (measured by the profile, at this thread count); each
    kernel timed alone (``Compiled.profile(isolated=True)``) unless ``isolated`` is False."""
    try:
        rows = runner.compiled.profile(feed, repeat=timing.profile_repeat, isolated=isolated)
    except TVM_ERRORS as err:
        return {"threads": threads, "error": error_text(err), "rows": []}
    return {"threads": threads, "total_ms": sum(r["ms"] for r in rows), "kernels": len(rows), "rows": rows,
            "isolated": isolated, "copy_bandwidth": copy_bandwidth().rows()}


@dataclass
class ModelResult:
    name: str
    description: str
    rows: list[dict] = field(default_factory=list)
    error: str = ""
    profile: dict | None = None
    qdq_sensitivity: float | None = None
    target: str = ""
    build: dict = field(default_factory=dict)  # the model's build manifest (seeds, quantization, ops, sha256)


def _skip_rows(name: str, threads: list[int], status: str, reason: str,
               runtimes: tuple[str, ...] = RUNTIMES) -> list[dict]:
    return [_row(name, r, t, status=status, error=reason) for t in threads for r in runtimes]


def prepare_model(spec: ModelSpec, cache: Path, reduce_range: bool = False) -> tuple[BuiltModel | None, str]:
    try:
        return ensure_model(spec, cache, reduce_range=reduce_range), ""
    except (ModelUnavailable, ImportError) as err:
        return None, f"model unavailable: {err}"
    except ort_errors() as err:
        return None, f"build/quantization failed: {error_text(err)}"


def bench_model(spec: ModelSpec, threads: list[int], timing: Timing, cache: Path,
                reduce_range: bool = False, runtimes: tuple[str, ...] = RUNTIMES,
                isolated_profile: bool = True) -> ModelResult:
    result = ModelResult(spec.name, spec.description)
    built, reason = prepare_model(spec, cache, reduce_range)
    if built is None:
        result.error, result.rows = reason, _skip_rows(spec.name, threads, "skipped", reason, runtimes)
        return result
    result.build = built.manifest
    feed = make_feed(spec)
    try:
        refs = reference_outputs(built, feed)
    except ort_errors() as err:
        result.error = f"ORT reference failed: {error_text(err)}"
        result.rows = _skip_rows(spec.name, threads, "skipped", result.error, runtimes)
        return result
    result.qdq_sensitivity = refs.qdq_sensitivity
    profile_at = 1 if 1 in threads else min(threads)
    for t in threads:
        rows, runners = bench_threads(built, feed, t, refs, timing, runtimes)
        result.rows += rows
        runner = runners.get("tvm-lowprec-int8")
        if runner is not None:
            result.target = runner.compiled.spec.name
            if t == profile_at:
                result.profile = profile_kernels(runner, feed, timing, t, isolated_profile)
        del runners, runner
    return result


# ---------------------------------------------------------------- metadata and writers

def git_revision(repo: Path) -> str:
    """Short commit of the checkout holding ``repo``, noting uncommitted changes under tvm_lowprec/."""
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "tvm_lowprec"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree (the GPU machine's) names its commit
        return os.environ.get("LOWPREC_GIT", "unknown (not a git checkout)")
    return f"{rev} (tvm_lowprec/ has uncommitted changes)" if dirty else rev


def run_metadata(args: argparse.Namespace, timing: Timing, load_start, git_start: str) -> dict:
    git_end = git_revision(LOWPREC_ROOT)
    git = git_start if git_end == git_start else f"{git_start} at start, {git_end} at end"
    return collect_metadata(
        benchmark="reference models",
        models=args.models,
        threads=args.threads,
        timing=asdict(timing),
        quick=args.quick,
        reduce_range=args.reduce_range,
        tvm_lowprec={"version": tvm_lowprec.__version__, "path": str(LOWPREC_ROOT), "git": git},
        environment={k: os.environ.get(k) for k in ("TVM_THREAD_POOL_SPIN_COUNT", "OMP_WAIT_POLICY",
                                                    "TVM_NUM_THREADS", "OPENBLAS_CORETYPE")},
        ort_session={"intra_op_num_threads": "threads", "inter_op_num_threads": 1,
                     "session.intra_op.allow_spinning": "default (on)"},
        thread_policy=thread_policy(),
        cosine_ok=COSINE_OK,
        loadavg_start=load_start,
    )


def write_json(results: list[ModelResult], meta: dict, path: Path) -> None:
    models = {r.name: {"description": r.description, "error": r.error, "target": r.target, "build": r.build,
                       "qdq_sensitivity": {"perturbation": PERTURBATION, "cosine": r.qdq_sensitivity},
                       "profile": r.profile} for r in results}
    rows = [row for r in results for row in r.rows]
    payload = {"metadata": meta, "models": models, "results": rows}
    path.write_text(json.dumps(json_safe(payload), indent=2) + "\n")


# ---------------------------------------------------------------- Markdown report

def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _cell(row: dict | None) -> str:
    if row is None:
        return "n/a"
    if row["status"] in ("error", "skipped"):
        return "error" if row["status"] == "error" else "n/a"
    return _ms(row["ms"]) + (" !" if row["status"] == "mismatch" else "")


def _ratio(row: dict | None, base: dict | None) -> str:
    measured = ("ok", "mismatch")
    if row is None or base is None or row["status"] not in measured or base["status"] not in measured:
        return "—"
    return f"{row['ms'] / base['ms']:.2f}x"


def _find(rows: list[dict], runtime: str, threads: int) -> dict | None:
    return next((r for r in rows if r["runtime"] == runtime and r["threads"] == threads), None)


def latency_table(result: ModelResult, threads: list[int]) -> list[str]:
    head = ["runtime"] + [f"{t} thr (ms)" for t in threads]
    head += [f"÷ ORT INT8 ({t} thr)" for t in threads] + [f"÷ ORT FP32 ({t} thr)" for t in threads]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for runtime in [r for r in RUNTIMES if any(row["runtime"] == r for row in result.rows)]:
        found = [_find(result.rows, runtime, t) for t in threads]
        cells = [_cell(r) for r in found]
        cells += [_ratio(r, _find(result.rows, "ort-int8", t)) for r, t in zip(found, threads)]
        cells += [_ratio(r, _find(result.rows, "ort-fp32", t)) for r, t in zip(found, threads)]
        label = f"**{LABELS[runtime]}**" if runtime == "tvm-lowprec-int8" else LABELS[runtime]
        lines.append("| " + " | ".join([label] + cells) + " |")
    kernel = [(r, t, row) for r in RUNTIMES for t in threads
              if (row := _find(result.rows, r, t)) is not None and row.get("kernel_ms") is not None]
    if kernel:
        lines += ["", "Latency is timed through the call a user makes (`session.run`, `Compiled.__call__`); "
                  "tvm-lowprec's kernels alone (`Compiled.benchmark`, TVM's time evaluator), same rounds: "
                  + "; ".join(f"{LABELS[r]} {t} thr {row['kernel_ms']:.3g} ms (call {row['ms']:.3g} ms)"
                              for r, t, row in kernel) + "."]
    return lines


def _fmt_cos(value) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.6f}"


def _fmt_diff(value) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def check_table(result: ModelResult) -> list[str]:
    lines = ["| runtime | threads | cos vs ORT INT8 (QDQ as written) | max abs diff | cos vs ORT INT8 (fused) "
             "| cos vs ORT FP32 | verdict |", "|---|---:|---:|---:|---:|---:|---|"]
    for row in result.rows:
        if row["status"] not in ("ok", "mismatch"):
            continue
        verdict = {"tvm-lowprec-int8": "OK", "tvm-lowprec-fp32": "OK"}.get(row["runtime"], "(reference)")
        verdict = "**MISMATCH**" if row["status"] == "mismatch" else verdict
        lines.append(f"| {LABELS[row['runtime']]} | {row['threads']} | {_fmt_cos(row['cos_vs_ort_int8_qdq'])} | "
                     f"{_fmt_diff(row['max_abs_diff_vs_ort_int8_qdq'])} | {_fmt_cos(row['cos_vs_ort_int8'])} | "
                     f"{_fmt_cos(row['cos_vs_ort_fp32'])} | {verdict} |")
    return lines


def sensitivity_line(value: float | None) -> str:
    if value is None:
        return "QDQ graph sensitivity: n/a (integer inputs)."
    return (f"QDQ graph sensitivity: scaling the input by 1 + {PERTURBATION:g}·N(0, 1) moves ORT's own QDQ output to "
            f"cosine {_fmt_cos(value)} (quantization steps flip at rounding boundaries); a tvm-lowprec cosine near "
            f"or above this is rounding noise, well below it is a real difference.")


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


_GLUE = {"fused", "dequantize", "quantize", "cast", "tir", "round", "clip"}


def _op_summary(row: dict) -> str:
    """The operator column: the kernel's op, or for a fused generic kernel the distinct operators in its
    name, less the quantize/cast/round/clip glue (``fused_matmul_cast4_multiply1_tir_round_add...`` ->
    ``matmul, multiply, add``: a generic int32 matmul and its requantization)."""
    if row["op"] != row["name"].rstrip("0123456789_"):
        return row["op"]
    ops, prefix = [], ""
    for token in row["name"].split("_"):
        word = token.rstrip("0123456789")
        if word == "fast":  # fast_softmax, fast_erf, fast_exp: TVM's approximations
            prefix = "fast_"
            continue
        word, prefix = (prefix + word if word else word), ""
        if word and word not in _GLUE and word not in ops:
            ops.append(word)
    return ", ".join(ops) if ops else "quantize/dequantize"


def profile_table(profile: dict | None, end_to_end: dict | None) -> list[str]:
    if not profile:
        return ["No profile (tvm-lowprec INT8 did not run)."]
    if profile.get("error"):
        return [f"Profile failed: {profile['error']}"]
    total = profile["total_ms"]
    e2e = ""
    if end_to_end and end_to_end.get("ms"):
        kernel = end_to_end.get("kernel_ms")
        e2e = (f"; end to end {_ms(end_to_end['ms'])} ms through the call"
               + (f", {_ms(kernel)} ms by the time evaluator" if kernel else ""))
    plural = "s" if profile["threads"] > 1 else ""
    how = ("each kernel timed alone by TVM's time evaluator, times its calls per run" if profile.get("isolated")
           else "timed in the model by a VM instrument (a few us of callback per call included)")
    lines = [f"Top {PROFILE_TOP} of {profile['kernels']} kernels at {profile['threads']} thread{plural} ({how}); "
             f"kernel times sum to {_ms(total)} ms{e2e}.", "",
             "| # | kernel | op | intrinsic | shape | ms | GOPS | bytes | GB/s | % of copy bandwidth | share |",
             "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(profile["rows"][:PROFILE_TOP], 1):
        cells = profile_figures(r, empty="—")
        lines.append(f"| {i} | `{_short(r['name'])}` | {_op_summary(r)} | {r['intrinsic']} | {r['shape']} | "
                     f"{_ms(r['ms'])} | {cells['GOPS']} | {cells['bytes']} | {cells['GB/s']} | {cells['% copy']} | "
                     f"{r['share'] * 100:.1f}% |")
    return lines + ["", copy_bandwidth_line(profile.get("copy_bandwidth"))]


def copy_bandwidth_line(table: list[dict] | None) -> str:
    """What the profile's % of copy bandwidth divides by: bytes per call (read + written) and GB/s
    compared with the copy moving as many bytes (tvm_lowprec.bench.bandwidth)."""
    if not table:
        return "No copy bandwidth measured."
    sizes = ", ".join(f"{format_bytes(t['buffer_bytes'])} {t['gbs']:.0f}" for t in table)
    return ("GEMMs: GOPS; the other kernels: bytes per call (parameter buffers read + written) and GB/s as a "
            "% of this host's copy bandwidth for as many bytes at the same thread count (the faster of a TVM "
            f"copy kernel and np.copyto, a copy of N bytes counted as 2N moved; buffer size GB/s: {sizes}).")


def _notes(result: ModelResult) -> list[str]:
    errors = [r for r in result.rows if r.get("error")]
    seen, lines = set(), []
    for r in errors:
        key = (r["runtime"], r["error"])
        if key in seen:
            continue
        seen.add(key)
        threads = ",".join(str(x["threads"]) for x in errors if (x["runtime"], x["error"]) == key)
        lines.append(f"- {LABELS[r['runtime']]} ({threads} thr): {r['status']}: `{r['error']}`")
    slow = [r for r in result.rows if r.get("slow")]
    for r in slow:
        lines.append(f"- {LABELS[r['runtime']]} ({r['threads']} thr): slow, timed by {r['repeat']} single call(s)")
    return lines


def _header(meta: dict) -> list[str]:
    versions = meta["versions"]
    cpu = meta["host"]["cpu"]
    flags = ", ".join(f for f, on in cpu["flags"].items() if on) or "none"
    return [
        "# Reference models: tvm-lowprec INT8 and FP32 vs ONNX Runtime"
        + (" (INT8 with 7-bit weights: reduce_range=True)" if meta.get("reduce_range") else ""), "",
        f"{meta['date']} · {cpu['model']} ({cpu['logical_cpus']} logical CPUs; {flags}) · "
        f"tvm-lowprec {meta['tvm_lowprec']['version']} @ {meta['tvm_lowprec']['git']} · TVM {versions['tvm']} · "
        f"ONNX Runtime {versions['onnxruntime']} · onnx {versions['onnx']} · numpy {versions['numpy']}", "",
        f"Load average at start {meta['loadavg_start']}, at end {meta['loadavg_end']} (other processes on "
        "these cores distort the numbers, 2 threads most). Latency: median ms per call, batch 1; the runtimes "
        "are timed interleaved (each round times every runtime once), so a noisy phase hits them alike, each "
        "with its default thread policy (workers spin between calls), the previous runtime's workers asleep. "
        "`÷ ORT ...`: this row's latency divided by ORT's at the same thread count (above 1: slower than ORT). "
        f"`!`: output check failed (cosine < {COSINE_OK}, or for tvm-lowprec below the QDQ graph's own "
        f"sensitivity where that is lower: see each model); `error`: failed, see notes.", "",
    ]


def render_report(results: list[ModelResult], meta: dict, threads: list[int]) -> str:
    lines = _header(meta)
    for result in results:
        target = f" · target `{result.target}`" if result.target else ""
        lines += [f"## {result.name}", "", result.description + target, ""]
        if result.error:
            lines += [f"**Not run:** {result.error}", ""]
            continue
        lines += latency_table(result, threads) + [""]
        lines += [f"Output check (output `{MODELS[result.name].output}`):", ""] + check_table(result) + [""]
        lines += [sensitivity_line(result.qdq_sensitivity), ""]
        prof_threads = result.profile["threads"] if result.profile else None
        lines += ["tvm-lowprec INT8 per-kernel profile:", ""]
        lines += profile_table(result.profile, _find(result.rows, "tvm-lowprec-int8", prof_threads)) + [""]
        notes = _notes(result)
        lines += (["Notes:", ""] + notes + [""]) if notes else []
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=names_parser(MODELS, "model"), default=list(MODELS),
                        help=f"comma-separated (default: {','.join(MODELS)})")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2], help="comma-separated (default: 1,2)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed repeats per point (median); default 10, 3 with --quick")
    parser.add_argument("--quick", action="store_true", help="shorter timing (a smoke test)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="model cache folder (build.py's)")
    parser.add_argument("--runtimes", type=names_parser(RUNTIMES, "runtime"), default=list(RUNTIMES),
                        help=f"comma-separated (default: {','.join(RUNTIMES)})")
    parser.add_argument("--reduce-range", action="store_true",
                        help="INT8 models with 7-bit weights (exact for ORT's and tvm-lowprec's vpmaddubsw kernels "
                             "on CPUs without VNNI); default --out: benchmarks/results/models-reduce-range")
    parser.add_argument("--in-model-profile", action="store_true",
                        help="time the per-kernel profile inside the model's run (VM instrument) instead of "
                             "each kernel alone")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.reduce_range and args.out == DEFAULT_OUT:
        args.out = DEFAULT_OUT.parent / "models-reduce-range"
    timing = QUICK_TIMING if args.quick else DEFAULT_TIMING
    if args.repeat is not None:
        if args.repeat < 1:
            raise SystemExit("--repeat must be >= 1")
        timing = replace(timing, repeat=args.repeat)
    load_start, git_start = load_average(), git_revision(LOWPREC_ROOT)
    results = []
    for name in args.models:
        _log(f"{name}: {MODELS[name].description}")
        results.append(bench_model(MODELS[name], args.threads, timing, args.cache, args.reduce_range,
                                   tuple(args.runtimes), not args.in_model_profile))
    meta = run_metadata(args, timing, load_start, git_start)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv([row for r in results for row in r.rows], args.out / "results.csv", CSV_FIELDS)
    write_json(results, meta, args.out / "results.json")
    report = render_report(results, meta, args.threads)
    rows = [row for r in results for row in r.rows]
    if write_latency_plot(rows, [r.name for r in results], LABELS, args.threads, args.out / "report.png"):
        report += "\n\n![latency per model and runtime](report.png)"
    (args.out / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
