#!/usr/bin/env python
"""Calibration cost per sample against one ONNX Runtime FP32 inference (issue 15, item 4).

Examples
--------
python benchmarks/calibration_bench.py                    # encoder and cnn, 8 samples each
python benchmarks/calibration_bench.py --models encoder --samples 4 --out /tmp/calib

For each model: ``tvm_lowprec.ptq.observe`` (what ``quantize`` runs: the FP32 model compiled with every
layer's input and output as extra outputs, run on each sample, each observed tensor's statistics
updated) on the benchmark's calibration samples, timed as a whole, with the compile timed apart; then
ORT FP32 on the same samples (default threads, like the calibration model's ``num_threads``), before
and after, the median of the calls. Per sample: the median model call plus the median statistics update
(``calibrate._update``); once per calibration: the compile and the preparation. Writes ``calibration.md`` and
``calibration.json`` into ``--out`` (default ``benchmarks/results/models``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import tvm_lowprec
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from models.build import DEFAULT_CACHE, MODELS, calibration_samples, ensure_model

from tvm_lowprec.bench.hostinfo import collect_metadata, load_average
from tvm_lowprec.compiled import Compiled

calibrate = importlib.import_module("tvm_lowprec.ptq.calibrate")  # the module (its _update is timed)
from tvm_lowprec.ptq.quantize import observe


class _Clock:
    """Times ``tvm_lowprec.compile``, every call of a compiled module and every statistics update of a
    sample (``calibrate._update``) while installed."""

    def __init__(self):
        self.compile_s, self.calls, self.updates = 0.0, [], []

    def __enter__(self):
        self._compile, self._call, self._update = tvm_lowprec.compile, Compiled.__call__, calibrate._update
        clock = self

        def update(*args, **kwargs):
            start = time.perf_counter()
            out = clock._update(*args, **kwargs)
            clock.updates.append(time.perf_counter() - start)
            return out

        def compile_(*args, **kwargs):
            start = time.perf_counter()
            out = clock._compile(*args, **kwargs)
            clock.compile_s += time.perf_counter() - start
            clock.unscheduled = [k.name for k in out.kernels() if k.schedule == "none"]
            return out

        def call(self_, *args, **kwargs):
            start = time.perf_counter()
            out = clock._call(self_, *args, **kwargs)
            clock.calls.append(time.perf_counter() - start)
            return out

        tvm_lowprec.compile, Compiled.__call__, calibrate._update = compile_, call, update
        return self

    def __exit__(self, *exc):
        tvm_lowprec.compile, Compiled.__call__, calibrate._update = self._compile, self._call, self._update


def _ort_ms(path, samples) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session.run(None, samples[0])
    times = []
    for sample in samples:
        start = time.perf_counter()
        session.run(None, sample)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(name: str, count: int) -> dict:
    built = ensure_model(MODELS[name], DEFAULT_CACHE)
    samples = (calibration_samples(built.spec) * count)[:count]
    mod = tvm_lowprec.from_onnx(str(built.fp32_path), shape_dict=built.spec.shape_dict)
    ort_before = _ort_ms(built.fp32_path, samples)
    with _Clock() as clock:
        start = time.perf_counter()
        observe(mod, samples, progress=False)
        total = time.perf_counter() - start
    ort_after = _ort_ms(built.fp32_path, samples)
    run = statistics.median(clock.calls) * 1e3
    stats = statistics.median(clock.updates) * 1e3
    per_sample = run + stats
    fixed = total - clock.compile_s - (sum(clock.calls) + sum(clock.updates))
    ort_ms = (ort_before + ort_after) / 2
    return {"model": name, "samples": len(samples), "compile_s": clock.compile_s, "fixed_s": fixed,
            "per_sample_ms": per_sample, "run_ms": run, "stats_ms": stats, "ort_fp32_ms": ort_ms,
            "ratio": per_sample / ort_ms, "run_ratio": run / ort_ms, "unscheduled": clock.unscheduled}


def render(rows: list[dict], meta: dict, load: tuple) -> str:
    lines = ["# Calibration cost per sample vs ONNX Runtime FP32", "",
             (f"{meta.get('date', '')} · {meta['host']['cpu']['model']} ({meta['host']['cpu']['logical_cpus']} logical CPUs) · load average at start {load[0]}, at end {load[1]} "
              "(a shared host: other processes on these cores distort both sides)."), "",
             ("`observe` = what `quantize` runs to calibrate. Per sample (medians): the compiled calibration "
              "model's call (`run`) and the statistics update of its observed tensors (`stats`: the NaN check "
              "and each tensor's `TensorStats.update`). Once per calibration, apart: the compile, and the rest "
              "(`prepare`: BatchNorm folding, finding the layers, adding the observed outputs). ORT FP32: one "
              "inference of the FP32 model, median, default threads."), "",
             ("| model | samples | compile (s) | prepare (s) | per sample (ms) | of which run (ms) | stats (ms) | "
              "ORT FP32 (ms) | per sample ÷ ORT | run ÷ ORT | unscheduled kernels |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['samples']} | {r['compile_s']:.1f} | {r['fixed_s']:.1f} | {r['per_sample_ms']:.1f} | "
                     f"{r['run_ms']:.1f} | {r['stats_ms']:.1f} | {r['ort_fp32_ms']:.1f} | {r['ratio']:.2f}x | "
                     f"{r['run_ratio']:.2f}x | {', '.join(r['unscheduled']) or 'none'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder,cnn", help="comma-separated (default: encoder,cnn)")
    parser.add_argument("--samples", type=int, default=8, help="calibration samples per model (default 8)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "models")
    args = parser.parse_args(argv)
    load_start = load_average()
    rows = [measure(name, args.samples) for name in args.models.split(",")]
    meta = collect_metadata()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.md").write_text(render(rows, meta, (load_start, load_average())))
    (args.out / "calibration.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    print(render(rows, meta, (load_start, load_average())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
