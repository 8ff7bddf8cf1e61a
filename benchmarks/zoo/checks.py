"""The zoo's bars as checks on a run's results (``benchmarks/zoo.py --check``, its report's Checks section):
no timing here, only the results a run wrote."""

from __future__ import annotations

import statistics

from .runner import over_copy_cost


def ms(result: dict, runtime: str, threads: int) -> float | None:
    """A runtime's median ms at ``threads`` in a model's result, or None."""
    cell = (result.get("times") or {}).get(str(threads), {}).get(runtime)
    return cell["ms"] if cell else None


# the bars for the zoo (ORT INT8 ms / tvm-lowprec ms): every model at least 1.0x, the geometric mean
# at least 1.5x, at every thread count measured
MIN_RATIO, MIN_GEOMEAN = 1.0, 1.5


def check_lines(results: list[dict], threads: list[int]) -> list[str]:
    """What ``--check`` fails on, one line each (none: the zoo passes): a model not ok, a kernel left
    unscheduled, a kernel over the copy-cost limit, a model slower than ``MIN_RATIO`` x ONNX Runtime INT8,
    a geometric mean under ``MIN_GEOMEAN``."""
    failed = []
    for r in results:
        if r.get("status") != "ok":
            failed.append(f"`{r['model']}`: status {r.get('status')} ({r.get('stage')})")
        if r.get("unscheduled"):
            failed.append(f"`{r['model']}`: unscheduled kernels {', '.join(r['unscheduled'])}")
        for k in r.get("profile_top") if isinstance(r.get("profile_top"), list) else []:
            if over_copy_cost(k):
                failed.append(f"`{r['model']}`: `{k['name'][:60]}` at {k['pct_copy']:.1f}% of copy bandwidth")
    for t in threads:
        ratios = {}
        for r in results:
            tvm, int8 = ms(r, "tvm-lowprec", t), ms(r, "ort-int8", t)
            if tvm and int8:
                ratios[r["model"]] = int8 / tvm
        failed += [f"`{m}`: {v:.2f}x ORT INT8 at {t} thread(s) (bar {MIN_RATIO:g}x)" for m, v in ratios.items()
                   if v < MIN_RATIO]
        if ratios and statistics.geometric_mean(ratios.values()) < MIN_GEOMEAN:
            failed.append(f"geometric mean {statistics.geometric_mean(ratios.values()):.2f}x at {t} thread(s) "
                          f"(bar {MIN_GEOMEAN:g}x)")
    return failed


def geomean_line(results: list[dict], threads: list[int]) -> str:
    parts = []
    for t in threads:
        ratios = [ms(r, "ort-int8", t) / ms(r, "tvm-lowprec", t) for r in results
                  if ms(r, "ort-int8", t) and ms(r, "tvm-lowprec", t)]
        if ratios:
            parts.append(f"{statistics.geometric_mean(ratios):.2f}x at {t} thread(s) ({len(ratios)} models)")
    return "Geometric mean of ORT INT8 ms / tvm-lowprec ms: " + "; ".join(parts) + "." if parts else ""
