"""A declared benchmark grid (shapes x providers x thread counts) and the loop that runs it.

In the style of Triton's ``perf_report``: a :class:`Benchmark` is data; :func:`run_benchmark` measures
every point, writes ``results.csv``, ``results.json`` and ``report.md`` (plus ``report.png`` when
matplotlib is installed) and returns the rows.
"""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import providers as _providers  # noqa: F401  (registers the providers)
from .hostinfo import collect_metadata, load_average
from .problems import DATA_DESCRIPTION
from .quiesce import quiesce, thread_policy
from .registry import PROVIDERS, BaseProvider, get_provider
from .report import write_reports
from .timing import DEFAULT_TIMING, Timing, measure

Shape = tuple[int, int, int]

# Exceptions a provider may raise for one point; they are recorded as the point's reason.
POINT_ERRORS: tuple[type[BaseException], ...] = (
    RuntimeError, ValueError, TypeError, NotImplementedError, AttributeError, ImportError, MemoryError, OSError,
)
MAX_STEP_DIFF = 1  # tvm-lowprec may differ from ORT's QLinearMatMul by one rounding step


def predicted_rows() -> tuple[str, ...]:
    """Rows the hosts at hand rarely run, predicted by llvm-mca (tvm_lowprec.perfmodel) in every report with
    predictions, each on every CPU model its row lists: the registered rows marked ``grid_prediction``
    (:class:`~tvm_lowprec.hwspec.TargetSpec`)."""
    from ..targets import registered_targets

    return tuple(name for name, spec in registered_targets("cpu").items() if spec.grid_prediction)


PREDICTED_SHAPES: tuple[Shape, ...] = ((1024, 1024, 1024), (16, 3072, 768), (1, 4096, 4096))


@dataclass(frozen=True)
class Benchmark:
    """What to measure.

    Attributes
    ----------
    name : str
        Title of the report.
    shapes : tuple of (M, N, K)
        GEMM shapes: ``[M, K] x [K, N]``.
    providers : tuple of str
        Registered provider names, in column order.
    threads : tuple of int
        Thread counts; the report has one table per count.
    metric : str
        Only ``"GOPS"`` (``2*M*N*K / seconds / 1e9``).
    main : str
        Provider compared against every other one in the ratio columns.
    """

    name: str
    shapes: tuple[Shape, ...]
    providers: tuple[str, ...]
    threads: tuple[int, ...] = (1,)
    metric: str = "GOPS"
    main: str = "tvm-lowprec"

    def __post_init__(self):
        object.__setattr__(self, "shapes", tuple(tuple(int(d) for d in s) for s in self.shapes))
        object.__setattr__(self, "providers", tuple(self.providers))
        object.__setattr__(self, "threads", tuple(int(t) for t in self.threads))
        if self.metric != "GOPS":
            raise ValueError(f"unsupported metric {self.metric!r}; only 'GOPS'")
        if not (self.shapes and self.providers and self.threads):
            raise ValueError("a Benchmark needs at least one shape, provider and thread count")
        if any(len(s) != 3 or min(s) < 1 for s in self.shapes) or min(self.threads) < 1:
            raise ValueError(f"shapes must be positive (M, N, K) and threads >= 1: {self}")


def gops(m: int, n: int, k: int, seconds: float) -> float:
    """``2*M*N*K / seconds`` in units of 1e9 operations per second."""
    return 2.0 * m * n * k / seconds / 1e9


def _base_row(bench: Benchmark, provider: str, shape: Shape, threads: int) -> dict:
    m, n, k = shape
    return {"benchmark": bench.name, "threads": threads, "M": m, "N": n, "K": k, "provider": provider,
            "status": "ok", "seconds": math.nan, "gops": math.nan, "max_diff_vs_ort": math.nan,
            "timer": "", "number": 0, "repeat": 0, "target": "", "reason": ""}


def _error_text(err: BaseException, limit: int = 400) -> str:
    text = " ".join(str(err).split()) or "(no message)"
    return f"{type(err).__name__}: {text[:limit]}"


def run_point(provider: BaseProvider, row: dict, timing: Timing, seed: int) -> dict:
    """Prepare and time one (provider, shape, threads) point; failures become a row with a reason."""
    m, n, k, threads = row["M"], row["N"], row["K"], row["threads"]
    rng = np.random.default_rng([seed, m, n, k])  # same data for every provider and thread count
    try:
        prepared = provider.prepare(m, n, k, rng, threads=threads)
        quiesce()  # the previous point's runtime's workers asleep: each provider timed with its own default
        with prepared.context():
            result = prepared.timer(timing) if prepared.timer else measure(prepared, timing)
    except POINT_ERRORS + provider.errors() as err:
        return {**row, "status": "error", "reason": _error_text(err)}
    row = {**row, **prepared.extra, "seconds": result.seconds, "gops": gops(m, n, k, result.seconds),
           "timer": prepared.timer_name, "number": result.number, "repeat": result.repeat,
           "reason": prepared.note}
    if row["max_diff_vs_ort"] > MAX_STEP_DIFF:  # NaN (not checked) compares False
        row.update(status="mismatch", reason=f"max |diff| vs ORT = {row['max_diff_vs_ort']} steps")
    return row


def _log_row(row: dict, log: Callable[[str], None]) -> None:
    value = f"{row['gops']:.2f} GOPS" if row["status"] in ("ok", "mismatch") else row["reason"]
    log(f"[t={row['threads']}] {row['M']}x{row['N']}x{row['K']} {row['provider']}: {row['status']} {value}")


def _prediction_dict(p, memory=None) -> dict:
    keys = ("target", "intrin", "mca_cpu", "sched_model", "shape", "tile", "cycles_per_iteration",
            "cycles_per_k_step", "intrinsics_per_iteration", "ceiling_per_cycle", "fraction",
            "padding_efficiency", "bytes_moved")
    out = {key: getattr(p, key) for key in keys}
    out["with_memory"] = p.with_memory(memory) if memory is not None else None
    out["memory"] = asdict(memory) if memory is not None else None
    return out


def predict_points(shapes, rows=None, row_shapes=PREDICTED_SHAPES, host_memory=None) -> dict:
    """llvm-mca predictions (:func:`tvm_lowprec.perfmodel.predict`) for the report.

    ``host_memory`` (a :class:`~tvm_lowprec.perfmodel.Memory` measured on this host) adds the
    roofline figure (:meth:`~tvm_lowprec.perfmodel.Prediction.with_memory`) to the host's
    predictions; the rows get theirs from :attr:`~tvm_lowprec.hwspec.TargetSpec.memory`. ``rows``: default
    :func:`predicted_rows`.

    Returns
    -------
    dict
        ``host``: this host's ``native`` row at ``shapes`` (its first recipe, the one 7-bit weights
        take, on its default llvm-mca CPU); ``rows``: each of ``rows`` at ``row_shapes`` on every CPU
        model listed for it; ``error``: why there are none (llvm-mca missing, ...), else ``""``.
    """
    from ..perfmodel import McaError, mca_cpus, predict
    from ..targets import native_target, registered_targets

    try:
        host = native_target()
        out = {"host": [_prediction_dict(predict(host, *shape), host_memory) for shape in shapes], "rows": [],
               "error": ""}
        for name in predicted_rows() if rows is None else rows:
            spec = registered_targets()[name]
            out["rows"] += [_prediction_dict(predict(spec, *shape, mca_cpu=cpu), spec.memory)
                            for cpu in mca_cpus(spec) for shape in row_shapes]
    except (McaError, RuntimeError, KeyError) as err:
        return {"host": [], "rows": [], "error": _error_text(err)}
    return out


def _host_memory(peak_gops, read_gbs, source):
    from ..perfmodel import Memory

    return Memory(peak_gops, read_gbs, source) if peak_gops and read_gbs else None


def run_benchmark(bench: Benchmark, out_dir, peak_gops: float | None = None, timing: Timing = DEFAULT_TIMING,
                  seed: int = 0, log: Callable[[str], None] | None = None, predict: bool = False,
                  peak_source: str = "", read_gbs: float | None = None) -> list[dict]:
    """Measure every point of ``bench`` and write the reports into ``out_dir``.

    Parameters
    ----------
    bench : Benchmark
        The grid.
    out_dir : str or pathlib.Path
        Created if missing; receives ``results.csv``, ``results.json``, ``report.md`` [, ``report.png``].
    peak_gops : float, optional
        Peak GOPS of one thread; adds a "% of peak" column (scaled by the thread count).
    timing : Timing
        Loop sizes for wall-clock providers (tvm-lowprec uses them for its own timer too).
    seed : int
        Seed of the input data.
    log : callable, optional
        Receives one progress line per point; default prints to stderr.
    predict : bool
        Add llvm-mca predictions (:func:`predict_points`): a predicted % of peak and the model's
        error for this host's row, and a section for the rows this host cannot run.
    peak_source : str
        Where ``peak_gops`` comes from, for the report.
    read_gbs : float, optional
        This host's streaming read bandwidth of one thread (GB/s); with ``peak_gops`` and ``predict``,
        adds the roofline prediction (the micro-kernel or the byte stream, whichever is slower).

    Returns
    -------
    list of dict
        One row per (threads, shape, provider), in that nesting order.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    availability = {name: get_provider(name).available() for name in bench.providers}
    loadavg_start = load_average()
    rows = []
    for threads in bench.threads:
        for shape in bench.shapes:
            for name in bench.providers:
                row = _base_row(bench, name, shape, threads)
                ok, reason = availability[name]
                if ok:
                    row = run_point(PROVIDERS[name], row, timing, seed)
                else:
                    row.update(status="skipped", reason=reason)
                gc.collect()  # drop sessions and their thread pools before the next point
                _log_row(row, log)
                rows.append(row)
    meta = collect_metadata(
        benchmark=asdict(bench), threads=list(bench.threads), timing=asdict(timing), seed=seed,
        data=DATA_DESCRIPTION, loadavg_start=loadavg_start,
        peak_gops_per_thread=peak_gops, peak_source=peak_source,
        read_gbs_per_thread=read_gbs,
        predictions=predict_points(bench.shapes, host_memory=_host_memory(peak_gops, read_gbs, peak_source))
        if predict else None, compiled_targets=sorted({r["target"] for r in rows if r["target"]}),
        providers={name: {"available": ok, "reason": why} for name, (ok, why) in availability.items()},
        thread_policy=thread_policy())
    write_reports(rows, meta, Path(out_dir))
    return rows
