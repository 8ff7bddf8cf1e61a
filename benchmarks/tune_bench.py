#!/usr/bin/env python
"""Tuning: tuned vs default schedule vs ONNX Runtime, on GEMM grid points and the reference models.

For every case it tunes the integer kernels (``tvm_lowprec.tune``: the default schedule measured
first, then MetaSchedule's search), then times the default schedule, the tuned one and ONNX Runtime
INT8 interleaved in one process, and checks that tuned and default outputs are bit-identical.

Examples
--------
python benchmarks/tune_bench.py                                   # grid + models, 64 / 32 trials per kernel
python benchmarks/tune_bench.py --shapes 256x256x256 --models none --trials 8 --out /tmp/tune
python benchmarks/tune_bench.py --ship schedules                  # also write the best records to schedules/<row>/

Output in ``--out``: ``report.md``, ``results.json``; the full tuning database in ``--work-dir``
(resumable: a second run with the same folder measures only missing trials).

Every runtime runs with its default thread policy (TVM's pool spinning, during tuning too), quiesced
between runtimes by ``model_bench.measure_interleaved`` (``tvm_lowprec.bench.quiesce``).
"""

from __future__ import annotations

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import model_bench as mb  # noqa: E402  (timing, runners, metadata: shared with the model benchmark)
from tvm_lowprec.bench.cli_args import parse_shapes  # noqa: E402
from models.build import DEFAULT_CACHE, MODELS, ensure_model, make_feed  # noqa: E402

tvm_lowprec = mb.tvm_lowprec
from tvm_lowprec.bench.cli_args import parse_threads  # noqa: E402
from tvm_lowprec.bench.hostinfo import load_average  # noqa: E402
from tvm_lowprec.bench.problems import make_problem, qlinearmatmul_model  # noqa: E402
from tvm_lowprec.bench.quiesce import thread_policy  # noqa: E402
from tvm_lowprec.bench.report import json_safe  # noqa: E402
from tvm_lowprec.tune import COST_MODELS, export_best  # noqa: E402

GRID = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (128, 3072, 768), (128, 768, 3072)]
DEFAULT_MODELS = ["encoder", "minilm", "cnn"]
RUNTIMES = ("default", "tuned", "ort-int8")


def tvm_runner(mod, feed, threads: int, database) -> mb.Runner:
    start = time.perf_counter()
    compiled = tvm_lowprec.compile(mod, "native", num_threads=threads, database=database)
    setup = time.perf_counter() - start
    return mb.Runner(lambda: compiled(feed), lambda number, repeat: compiled.benchmark(feed, number=number, repeat=repeat),
                     "TVM time_evaluator", setup, compiled)


def bench_case(name: str, mod, onnx_model, feed: dict, args, ops: int | None) -> dict:
    """Tune ``mod``, then time default / tuned / ORT per thread count."""
    trials = args.trials if ops is not None else args.model_trials
    mb._log(f"{name}: tuning, {trials} trials per kernel")
    tuning = tvm_lowprec.tune(mod, "native", trials=trials, work_dir=args.work_dir, progress=True,
                              cost_model=args.cost_model)
    print(tuning.table(), flush=True)
    rows = []
    for threads in args.threads:
        runners = {"default": tvm_runner(mod, feed, threads, False),
                   "tuned": tvm_runner(mod, feed, threads, tuning),
                   "ort-int8": mb.ort_runner(onnx_model, feed, threads)}
        outputs = {key: r.run() for key, r in runners.items()}
        exact = all(np.array_equal(a, b) for a, b in zip(outputs["default"], outputs["tuned"]))
        tuned_kernels = sum(k.schedule == "tuned" for k in runners["tuned"].compiled.kernels())
        warm = {key: (r, mb._wall(r.run, 1)) for key, r in runners.items()}
        timed = mb.measure_interleaved(warm, args.timing)
        row = {"case": name, "threads": threads, "exact_tuned_vs_default": exact, "tuned_kernels": tuned_kernels}
        for key in RUNTIMES:
            row[f"{key}_ms"] = timed[key].seconds * 1e3
        row["tuned_vs_default"] = row["tuned_ms"] / row["default_ms"]
        row["tuned_vs_ort"] = row["tuned_ms"] / row["ort-int8_ms"]
        if ops is not None:
            row["tuned_gops"] = ops / timed["tuned"].seconds / 1e9
            if args.peak_gops:
                row["pct_peak"] = 100 * row["tuned_gops"] / (args.peak_gops * threads)
        rows.append(row)
        mb._log(f"{name} x{threads}: default {row['default_ms']:.3f} ms, tuned {row['tuned_ms']:.3f} ms, "
                f"ORT {row['ort-int8_ms']:.3f} ms, exact={exact}")
    return {"case": name, "tuning": tuning, "rows": rows}


def grid_cases(args):
    rng = np.random.default_rng(args.seed)
    for m, n, k in args.shapes:
        problem = make_problem(m, n, k, rng)
        model = qlinearmatmul_model(problem)
        path = args.work_dir / "models" / f"qlinearmatmul_{m}x{n}x{k}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
        yield f"{m}x{n}x{k}", tvm_lowprec.from_onnx(model), path, {model.graph.input[0].name: problem.a}, 2 * m * n * k


def model_cases(args):
    for name in args.models:
        built = ensure_model(MODELS[name], DEFAULT_CACHE)
        mod = tvm_lowprec.from_onnx(str(built.int8_path), shape_dict=built.spec.shape_dict)
        yield name, mod, built.int8_path, make_feed(built.spec), None


def _fmt(value, spec=".3f") -> str:
    return "—" if value is None else format(value, spec)


def render(results: list[dict], meta: dict, args) -> str:
    lines = ["# Tuning: tuned vs default schedule vs ONNX Runtime INT8", "",
             f"{meta['host']['cpu']['model']}; target {meta['target']}; git {meta['tvm_lowprec']['git']}; "
             f"{meta['date']}; load average {meta['loadavg_start']} → {meta['loadavg_end']}.", "",
             f"Trials per kernel: {args.trials} (GEMM grid), {args.model_trials} (models). Times: median of "
             f"{args.timing.repeat} interleaved rounds. Ratios below 1 mean tuned is faster.", ""]
    total = sum(r["tuning"].measured for r in results)
    seconds = sum(r["tuning"].seconds for r in results)
    failed = sum(t.failed for r in results for t in r["tuning"].tasks)
    trials = sum(t.trials for r in results for t in r["tuning"].tasks)
    lines += [f"**Tuning:** {total} candidates measured in {seconds:.0f} s ({total / seconds if seconds else 0:.3f} "
              f"trials/s); {failed} failed builds or runs among {trials} records.", ""]
    lines += ["| case | threads | default ms | tuned ms | ORT INT8 ms | tuned ÷ default | tuned ÷ ORT | tuned GOPS | % peak | exact |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for row in r["rows"]:
            lines.append(f"| {row['case']} | {row['threads']} | {row['default_ms']:.3f} | {row['tuned_ms']:.3f} | "
                         f"{row['ort-int8_ms']:.3f} | {row['tuned_vs_default']:.2f} | {row['tuned_vs_ort']:.2f} | "
                         f"{_fmt(row.get('tuned_gops'), '.1f')} | {_fmt(row.get('pct_peak'), '.0f')} | "
                         f"{'yes' if row['exact_tuned_vs_default'] else 'NO'} |")
    for r in results:
        lines += ["", f"## {r['case']}", "", r["tuning"].table()]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=GRID, help="MxNxK list (default: 5 grid points)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="reference models, or 'none'")
    parser.add_argument("--trials", type=int, default=64, help="trials per GEMM-grid kernel (default 64)")
    parser.add_argument("--model-trials", type=int, default=32, help="trials per model kernel (default 32)")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2])
    parser.add_argument("--work-dir", type=Path, default=HERE / ".tuning", help="the tuning database (resumable)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tuning")
    parser.add_argument("--ship", type=Path, default=None,
                        help="write the best record per kernel to SHIP/<target row>/ (e.g. schedules)")
    parser.add_argument("--peak-gops", type=float, default=None, help="one thread's int8 peak; adds %% of peak")
    parser.add_argument("--quick", action="store_true", help="shorter timing")
    parser.add_argument("--cost-model", choices=COST_MODELS,
                        default="xgb", help="MetaSchedule's cost model (random: no xgboost needed)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.models = [] if args.models == "none" else [m.strip() for m in args.models.split(",") if m.strip()]
    args.timing = mb.QUICK_TIMING if args.quick else mb.DEFAULT_TIMING
    args.out.mkdir(parents=True, exist_ok=True)
    load_start, git_start = load_average(), mb.git_revision(mb.LOWPREC_ROOT)
    results = [bench_case(name, mod, path, feed, args, ops)
               for cases in (grid_cases(args), model_cases(args)) for name, mod, path, feed, ops in cases]
    meta = mb.collect_metadata(
        benchmark="tuning", shapes=args.shapes, models=args.models, trials=args.trials,
        model_trials=args.model_trials, threads=args.threads, timing=asdict(args.timing),
        target=tvm_lowprec.native_target().name, loadavg_start=load_start,
        tvm_lowprec={"version": tvm_lowprec.__version__, "git": git_start}, thread_policy=thread_policy())
    meta["loadavg_end"] = load_average()
    (args.out / "report.md").write_text(render(results, meta, args))
    payload = {"metadata": meta, "results": [row for r in results for row in r["rows"]],
               "tuning": {r["case"]: {"seconds": r["tuning"].seconds, "measured": r["tuning"].measured,
                                      "tasks": [asdict(t) for t in r["tuning"].tasks]} for r in results}}
    (args.out / "results.json").write_text(json.dumps(json_safe(payload), indent=2) + "\n")
    if args.ship:
        dest = args.ship / tvm_lowprec.native_target().row
        dest.mkdir(parents=True, exist_ok=True)
        mb._log(f"shipped {export_best(args.work_dir, dest)} records to {dest}")
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
