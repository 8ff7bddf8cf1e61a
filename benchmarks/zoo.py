#!/usr/bin/env python
"""Model zoo: torchvision, timm, transformers and Ultralytics models, quantized by ONNX Runtime, on tvm-lowprec.

Examples
--------
python benchmarks/zoo.py --quick                                  # a few small models at reduced sizes
python benchmarks/zoo.py --models resnet50,bert_4l --threads 1,2  # chosen models, full input sizes
python benchmarks/zoo.py --models yolov8n --small --s8s8 --out /tmp/zoo
python benchmarks/zoo.py --list
python benchmarks/zoo.py --small --timeout 480 --check        # the issue's bars as a gate: exit 1 when one fails

Each model runs in its own process (``zoo/runner.py``): build (export with random weights, ORT's
``quant_pre_process`` and ``quantize_static``, cached in ``--cache``), ORT's QDQ graph as written
(``ORT_DISABLE_ALL``) as the reference, ``tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")``,
output check, timing of tvm-lowprec vs ORT INT8 vs ORT FP32 (interleaved, quiesced) and the slowest
kernels. A model that raises, crashes, aborts or runs past ``--timeout`` is a row with the reason.
Output in ``--out``: ``report.md``, ``results.json``, ``results.csv``, ``report.png``, ``logs/<model>.log``.
"""

from __future__ import annotations

import argparse
import json
import datetime
import math
import sys
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the ``zoo`` and ``models`` packages and model_bench beside this file
try:
    import tvm_lowprec
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

import zoo  # noqa: E402  (the package benchmarks/zoo/, which wins over this file's own name)
from model_bench import COSINE_OK, PERTURBATION, git_revision  # noqa: E402
from tvm_lowprec.bench.cli_args import names_parser, parse_threads  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, cpu_info, llvm_host_cpu, load_average, package_version  # noqa: E402
from tvm_lowprec.bench.quiesce import thread_policy  # noqa: E402
from tvm_lowprec.bench.report import _bar_panels, json_safe, write_csv  # noqa: E402
from zoo.common import log  # noqa: E402
from zoo import checks, runner  # noqa: E402
from zoo.runner import RunConfig, run_isolated  # noqa: E402

RUNTIMES = {"tvm-lowprec": "tvm-lowprec INT8", "ort-int8": "ORT INT8", "ort-fp32": "ORT FP32"}
ZOO_PACKAGES = ("torch", "torchvision", "timm", "transformers", "ultralytics", "onnxscript", "tensorflow-cpu", "keras",
                "tf2onnx")
DEFAULT_TIMEOUT_S = 1200
QUICK_TIMEOUT_S = 600


def host_dir_name() -> str:
    """``zen4-epyc-2core`` style: the folder under benchmarks/results/ for this host."""
    cpu, info = llvm_host_cpu() or "cpu", cpu_info()
    base = f"zen{cpu[5:]}" if cpu.startswith("znver") else cpu.replace(" ", "_")
    if "EPYC" in info["model"]:
        base += "-epyc"
    elif "Xeon" in info["model"]:
        base += "-xeon"
    return f"{base}-{info['logical_cpus']}core"


def default_out() -> Path:
    return HERE / "results" / host_dir_name() / f"zoo-{datetime.date.today().isoformat()}"


# ---------------------------------------------------------------- rows and tables

_ms = checks.ms


def flat_row(result: dict, threads: list[int]) -> dict:
    """One CSV line per model."""
    row = {k: result.get(k) for k in ("model", "source", "size", "input", "status", "stage", "compile_s", "cosine",
                                      "steps", "max_abs_diff", "sensitivity_cosine", "sensitivity_steps",
                                      "cos_vs_ort_fp32", "export_s", "quantize_s", "nodes_int8", "target", "wall_s")}
    for t in threads:
        tvm, int8, fp32 = (_ms(result, r, t) for r in RUNTIMES)
        row.update({f"tvm_ms_{t}": tvm, f"ort_int8_ms_{t}": int8, f"ort_fp32_ms_{t}": fp32,
                    f"ratio_ort_int8_{t}": tvm / int8 if tvm and int8 else None,
                    f"ratio_ort_fp32_{t}": tvm / fp32 if tvm and fp32 else None})
    row["top_kernels"] = "; ".join(f"{k['name']} {k['ms']:.3g} ms" for k in _top(result))
    row["error"] = result.get("error", "")
    return row


def csv_fields(threads: list[int]) -> list[str]:
    fields = ["model", "source", "size", "input", "status", "stage", "compile_s", "cosine", "steps", "max_abs_diff",
              "sensitivity_cosine", "sensitivity_steps", "cos_vs_ort_fp32"]
    for t in threads:
        fields += [f"tvm_ms_{t}", f"ort_int8_ms_{t}", f"ort_fp32_ms_{t}", f"ratio_ort_int8_{t}", f"ratio_ort_fp32_{t}"]
    return fields + ["export_s", "quantize_s", "nodes_int8", "target", "wall_s", "top_kernels", "error"]


def _top(result: dict) -> list[dict]:
    """The slowest kernels of a result's profile (without the kernels listed for their copy cost alone)."""
    top = result.get("profile_top")
    return [k for k in top if not k.get("over_copy")] if isinstance(top, list) else []


def _num(value, fmt: str) -> str:
    return "—" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _ms_cell(value) -> str:
    return "—" if value is None else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")


def _steps(result: dict) -> str:
    steps = result.get("steps")
    if steps is None:
        return "—" if result.get("max_abs_diff") is None else f"abs {result['max_abs_diff']:.3g}"
    noise = result.get("sensitivity_steps")
    return f"{steps:.3g}" + (f" ({noise:.3g})" if noise is not None else "")


def _status(result: dict) -> str:
    status = result.get("status", "?")
    if status in ("ok", "mismatch"):
        return "ok" if status == "ok" else "**mismatch**"
    return f"{status} ({result.get('stage', '?')})"


def main_table(results: list[dict], threads: list[int]) -> list[str]:
    head = ["model", "input", "compile s", "cosine", "steps", "ORT INT8 cosine"]
    for t in threads:
        head += [f"tvm ms {t}t", f"ORT INT8 ms {t}t", f"÷ ORT INT8 {t}t"]
    head += [f"ORT FP32 ms {t}t" for t in threads] + ["status"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 3) + "---|"]
    for r in results:
        cells = [f"`{r['model']}`", r.get("input", f"size {r.get('size', '?')}"), _num(r.get("compile_s"), ".1f"),
                 _num(r.get("cosine"), ".6f"), _steps(r), _num(r.get("ort_spread"), ".6f")]
        for t in threads:
            tvm, int8 = _ms(r, "tvm-lowprec", t), _ms(r, "ort-int8", t)
            cells += [_ms_cell(tvm), _ms_cell(int8), f"{tvm / int8:.2f}x" if tvm and int8 else "—"]
        cells += [_ms_cell(_ms(r, "ort-fp32", t)) for t in threads] + [_status(r)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def kernel_lines(results: list[dict]) -> list[str]:
    lines = ["| model | # | kernel | op | intrinsic | ms | share | GOPS | % of copy bandwidth |",
             "|---|---:|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        for i, k in enumerate(_top(r), 1):
            fig = k.get("figures", {})
            lines.append(f"| `{r['model']}` | {i} | `{k['name'][:60]}` | {k['op']} | {k.get('intrinsic') or '—'} | "
                         f"{k['ms']:.3g} | {k['share'] * 100:.1f}% | {fig.get('GOPS') or '—'} | "
                         f"{fig.get('% copy') or '—'} |")
    return lines


def slow_lines(results: list[dict]) -> list[str]:
    lines = ["| model | kernel | ms | share | % of copy bandwidth |", "|---|---|---:|---:|---:|"]
    for r in results:
        for k in r.get("profile_top") if isinstance(r.get("profile_top"), list) else []:
            if runner.over_copy_cost(k):
                lines.append(f"| `{r['model']}` | `{k['name'][:60]}` | {k['ms']:.3g} | {k['share'] * 100:.1f}% | "
                             f"{k['pct_copy']:.1f}% |")
    return lines


def failure_lines(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        if r.get("error"):
            lines.append(f"- `{r['model']}` ({r.get('status')}, stage {r.get('stage')}): `{r['error'][:500]}`")
        if r.get("time_error"):
            lines.append(f"- `{r['model']}`: timing failed: `{r['time_error']}`")
    return lines


def header(meta: dict) -> list[str]:
    cpu = meta["host"]["cpu"]
    flags = ", ".join(f for f, on in cpu["flags"].items() if on) or "none"
    v = meta["versions"]
    zoo_versions = " · ".join(f"{k} {ver}" for k, ver in meta["zoo_versions"].items() if ver)
    opts = meta["options"]
    return [
        "# Model zoo: ONNX Runtime-quantized models on tvm-lowprec", "",
        f"{meta['date']} · **{cpu['model']}** (LLVM: `{meta['target']['llvm_host_cpu']}`, {cpu['logical_cpus']} "
        f"logical CPUs; {flags}) · tvm-lowprec @ {meta['git']} · TVM {v['tvm']} · ONNX Runtime {v['onnxruntime']} · "
        f"onnx {v['onnx']} · {zoo_versions}", "",
        f"Exporter: {'torch.onnx.export dynamo (default)' if opts['dynamo'] else 'torch.onnx.export dynamo=False'} "
        f"(Ultralytics: its own `model.export`; Keras: `tf2onnx.convert.from_keras`, opset 17); quantization: ORT `quant_pre_process` + `quantize_static` "
        f"{opts['fmt']}, per-channel {'7-bit (reduce_range)' if opts.get('reduce_range') else 'int8'} weights, "
        f"{'int8' if opts['s8s8'] else 'uint8'} activations, MinMax on "
        f"{opts['calibration']} random inputs; random weights everywhere. "
        + ("**tvm-lowprec runs its own `tvm_lowprec.quantize` of the FP32 export** (same calibration inputs; "
           "status: cosine against ORT FP32 >= 0.99); ORT INT8 runs ORT's file. "
           if opts.get("quantizer") == "tvm_lowprec" else "") + "Load average at start "
        f"{meta['loadavg_start']}, at end {meta['loadavg_end']}.", "",
        "Each model ran in its own process. `cosine`/`steps`: tvm-lowprec's output against ONNX Runtime running the "
        "same QDQ file as written (`ORT_DISABLE_ALL`); steps = largest difference in the output's quantization step "
        f"(in parentheses: how far ORT's own QDQ output moves when the input is scaled by 1 + {PERTURBATION:g}·N(0,1), "
        f"the rounding-noise floor; `abs`: the output is float after the last DequantizeLinear, absolute difference). "
        "`ORT INT8 cosine`: ONNX Runtime's own optimized INT8 run (the one timed) against the same graph as written: "
        "low where its kernels are not exact (on CPUs without VNNI its u8s8 kernel saturates pairs of full-range "
        "weight products). "
        f"Status `mismatch`: cosine < 0.999 (and < {COSINE_OK}) and further than that noise floor. ms: median per call through "
        "`Compiled.__call__` / `session.run`, batch 1, timed interleaved (tvm_lowprec.bench.timing."
        "measure_interleaved, quiesced), each runtime with its default thread policy; `÷ ORT INT8`: tvm-lowprec ms "
        "divided by ORT INT8 ms (ORT with its default graph optimizations: fused QLinear kernels), below 1 = "
        "tvm-lowprec faster.", "",
    ]


def render(results: list[dict], meta: dict, threads: list[int], plot: bool) -> str:
    lines = header(meta) + main_table(results, threads) + ["", checks.geomean_line(results, threads), ""]
    kernels = kernel_lines(results)
    if len(kernels) > 2:
        lines += ["## Slowest tvm-lowprec kernels (1 thread, each timed alone: `Compiled.profile(isolated=True)`)",
                  "", *kernels, ""]
    slow = slow_lines(results)
    if len(slow) > 2:
        lines += [f"## Kernels over {runner.COPY_COST_LIMIT:g}x their bytes' cost at copy bandwidth (not GEMMs, "
                  f"at least {runner.SLOW_MIN_MS * 1e3:g} us; 1 thread, each timed alone)", "", *slow, ""]
    unscheduled = [f"- `{r['model']}`: {', '.join(f'`{n}`' for n in r['unscheduled'])}" for r in results
                   if r.get("unscheduled")]
    if unscheduled:
        lines += ["## Kernels left unscheduled (`lowprec.schedule` none: serial, scalar loops)", "", *unscheduled, ""]
    failures = failure_lines(results)
    if failures:
        lines += ["## Failures", "", *failures, ""]
    peak = meta.get("peak_gops")
    failed = checks.check_lines(results, threads, peak)
    lines += ["## Checks (`--check` exits 1 when any fails)", "",
              f"Bars by class (ORT INT8 ms / tvm-lowprec ms, every thread count): "
              + ", ".join(f"{tag} {bar:g}x" for tag, bar in checks.CLASS_BARS.items())
              + f" (a model with several tags: the highest); a CNN, detector or segmenter whose GEMM/conv work ORT runs "
              f"above {100 * checks.NEAR_PEAK:g}% of the instruction's one-thread peak ({_peak_text(meta)}; ORT's "
              f"GOPS from its profiler at 1 thread: `ort_gemm`) {checks.NEAR_PEAK_BAR:g}x; every model "
              f"{checks.MIN_RATIO:g}x; geometric mean {checks.MIN_GEOMEAN:g}x.", "",
              *class_lines(results, peak), "",
              *([f"- {c}" for c in failed] or ["All passed: every model ok and at its class's bar, geometric mean at "
                                               f"least {checks.MIN_GEOMEAN:g}x, no kernel unscheduled or over the "
                                               "copy-cost limit."]), ""]
    if plot:
        lines += ["![tvm-lowprec latency / ONNX Runtime latency](report.png)", ""]
    return "\n".join(lines)


def _peak_text(meta: dict) -> str:
    if meta.get("peak_gops"):
        return f"{meta['peak_gops']:.0f} GOPS, {meta.get('peak_source', '')}"
    return f"not measured: {meta.get('peak_source', 'no peak')}; the class bars stand"


def class_lines(results: list[dict], peak: float | None) -> list[str]:
    """Each model's class bar and ONNX Runtime's GEMM/conv rate behind it, as a table."""
    rows = ["| model | tags | ORT GEMM/conv GOPS (1 thread) | % of peak | bar |", "|---|---|---:|---:|---:|"]
    for r in results:
        gops, share, bar = checks.ort_gemm_gops(r), checks.ort_gemm_share(r, peak), checks.class_bar(r, peak)[0]
        rows.append(f"| `{r['model']}` | {', '.join(r.get('tags') or ()) or '—'} | "
                    f"{f'{gops:.0f}' if gops else '—'} | {f'{100 * share:.0f}%' if share is not None else '—'} | "
                    f"{bar:g}x |")
    return rows


def gemm_peak() -> tuple[float | None, str]:
    """The GEMM instruction's one-thread GOPS on this host (``matmul_grid.measure_gemm_peak``: its peak
    program, built with gcc), or None and why not."""
    from matmul_grid import measure_gemm_peak

    try:
        return measure_gemm_peak()
    except (SystemExit, Exception) as err:  # noqa: BLE001 - no gcc, no program for the row: the bars stand
        return None, f"peak not measured ({err})"


def write_ratio_plot(results: list[dict], threads: list[int], path: Path) -> bool:
    models = [r["model"] for r in results]
    panels = []
    for t in threads:
        series = {}
        for runtime in ("ort-int8", "ort-fp32"):
            values = []
            for r in results:
                tvm, other = _ms(r, "tvm-lowprec", t), _ms(r, runtime, t)
                values.append(tvm / other if tvm and other else math.nan)
            series[f"tvm-lowprec ÷ {RUNTIMES[runtime]}"] = values
        panels.append((f"{t} thread(s): latency ratio, below 1 = tvm-lowprec faster", series, None))
    return _bar_panels(path, panels, models, "tvm-lowprec ms ÷ ORT ms", "rows", rotate=True)


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=names_parser(zoo.REGISTRY, "model"), default=None,
                        help=f"comma-separated (default: all but bert_tiny; --quick: {','.join(zoo.QUICK)})")
    parser.add_argument("--quick", action="store_true",
                        help="the quick models at their reduced input sizes, short timing, 600 s timeout")
    parser.add_argument("--small", action="store_true", help="reduced input sizes (implied by --quick)")
    parser.add_argument("--size", type=int, default=None, help="input size for every model (image side / sequence)")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2], help="comma-separated (default: 1,2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: benchmarks/results/<host>/zoo-<date>)")
    parser.add_argument("--cache", type=Path, default=zoo.DEFAULT_CACHE, help=f"built files (default {zoo.DEFAULT_CACHE})")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"seconds per model process (default {DEFAULT_TIMEOUT_S}, {QUICK_TIMEOUT_S} with --quick)")
    parser.add_argument("--torchscript", action="store_true", help="export with torch.onnx.export(dynamo=False)")
    parser.add_argument("--quant-format", choices=("QDQ", "QOperator"), default="QDQ")
    parser.add_argument("--s8s8", action="store_true", help="int8 activations (default uint8)")
    parser.add_argument("--reduce-range", action="store_true",
                        help="7-bit weights (ORT's reduce_range: its advice for CPUs without VNNI, where its u8s8 "
                             "kernel saturates full-range weights)")
    parser.add_argument("--calibration", type=int, default=4, help="random calibration inputs (1-8, default 4)")
    parser.add_argument("--quantizer", choices=("ort", "tvm_lowprec"), default="ort",
                        help="who quantizes what tvm-lowprec runs: ORT's quantize_static file (checked against ORT "
                             "running it), or tvm_lowprec.quantize of the FP32 export on the same calibration inputs "
                             "(checked against ORT FP32: cosine >= 0.99); ORT INT8 is ORT's file either way")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-kernel profile")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--render", type=Path, default=None, metavar="DIR",
                        help="write DIR/report.md again from DIR/results.json (a run's results, this report's code) and exit")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a check fails (a model not ok or under its class's bar, the geometric mean "
                             "under 1.5x, a kernel unscheduled or over the copy-cost limit): the report's Checks section")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for name, m in zoo.REGISTRY.items():
            print(f"{name:30s} {m.source:13s} {m.size:5d} / {m.small_size:4d}  {m.description}")
        return 0
    if args.render is not None:
        saved = json.loads((args.render / "results.json").read_text())
        meta, results = saved["metadata"], saved["results"]
        return write_report(args.render, results, meta, (args.render / "report.png").exists(), args.check)
    models = args.models or list(zoo.QUICK if args.quick else zoo.DEFAULT)
    timeout = args.timeout or (QUICK_TIMEOUT_S if args.quick else DEFAULT_TIMEOUT_S)
    out = (args.out or default_out()).resolve()  # the model processes run elsewhere: an absolute path
    out.mkdir(parents=True, exist_ok=True)
    config = RunConfig(cache=str(args.cache), small=args.small or args.quick, size=args.size,
                       dynamo=not args.torchscript, fmt=args.quant_format, s8s8=args.s8s8, reduce_range=args.reduce_range,
                       calibration=args.calibration, threads=args.threads, timing="quick" if args.quick else "default",
                       profile=not args.no_profile, quantizer=args.quantizer)
    load_start, git_start = load_average(), git_revision(HERE.parent)
    peak_gops, peak_source = gemm_peak() if not args.no_profile else (None, "no profile (--no-profile)")
    results = []
    for name in models:
        log(f"== {name} ({zoo.REGISTRY[name].description})")
        result = run_isolated(name, config, timeout, out / "logs" / f"{name}.log")
        log(f"== {name}: {result.get('status')} {result.get('error', '')[:200]} ({result.get('wall_s')} s)")
        results.append(result)
    meta = collect_metadata(benchmark="model zoo", models=models, threads=args.threads, timeout_s=timeout,
                            options=asdict(config), git=git_start, loadavg_start=load_start,
                            zoo_versions={p: package_version(p) for p in ZOO_PACKAGES},
                            thread_policy=thread_policy())
    meta["options"] = {**asdict(config)}
    meta.update(peak_gops=peak_gops, peak_source=peak_source)
    (out / "results.json").write_text(json.dumps(json_safe({"metadata": meta, "results": results}), indent=2) + "\n")
    write_csv([flat_row(r, args.threads) for r in results], out / "results.csv", csv_fields(args.threads))
    plotted = write_ratio_plot(results, args.threads, out / "report.png")
    return write_report(out, results, meta, plotted, args.check)


def write_report(out: Path, results: list[dict], meta: dict, plotted: bool, check: bool) -> int:
    """``out/report.md`` from a run's results and metadata, printed; the exit status: 1 where ``check``
    and a bar fails (:func:`checks.check_lines`)."""
    report = render(results, meta, meta["threads"], plotted)
    (out / "report.md").write_text(report + "\n")
    print(report)
    return 1 if check and checks.check_lines(results, meta["threads"], meta.get("peak_gops")) else 0


if __name__ == "__main__":
    sys.exit(main())
