#!/usr/bin/env python
"""What calling a compiled model costs beyond running it: ``c(x)`` against ``c.benchmark(x)``.

One QLinearMatMul model per shape (uint8 A input, int8 B initializer, uint8 output; the models and
data of ``benchmarks/matmul_grid.py``), timed in interleaved rounds (``tvm_lowprec.bench.timing``):

- ``c(x)``: the whole Python call, ``x`` 64-byte aligned (goes in without a copy);
- ``c(x), copied``: ``x`` 16-byte aligned, as numpy allocates most arrays (copied once, to aligned memory);
- ``tensor + .numpy()``: TVM's own copying path around the same VM function (``tvm.runtime.tensor``
  in, ``.numpy()`` out), what ``Compiled.__call__`` did before it shared memory with numpy;
- ``c.benchmark``: TVM's time evaluator (no Python, no conversion): the floor;
- ORT: ONNX Runtime's ``session.run`` on the same model (measured after TVM's workers went idle).

TVM's thread pool is left at its defaults (workers spin between calls, as users get them).

Examples
--------
python benchmarks/call_overhead.py
python benchmarks/call_overhead.py --threads 1 --shapes 1x64x16 --quick --out /tmp/call
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import tvm_lowprec
import tvm  # noqa: E402

from tvm_lowprec.bench import QUICK_TIMING, Timing, measure, measure_interleaved, wall_loop  # noqa: E402
from tvm_lowprec.bench.cli_args import parse_shapes, parse_threads  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, load_average  # noqa: E402
from tvm_lowprec.bench.problems import DATA_DESCRIPTION, make_problem, qlinearmatmul_model  # noqa: E402
from tvm_lowprec.bench.providers import max_abs_diff, ort_session  # noqa: E402
from tvm_lowprec.bench.report import write_json  # noqa: E402

SHAPES = [(1, 64, 16), (16, 3072, 768), (1, 4096, 4096), (1024, 1024, 1024)]  # M x N x K
TIMING = Timing(min_time=0.1, repeat=7)
QUIESCE_S = 0.2  # TVM's idle workers spin for a while after a call: let them sleep before ORT is timed
LOOPS = ("call", "call_copied", "tensor_numpy", "benchmark")


def placed(value: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``value`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    buffer = np.empty(value.nbytes + 128, np.uint8)
    copy = np.ndarray(value.shape, value.dtype, buffer, -buffer.__array_interface__["data"][0] % 64 + offset)
    copy[...] = value
    return copy


def measure_point(m: int, n: int, k: int, threads: int, timing: Timing, seed: int) -> dict:
    """One shape at one thread count: the loops of :data:`LOOPS` interleaved, then ORT."""
    problem = make_problem(m, n, k, np.random.default_rng(seed))
    model = qlinearmatmul_model(problem)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", num_threads=threads)
    aligned, copied = placed(problem.a, 0), placed(problem.a, 16)
    main, cpu = compiled._vm["main"], tvm.cpu()
    out = compiled(aligned)[0]
    assert np.array_equal(out, compiled(copied)[0]) and np.array_equal(out, main(tvm.runtime.tensor(aligned, cpu)).numpy())
    loops = {
        "call": wall_loop(partial(compiled, aligned)),
        "call_copied": wall_loop(partial(compiled, copied)),
        "tensor_numpy": wall_loop(lambda: main(tvm.runtime.tensor(copied, cpu)).numpy()),
        "benchmark": lambda number: compiled.benchmark(aligned, number=number, repeat=1),
    }
    times = measure_interleaved(loops, timing)
    session = ort_session(model, threads)
    feed = {"A": problem.a}
    reference = session.run(None, feed)[0]
    time.sleep(QUIESCE_S)
    ort = measure(partial(session.run, None, feed), timing)
    us = {key: times[key].seconds * 1e6 for key in LOOPS}
    floor = us["benchmark"]
    return {"threads": threads, "M": m, "N": n, "K": k, **{f"{key}_us": value for key, value in us.items()},
            "overhead_us": us["call"] - floor, "overhead_pct": 100 * (us["call"] - floor) / floor,
            "overhead_copied_us": us["call_copied"] - floor,
            "overhead_copied_pct": 100 * (us["call_copied"] - floor) / floor,
            "ort_run_us": ort.seconds * 1e6, "max_diff_vs_ort": max_abs_diff(out, reference),
            "number": {key: times[key].number for key in LOOPS}, "repeat": timing.repeat}


def render(rows: list[dict], meta: dict) -> str:
    """The Markdown report: how it was measured, then one table per thread count."""
    cpu, timing = meta["host"]["cpu"], meta["timing"]
    lines = [
        "# Call overhead: `Compiled.__call__` against `Compiled.benchmark` (QLinearMatMul, uint8 x int8)", "",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}; host: {cpu['model']} ({cpu['logical_cpus']} logical CPUs), LLVM host CPU "
        f"{meta['target']['llvm_host_cpu']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items() if v)}",
        f"- TVM thread pool: {meta['tvm_thread_pool']}; load average at start {meta['loadavg_start']}, "
        f"at end {meta['loadavg_end']}",
        f"- timing: median of {timing['repeat']} interleaved repeats, each >= {timing['min_time']} s; data: "
        f"{meta['data']}",
        "- columns: `c(x)` with x 64-byte aligned (no input copy); `copied`: x 16-byte aligned (one copy "
        "to aligned memory); `tensor+.numpy()`: `tvm.runtime.tensor` in and `.numpy()` out around the "
        "same VM function (the copying path); overhead = `c(x)` - `c.benchmark` (TVM's time evaluator)",
    ]
    head = ["shape MxNxK", "c(x) us", "c.benchmark us", "overhead us", "overhead %", "c(x) copied us",
            "overhead copied us (%)", "tensor+.numpy() us", "ORT session.run us", "max diff vs ORT"]
    for threads in meta["threads"]:
        lines += ["", f"## {threads} thread{'s' if threads > 1 else ''}", "",
                  "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for r in (r for r in rows if r["threads"] == threads):
            cells = [f"{r['M']}x{r['N']}x{r['K']}", f"{r['call_us']:.1f}", f"{r['benchmark_us']:.1f}",
                     f"{r['overhead_us']:.1f}", f"{r['overhead_pct']:.1f}", f"{r['call_copied_us']:.1f}",
                     f"{r['overhead_copied_us']:.1f} ({r['overhead_copied_pct']:.1f})", f"{r['tensor_numpy_us']:.1f}",
                     f"{r['ort_run_us']:.1f}", str(r["max_diff_vs_ort"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                        help="comma-separated MxNxK list (default: 1x64x16,16x3072x768,1x4096x4096,1024x1024x1024)")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2], help="comma-separated (default: 1,2)")
    parser.add_argument("--quick", action="store_true", help="shorter timing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/call_overhead"), help="output folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    timing = QUICK_TIMING if args.quick else TIMING
    start_load = load_average()
    rows = []
    for threads in args.threads:
        for m, n, k in args.shapes:
            rows.append(measure_point(m, n, k, threads, timing, args.seed))
            print(f"threads={threads} {m}x{n}x{k}: c(x) {rows[-1]['call_us']:.1f} us, benchmark "
                  f"{rows[-1]['benchmark_us']:.1f} us", file=sys.stderr)
    spin = os.environ.get("TVM_THREAD_POOL_SPIN_COUNT")
    meta = collect_metadata(
        benchmark={"name": "call_overhead"}, shapes=[list(s) for s in args.shapes], threads=args.threads,
        timing={"min_time": timing.min_time, "repeat": timing.repeat}, data=DATA_DESCRIPTION,
        command=" ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        tvm_thread_pool="default (TVM_THREAD_POOL_SPIN_COUNT unset)" if spin is None else f"TVM_THREAD_POOL_SPIN_COUNT={spin}",
        loadavg_start=start_load)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(rows, meta, args.out / "results.json")
    report = render(rows, meta)
    (args.out / "report.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
