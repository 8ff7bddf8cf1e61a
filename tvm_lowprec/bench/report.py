"""Writers for benchmark results: CSV, JSON (rows + metadata), a Markdown report and an optional plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

CSV_FIELDS = ("benchmark", "threads", "M", "N", "K", "provider", "status", "seconds", "gops",
              "max_diff_vs_ort", "timer", "number", "repeat", "target", "reason")
_MEASURED = ("ok", "mismatch")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def json_safe(value):
    """NaN and infinities become ``None`` (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
        return json_safe(value.item())
    return value


def write_csv(rows: list[dict], path: Path, fields=CSV_FIELDS) -> None:
    """One line per point, columns ``fields`` (NaN written as an empty cell)."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: ("" if value is None else value) for key, value in json_safe(row).items()})


def write_json(rows: list[dict], meta: dict, path: Path) -> None:
    """``{"metadata": meta, "results": rows}``, indented."""
    path.write_text(json.dumps(json_safe({"metadata": meta, "results": rows}), indent=2) + "\n")


# ---------------------------------------------------------------- Markdown

def markdown_table(head: list[str], rows: list[list], text_columns: int = 1) -> list[str]:
    """A Markdown table's lines: ``head``, then ``rows`` (cells as ``str``), the first ``text_columns``
    left-aligned and the rest right-aligned (numbers)."""
    align = "|" + "---|" * text_columns + "---:|" * (len(head) - text_columns)
    return ["| " + " | ".join(head) + " |", align] + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _fmt(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    if row["status"] == "skipped":
        return "n/a"
    if row["status"] == "error":
        return "err"
    return _fmt(row["gops"]) + ("!" if row["status"] == "mismatch" else "")


def _columns(meta: dict) -> tuple[list[str], str | None, str | None]:
    """Provider columns, the main provider (None if not benchmarked) and the %-of-peak provider."""
    providers = list(meta["benchmark"]["providers"])
    main = meta["benchmark"]["main"] if meta["benchmark"]["main"] in providers else None
    peak_provider = (main or providers[0]) if meta.get("peak_gops_per_thread") else None
    return providers, main, peak_provider


def _ratio(num: dict | None, den: dict | None) -> str:
    if num is None or den is None or num["status"] not in _MEASURED or den["status"] not in _MEASURED:
        return "—"
    return f"{num['gops'] / den['gops']:.2f}"


def _host_predictions(meta: dict) -> dict[tuple[int, int, int], dict]:
    """Shape -> this host's llvm-mca prediction (empty without predictions)."""
    predictions = meta.get("predictions") or {}
    return {tuple(p["shape"]): p for p in predictions.get("host", [])}


def _predicted_pct(p: dict) -> float:
    """The micro-kernel's predicted fraction times the padding efficiency, in percent."""
    return 100.0 * p["fraction"] * p["padding_efficiency"]


def _table(rows: list[dict], meta: dict, threads: int) -> list[str]:
    providers, main, peak_provider = _columns(meta)
    label = "tvm" if main == "tvm-lowprec" else main
    peers = [p for p in providers if main and p != main]
    predicted = _host_predictions(meta) if main else {}
    header = ["M×N×K", *providers, *(f"{label} / {p}" for p in peers)]
    if peak_provider:
        header.append(f"% peak ({peak_provider})")
    roofline = any(p.get("with_memory") is not None for p in predicted.values())
    if predicted:
        cpus = sorted({p["mca_cpu"] for p in predicted.values()})
        header.append(f"predicted % peak (llvm-mca {', '.join(cpus)})")
        if peak_provider:
            header.append("model error (pp)")
        if roofline:
            header += [f"predicted with memory ({meta['read_gbs_per_thread']:.0f} GB/s)", "error (pp)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    by_point = {(r["M"], r["N"], r["K"], r["provider"]): r for r in rows if r["threads"] == threads}
    for shape in dict.fromkeys((r["M"], r["N"], r["K"]) for r in rows):
        point = {p: by_point.get((*shape, p)) for p in providers}
        cells = ["x".join(map(str, shape)), *(_cell(point[p]) for p in providers)]
        cells += [_ratio(point[main], point[p]) for p in peers]
        if peak_provider:
            cells.append(_peak_cell(point[peak_provider], meta["peak_gops_per_thread"] * threads))
        if predicted:
            p, measured = predicted.get(shape), point[main] if peak_provider else None
            peak = (meta.get("peak_gops_per_thread") or 0) * threads
            cells += _prediction_cells(_predicted_pct(p) if p else None, measured, peak, bool(peak_provider))
            if roofline:  # the bandwidth was measured for one thread: the column is for one thread only
                pct = 100.0 * p["with_memory"] if p and p.get("with_memory") is not None and threads == 1 else None
                cells += _prediction_cells(pct, measured, peak, True)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _peak_cell(row: dict | None, peak: float) -> str:
    if row is None or row["status"] not in _MEASURED:
        return "—"
    return f"{100.0 * row['gops'] / peak:.1f}%"


def _prediction_cells(pct: float | None, row: dict | None, peak: float, with_error: bool) -> list[str]:
    """A predicted % of peak and (when measured against a peak) predicted minus measured, in points."""
    if pct is None:
        return ["—", "—"] if with_error else ["—"]
    cells = [f"{pct:.1f}%"]
    if with_error:
        measured = row is not None and row["status"] in _MEASURED and peak
        cells.append(f"{pct - 100.0 * row['gops'] / peak:+.1f}" if measured else "—")
    return cells


def _tile(p: dict) -> str:
    mr, nr, kblock = p["tile"]
    return f"{mr}x{nr}" + (f"/k{kblock}" if kblock else "")


def _predicted_section(meta: dict) -> list[str]:
    """The rows this host cannot run, predicted by llvm-mca; and what the predictions are."""
    predictions = meta.get("predictions")
    if not predictions:
        return []
    lines = ["", "## Predicted by llvm-mca (static model of the micro-kernel's inner loop)", ""]
    if predictions.get("error"):
        return lines + [f"No predictions: {predictions['error']}"]
    lines += [
        "Predicted % of peak = (intrinsic instructions per iteration / llvm-mca cycles per iteration) / "
        "(intrinsic instructions per cycle of a synthetic block of independent accumulators on the same "
        "model), times the padding efficiency M·N·K / (Mp·Np·Kp). The model sees the loop body on the "
        "ports (loads, broadcasts, spills, dependency chains, dispatch width) and **ignores memory**: every "
        "load hits L1, and the epilogue, K-block C traffic and threading are outside it. The error column "
        "above is predicted minus measured, in percentage points of peak. Host predictions are for the "
        "row's first recipe (the one the benchmark's 7-bit weights take). *With memory*: a roofline, the "
        "slower of that micro-kernel and streaming the call's bytes (packed weights, activations, "
        "outputs) at one core's read bandwidth (this host: measured with `peak/read_bw.c` in the same run; "
        "the VNNI rows: the project's Zen 5 class machine, the row's `memory`).", ""]
    shapes = list(dict.fromkeys(tuple(p["shape"]) for p in predictions["rows"]))
    header = ["row", "llvm-mca CPU (model)", *("x".join(map(str, s)) for s in shapes)]
    lines += ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * len(shapes)]
    grouped: dict[tuple[str, str, str], dict] = {}
    for p in predictions["rows"]:
        grouped.setdefault((p["target"], p["mca_cpu"], p["sched_model"]), {})[tuple(p["shape"])] = p
    for (target, cpu, model), by_shape in grouped.items():
        cells = [_row_cell(by_shape[s]) if s in by_shape else "—" for s in shapes]
        lines.append(f"| {target} | {cpu} ({model}) | " + " | ".join(cells) + " |")
    return lines + ["", "Cells: predicted % of peak (tile mr x nr [/ K block]); then, after →, with memory."]


def _row_cell(p: dict) -> str:
    text = f"{_predicted_pct(p):.1f}% ({_tile(p)})"
    return text + (f" → {100.0 * p['with_memory']:.1f}%" if p.get("with_memory") is not None else "")


def _notes(rows: list[dict]) -> list[str]:
    """One bullet per distinct (provider, status, reason), listing where it happened."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r["reason"]:
            key = (r["provider"], r["status"], r["reason"])
            grouped.setdefault(key, []).append(f"{r['M']}x{r['N']}x{r['K']}@{r['threads']}t")
    lines = []
    for (provider, status, reason), where in grouped.items():
        points = sum(r["provider"] == provider for r in rows)
        place = "all points" if len(where) == points else ", ".join(where)
        lines.append(f"- `{provider}` {status} ({place}): {reason}")
    return lines


def _header(meta: dict) -> list[str]:
    cpu = meta["host"]["cpu"]
    flags = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in cpu["flags"].items())
    versions = ", ".join(f"{name} {version or 'not installed'}" for name, version in meta["versions"].items())
    target = meta["target"]
    compiled = "; ".join(meta.get("compiled_targets") or []) or "n/a"
    timing = meta["timing"]
    return [
        f"# {meta['benchmark']['name']}", "",
        f"- date: {meta['date']}",
        f"- host: {cpu['model']} ({cpu['logical_cpus']} logical CPUs); {flags}",
        f"- target: {target['requested']} (LLVM host CPU {target['llvm_host_cpu']}); compiled: {compiled}",
        f"- versions: {versions}",
        f"- numpy threads: {meta['numpy_threads']}",
        f"- load average (1/5/15 min) at start: {meta.get('loadavg_start')}, at end: {meta.get('loadavg_end')} "
        "(other work on these cores makes the figures noisy, multi-thread ones most)",
        f"- data: {meta.get('data', 'n/a')}",
        f"- metric: GOPS = 2·M·N·K / median seconds per call (median of {timing['repeat']} repeats, "
        f"each ≥ {timing['min_time']} s); ratio columns divide GOPS measured in this same run",
        "- timers: tvm-lowprec by TVM's time_evaluator (no Python overhead); the others by wall clock "
        "around one Python call (a few µs each, visible at M=1)",
    ]


def render_markdown(rows: list[dict], meta: dict) -> str:
    """The full report: header, one table per thread count, then notes on skipped/failed points."""
    lines = _header(meta)
    if meta.get("peak_gops_per_thread"):
        source = f" ({meta['peak_source']})" if meta.get("peak_source") else ""
        lines.append(f"- peak: {meta['peak_gops_per_thread']} GOPS per thread (times the thread count){source}")
    if meta.get("read_gbs_per_thread"):
        lines.append(f"- read bandwidth: {meta['read_gbs_per_thread']:.1f} GB/s, one thread (see the peak's source)")
    for threads in meta["threads"]:
        lines += ["", f"## threads = {threads}", "", *_table(rows, meta, threads)]
    lines += _predicted_section(meta)
    notes = _notes(rows)
    if notes:
        lines += ["", "Cells: `n/a` provider unavailable, `err` failed, `!` output differs from ORT "
                      "by more than one step.", "", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- plot

def _bar_panels(path: Path, panels: list[tuple[str, dict[str, list[float]], float | None]], groups: list[str],
                ylabel: str, layout: str, rotate: bool = False) -> bool:
    """Grouped bars (log scale) in one panel per ``(title, {series label: one value per group},
    ceiling)``, panels stacked (``layout="rows"``) or side by side (``"columns"``); a dashed line at
    ``ceiling`` where it is given. False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    n = len(panels)
    shape, size = ((n, 1), (max(8, len(groups)), 4 * n)) if layout == "rows" else ((1, n), (4 + 2.5 * len(groups) * n, 4))
    fig, axes = plt.subplots(*shape, figsize=size, squeeze=False)
    for ax, (title, series, ceiling) in zip(axes.ravel(), panels):
        width = 0.8 / max(1, len(series))
        for i, (label, values) in enumerate(series.items()):
            ax.bar([x + i * width for x in range(len(groups))], values, width, label=label)
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1, label="instruction ceiling")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))])
        ax.set_xticklabels(groups, rotation=45 if rotate else 0, ha="right" if rotate else "center")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_plot(rows: list[dict], meta: dict, path: Path) -> bool:
    """Grouped bar chart of GOPS per shape, one panel per thread count, with the instruction ceiling the
    report's % of peak divides by (when known); False if matplotlib is missing."""
    shapes = list(dict.fromkeys((r["M"], r["N"], r["K"]) for r in rows))
    gops = {(r["threads"], r["provider"], r["M"], r["N"], r["K"]): r["gops"] for r in rows if r["status"] in _MEASURED}
    peak = meta.get("peak_gops_per_thread")
    panels = [(f"threads = {t}", {p: [gops.get((t, p, *s), math.nan) for s in shapes] for p in meta["benchmark"]["providers"]},
               peak * t if peak else None) for t in meta["threads"]]
    return _bar_panels(path, panels, ["x".join(map(str, s)) for s in shapes], "GOPS", "rows", rotate=True)


def write_latency_plot(rows: list[dict], models: list[str], runtimes: dict[str, str], threads: list[int],
                       path: Path) -> bool:
    """Latency per model and runtime (bars, log scale), one panel per thread count; False without
    matplotlib. ``rows``: dicts with ``model``, ``runtime``, ``threads``, ``status`` and ``ms``;
    ``runtimes``: runtime -> label, in bar order."""
    ms = {(r["model"], r["runtime"], r["threads"]): r["ms"] for r in rows if r.get("status") in _MEASURED}
    panels = [(f"{t} thread(s)", {label: [ms.get((m, runtime, t), math.nan) for m in models]
                                  for runtime, label in runtimes.items()}, None) for t in threads]
    return _bar_panels(path, panels, models, "ms per inference (lower is better)", "columns")


def write_reports(rows: list[dict], meta: dict, out_dir: Path) -> Path:
    """Write ``results.csv``, ``results.json``, ``report.md`` and (if possible) ``report.png``.

    Returns
    -------
    pathlib.Path
        The Markdown report.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / "results.csv")
    write_json(rows, meta, out_dir / "results.json")
    report = out_dir / "report.md"
    report.write_text(render_markdown(rows, meta))
    write_plot(rows, meta, out_dir / "report.png")
    return report


# ---------------------------------------------------------------- per-kernel profile

def format_bytes(nbytes: int | None) -> str:
    """A kernel's bytes per call for a table, two digits: ``512 B``, ``4.7 KiB``, ``36 KiB``, ``1.5 MiB``;
    ``""`` when unknown."""
    if nbytes is None:
        return ""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{nbytes} B"


def profile_figures(row: dict, empty: str = "") -> dict[str, str]:
    """The figures of one :meth:`Compiled.profile <tvm_lowprec.Compiled.profile>` row as table cells,
    shared by ``tvm-lowprec run`` and the benchmarks' reports: ``GOPS`` (GEMMs), ``bytes`` per call and
    ``GB/s`` (every kernel), ``% copy`` (the others: % of the copy bandwidth at their size,
    :mod:`~tvm_lowprec.bench.bandwidth`); ``empty`` where a figure does not apply."""
    pct = row.get("pct_copy")
    return {"GOPS": empty if row.get("gops") is None else f"{row['gops']:.1f}",
            "bytes": format_bytes(row.get("bytes")) or empty,
            "GB/s": empty if row.get("gbs") is None else f"{row['gbs']:.1f}",
            "% copy": empty if pct is None else f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"}
