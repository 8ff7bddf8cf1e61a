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
# and by class (a model's tags; a model with several takes the highest): CNNs, detectors and segmenters at
# least 1.5x, unless ONNX Runtime's own GEMM/conv work runs above NEAR_PEAK of the instruction's one-thread
# peak (measured in the run: ``ort_gemm``), then at least NEAR_PEAK_BAR; transformers at least 1.3x
CLASS_BARS = {"cnn": 1.5, "detector": 1.5, "segmentation": 1.5, "transformer": 1.3}
NEAR_PEAK, NEAR_PEAK_BAR = 0.60, 1.1


def ort_gemm_gops(result: dict) -> float | None:
    """ONNX Runtime's GEMM/conv GOPS at one thread (the run's ``ort_gemm``), or None."""
    return (result.get("ort_gemm") or {}).get("gops") if isinstance(result.get("ort_gemm"), dict) else None


def ort_gemm_share(result: dict, peak_gops: float | None) -> float | None:
    """:func:`ort_gemm_gops` over ``peak_gops``; None where either is unknown."""
    gops = ort_gemm_gops(result)
    return gops / peak_gops if gops and peak_gops else None


def class_bar(result: dict, peak_gops: float | None) -> tuple[float, str]:
    """The ratio a model must reach by its class, and why: the highest of its tags' :data:`CLASS_BARS`,
    and for a model that is only CNN/detector/segmenter :data:`NEAR_PEAK_BAR` where ONNX Runtime's GEMM
    work is above :data:`NEAR_PEAK` of the peak. Where that share is unknown (no peak program, no ORT
    profile) the class bar stands. Never below :data:`MIN_RATIO` (every model's bar)."""
    tags = [t for t in result.get("tags") or () if t in CLASS_BARS]
    if not tags:
        return MIN_RATIO, "every model"
    bar, tag = max((CLASS_BARS[t], t) for t in tags)
    share = ort_gemm_share(result, peak_gops)
    if "transformer" not in tags and share is not None and share > NEAR_PEAK:
        bar, tag = NEAR_PEAK_BAR, f"{tag}, ORT's GEMM work at {100 * share:.0f}% of peak"
    elif share is not None:
        tag += f", ORT's GEMM work at {100 * share:.0f}% of peak"
    return max(bar, MIN_RATIO), tag


def check_lines(results: list[dict], threads: list[int], peak_gops: float | None = None) -> list[str]:
    """What ``--check`` fails on, one line each (none: the zoo passes): a model not ok, a kernel left
    unscheduled, a kernel over the copy-cost limit, a model slower than ``MIN_RATIO`` x ONNX Runtime INT8
    or under its class's bar (:func:`class_bar`; ``peak_gops``: the GEMM instruction's one-thread peak),
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
        bars = {r["model"]: class_bar(r, peak_gops) for r in results}
        for m, v in ratios.items():
            bar, why = bars[m]
            if v < bar:
                failed.append(f"`{m}`: {v:.2f}x ORT INT8 at {t} thread(s) (bar {bar:g}x: {why})")
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
