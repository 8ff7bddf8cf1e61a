#!/usr/bin/env python
"""Post-training quantization accuracy: tvm-lowprec's ``quantize`` against ONNX Runtime's
``quantize_static``, on the same FP32 models and the same calibration inputs.

Both quantize the reference models (``benchmarks/models``: encoder, CNN, MiniLM) per-channel int8
weights / uint8 activations. ORT uses MinMax; tvm-lowprec runs MinMax (like for like) and its other
activation observers (Percentile, Entropy, MSE) from one shared calibration pass. The figure is the
SQNR of the final output against the FP32 model (ORT FP32) on held-out inputs; ORT's QDQ model runs
as written (``ORT_DISABLE_ALL``: exactly the QDQ arithmetic, without its AVX2 kernels' saturation),
tvm-lowprec's quantized module runs as compiled integer kernels. Per-layer reports of tvm-lowprec's
MinMax model are written too.

    python benchmarks/ptq_bench.py                    # all three; results in benchmarks/results/ptq/
    python benchmarks/ptq_bench.py --models cnn --calibration 4

``--int4`` compares weight-only 4-bit matmul weights instead (activations stay float; int4 symmetric,
one scale per group of 128 or 32 weights along K), rounded to nearest (RTN) or by GPTQ, against
weight-only int8 per-channel, on the transformer models (their matmuls; results in
benchmarks/results/ptq-int4/)::

    python benchmarks/ptq_bench.py --int4                       # minilm and encoder
    python benchmarks/ptq_bench.py --int4 --models minilm --calibration 16

``--fallback DB`` quantizes with ``QuantConfig(target_sqnr=DB)`` (default int8 settings) and reports each
output's SQNR on held-out inputs, the layers kept in FP32, whether the target holds on every output,
and the latencies of ONNX Runtime FP32 and of our FP32, int8 and mixed models, timed interleaved at 1
and 2 threads (results in
benchmarks/results/ptq-fallback/)::

    python benchmarks/ptq_bench.py --fallback 20 --models minilm
    python benchmarks/ptq_bench.py --fallback 20 --models minilm --keep LAYER[,LAYER]   # skip the search

``--dead-channels`` measures the two treatments of output channels whose bias does not fit int32 at
``s_x * s_w``, on the DBNet-style text detector (``models/textdet.py``, 1x3x96x96) with the
BatchNormalization scale of 2 channels of every BN set to 1e-9 and its shift to 1.0 (after folding:
near-zero weights, bias ~1): quantize's default (that channel's weight scale widened, as ONNX
Runtime does) against the scales as calibrated with the layer left in float QDQ arithmetic, and ORT's
``quantize_static`` (results in benchmarks/results/ptq-dead-channels/)::

    python benchmarks/ptq_bench.py --dead-channels

``--export`` writes each model's quantization (``quantize`` with the host's default config) as an ONNX QDQ
file (``tvm_lowprec.ptq.export_onnx``) and compares the SQNR against FP32 of ONNX Runtime running that
file (as written, and with its own fused kernels) with tvm-lowprec's compiled model, on held-out inputs
(results in benchmarks/results/ptq-export/)::

    python benchmarks/ptq_bench.py --export

MiniLM is fed sentence-shaped token ids: [CLS], 6 to 40 ids from the word range of its
(bert-base-uncased) vocabulary, [SEP], then padding with a zero attention mask. No tokenizer with that
vocabulary can be installed here (PyPI has none that ships it), so the ids are drawn, not tokenised.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import tvm_lowprec
except ImportError:
    sys.path.insert(0, str(HERE.parent))
    import tvm_lowprec

from models.build import DEFAULT_CACHE, MODELS, ModelUnavailable, ensure_model  # noqa: E402
from models.quantize import quantize_qdq  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata  # noqa: E402
from tvm_lowprec.bench.providers import ort_session  # noqa: E402
from tvm_lowprec.bench.report import json_safe, write_csv  # noqa: E402
from tvm_lowprec.ptq import (GPTQ, MSE, RTN, Entropy, MinMax, PerChannel, PerGroup, Percentile, QuantConfig,  # noqa: E402
                             QuantSpec, accuracy_report, observe, quantize)

OBSERVERS = {"MinMax": MinMax(), "Percentile 99.99": Percentile(99.99), "Entropy": Entropy(), "MSE": MSE()}
CLS, SEP, WORDS = 101, 102, (1996, 29612)  # bert-base-uncased: special tokens and its word-piece range
CAL_SEED, HELD_SEED = 11, 12


def sentence_ids(rng: np.random.Generator, seq: int) -> dict[str, np.ndarray]:
    length = int(rng.integers(6, 41))
    ids = np.zeros((1, seq), np.int64)
    ids[0, : length + 2] = [CLS, *rng.integers(*WORDS, size=length), SEP]
    mask = (ids != 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def samples(spec, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    if spec.name == "minilm":
        return [sentence_ids(rng, spec.inputs[0].shape[1]) for _ in range(n)]
    return [{i.name: i.draw(rng) for i in spec.inputs} for _ in range(n)]


def sqnr(refs: list[np.ndarray], outs: list[np.ndarray]) -> float:
    ref = np.concatenate([np.asarray(r, np.float64).ravel() for r in refs])
    out = np.concatenate([np.asarray(o, np.float64).ravel() for o in outs])
    err = np.sum((out - ref) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref**2) / err))


def _output_index(path, name: str) -> int:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output].index(name)


def bench_model(name: str, cache: Path, n_cal: int, n_held: int, out_dir: Path, log) -> dict:
    spec = MODELS[name]
    built = ensure_model(spec, cache)
    cal, held = samples(spec, n_cal, CAL_SEED), samples(spec, n_held, HELD_SEED)
    index = _output_index(built.fp32_path, spec.output)
    fp32 = ort_session(str(built.fp32_path), 2)
    refs = [fp32.run(None, s)[index] for s in held]
    row = {"model": name, "description": spec.description, "calibration": n_cal, "held_out": n_held}

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ort_path = Path(tmp) / "ort.int8.onnx"
        quantize_qdq(built.fp32_path, ort_path, cal)
        ort_q = ort_session(str(ort_path), 2, optimize=False)
        row["ORT MinMax"] = sqnr(refs, [ort_q.run(None, s)[index] for s in held])
    row["ort_seconds"] = round(time.perf_counter() - start, 1)
    log(f"{name}: ORT quantize_static MinMax: {row['ORT MinMax']:.2f} dB")

    mod = tvm_lowprec.from_onnx(str(built.fp32_path), shape_dict=spec.shape_dict)
    start = time.perf_counter()
    obs = observe(mod, cal, progress=True)
    row["calibration_seconds"] = round(time.perf_counter() - start, 1)
    for label, observer in OBSERVERS.items():
        config = QuantConfig(activations=QuantSpec("uint8", observer=observer))
        start = time.perf_counter()
        qmod = quantize(mod, config=config, observations=obs, progress=False)
        compiled = tvm_lowprec.compile(qmod, target="native")
        row[f"tvm-lowprec {label}"] = sqnr(refs, [compiled(s)[index] for s in held])
        log(f"{name}: tvm-lowprec {label}: {row[f'tvm-lowprec {label}']:.2f} dB ({time.perf_counter() - start:.1f} s)")
        if label == "MinMax":
            report = accuracy_report(mod, qmod, held, progress=False)
            (out_dir / f"{name}_layers.md").write_text(report.table() + "\n")
            (out_dir / f"{name}_layers.json").write_text(report.to_json(indent=1) + "\n")
            report.plot(out_dir / f"{name}_layers.png")
    best = max(OBSERVERS, key=lambda k: row[f"tvm-lowprec {k}"])
    row["best observer"] = best
    row["best - ORT (dB)"] = row[f"tvm-lowprec {best}"] - row["ORT MinMax"]
    row["MinMax - ORT (dB)"] = row["tvm-lowprec MinMax"] - row["ORT MinMax"]
    return row


COLUMNS = ["ORT MinMax", *[f"tvm-lowprec {k}" for k in OBSERVERS], "MinMax - ORT (dB)", "best - ORT (dB)"]

# --int4: weight-only configs (activations float), matmul layers only
METHODS = {"RTN": RTN(), "GPTQ": GPTQ(), "GPTQ-shrink": GPTQ(shrink=True)}
WEIGHT_ONLY = {
    "int8 per-channel": QuantSpec("int8", True, PerChannel()),
    **{f"int4 g{g} {m}": QuantSpec("int4", True, PerGroup(g), method=method) for g in (128, 32)
       for m, method in METHODS.items()},
}
GAINS = [f"{m} - RTN g{g} (dB)" for g in (128, 32) for m in METHODS if m != "RTN"]
INT4_COLUMNS = [*WEIGHT_ONLY, *GAINS]


def bench_int4(name: str, cache: Path, n_cal: int, n_held: int, out_dir: Path, log) -> dict:
    """Output SQNR of each :data:`WEIGHT_ONLY` config on held-out inputs (FP32 reference: ONNX Runtime),
    from one calibration run (second moments for GPTQ); per-layer reports for the int4 g128 configs."""
    spec = MODELS[name]
    built = ensure_model(spec, cache)
    cal, held = samples(spec, n_cal, CAL_SEED), samples(spec, n_held, HELD_SEED)
    index = _output_index(built.fp32_path, spec.output)
    fp32 = ort_session(str(built.fp32_path), 2)
    refs = [fp32.run(None, s)[index] for s in held]
    row = {"model": name, "description": spec.description, "calibration": n_cal, "held_out": n_held}
    mod = tvm_lowprec.from_onnx(str(built.fp32_path), shape_dict=spec.shape_dict)
    start = time.perf_counter()
    obs = observe(mod, cal, progress=True, moments=True)
    row["calibration_seconds"] = round(time.perf_counter() - start, 1)
    for label, weights in WEIGHT_ONLY.items():
        config = QuantConfig(activations=None, weights=weights, operators=("matmul",))
        start = time.perf_counter()
        qmod = quantize(mod, config=config, observations=obs, progress=False)
        row[f"{label} quantize_seconds"] = round(time.perf_counter() - start, 1)
        compiled = tvm_lowprec.compile(qmod, target="native")
        row[label] = sqnr(refs, [compiled(s)[index] for s in held])
        log(f"{name}: weight-only {label}: {row[label]:.2f} dB (quantize {row[f'{label} quantize_seconds']} s)")
        if label.startswith("int4 g128"):
            report = accuracy_report(mod, qmod, held, progress=False)
            stem = out_dir / f"{name}_{label.replace(' ', '_')}_layers"
            stem.with_suffix(".md").write_text(report.table() + "\n")
            stem.with_suffix(".json").write_text(report.to_json(indent=1) + "\n")
    for g in (128, 32):
        for m in METHODS:
            if m != "RTN":
                row[f"{m} - RTN g{g} (dB)"] = row[f"int4 g{g} {m}"] - row[f"int4 g{g} RTN"]
    return row


def bench_fallback(name: str, cache: Path, n_cal: int, n_held: int, out_dir: Path, log, target_db: float,
                   keep: tuple[str, ...] = ()) -> dict:
    """``quantize`` with ``target_sqnr``: each output's SQNR on held-out inputs (reference: TVM's FP32 model),
    the layers kept in FP32, and latencies against ONNX Runtime FP32, timed interleaved at 1 and 2 threads.
    ``keep``: the layers to keep in FP32, from an earlier run (``LayerOverride(skip=True)``), instead of
    the fallback's search (one compile per layer: minutes)."""
    from tvm_lowprec.bench.timing import Timing, measure_interleaved, wall_loop
    from tvm_lowprec.ptq import LayerOverride

    spec = MODELS[name]
    built = ensure_model(spec, cache)
    cal, held = samples(spec, n_cal, CAL_SEED), samples(spec, n_held, HELD_SEED)
    mod = tvm_lowprec.from_onnx(str(built.fp32_path), shape_dict=spec.shape_dict)
    start = time.perf_counter()
    plain = quantize(mod, cal, QuantConfig(), progress=True)
    plain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if keep:
        qmod = quantize(mod, cal, QuantConfig(overrides=tuple(LayerOverride(k, skip=True) for k in keep)),
                        progress=True)
    else:
        qmod = quantize(mod, cal, QuantConfig(target_sqnr=target_db), validation_data=cal, progress=True)
    row = {"model": name, "calibration": n_cal, "held_out": n_held, "target_sqnr": target_db,
           "kept given": bool(keep), "quantize_seconds": round(plain_seconds, 1),
           "fallback_quantize_seconds": round(time.perf_counter() - start, 1)}
    for label, q in (("default", plain), ("fallback", qmod)):
        report = accuracy_report(mod, q, held, progress=False)
        row[f"{label} outputs (dB)"] = {o.name: round(o.sqnr_db, 2) for o in report.outputs}
        row[f"{label} kept"] = [r.name for r in report.layers if not r.quantized]
        if label == "fallback":
            row["reached on held-out"] = {o.name: bool(o.sqnr_db >= target_db) for o in report.outputs}
            row["notes"] = report.notes
            (out_dir / f"{name}_layers.md").write_text(report.table() + "\n")
            (out_dir / f"{name}_layers.json").write_text(report.to_json(indent=1) + "\n")
            report.plot(out_dir / f"{name}_layers.png")
        log(f"{name}: {label}: outputs {row[f'{label} outputs (dB)']} kept {row[f'{label} kept']}")
    feed = held[0]
    for threads in (1, 2):
        loops = {"ORT FP32": wall_loop(lambda s=ort_session(str(built.fp32_path), threads): s.run(None, feed))}
        for label, m in (("fp32", mod), ("default", plain), ("fallback", qmod)):
            compiled = tvm_lowprec.compile(m, target="native", num_threads=threads)
            loops[label] = lambda number, c=compiled: c.benchmark(**feed, number=number, repeat=1)
        times = measure_interleaved(loops, Timing(min_time=0.2, repeat=7))
        for label, t in times.items():
            row[f"{label} latency {threads} thr (ms)"] = round(1e3 * t.seconds, 2)
        log(f"{name}: {threads} thread(s): " + ", ".join(f"{k} {1e3 * t.seconds:.2f} ms" for k, t in times.items()))
    return row


def bench_export(name: str, cache: Path, n_cal: int, n_held: int, out_dir: Path, log) -> dict:
    from tvm_lowprec.ptq.export_onnx import export_qdq
    from tvm_lowprec.ptq.quantize import quantize_with_plans

    spec = MODELS[name]
    built = ensure_model(spec, cache)
    cal, held = samples(spec, n_cal, CAL_SEED), samples(spec, n_held, HELD_SEED)
    index = _output_index(built.fp32_path, spec.output)
    fp32 = ort_session(str(built.fp32_path), 2)
    refs = [fp32.run(None, s)[index] for s in held]
    mod = tvm_lowprec.from_onnx(str(built.fp32_path), shape_dict=spec.shape_dict)
    qmod, plans = quantize_with_plans(mod, cal, progress=True)
    path = out_dir / f"{name}_qdq.onnx"
    export_qdq(str(built.fp32_path), plans, path, spec.shape_dict)
    ours = tvm_lowprec.compile(qmod, target="native")
    row = {"model": name, "output": spec.output, "quantized layers": len(plans),
           "tvm-lowprec": sqnr(refs, [ours(s)[index] for s in held])}
    for label, optimize in (("ORT as written", False), ("ORT fused", True)):
        try:
            session = ort_session(str(path), 2, optimize=optimize)
        except Exception as err:  # noqa: BLE001 - ORT raises its own classes
            # onnxruntime 1.32's MatMulAddFusion fails on MatMul(DQ, DQ) + Add(DQ(int32 bias)) in this graph
            import onnxruntime as ort

            row[f"{label} note"] = f"default session failed ({str(err).splitlines()[0][-160:]}); MatMulAddFusion disabled"
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=["MatMulAddFusion"])
        row[label] = sqnr(refs, [session.run(None, s)[index] for s in held])
        row[f"{label} - tvm-lowprec (dB)"] = row[label] - row["tvm-lowprec"]
    log(f"{name}: {row}")
    path.unlink()  # large; the figures are what matters
    return row


def dead_channel_textdet(seed: int = 0):
    """The text detector with 2 channels of every BatchNormalization (gamma 1e-9, beta 1.0) dead."""
    from models.textdet import db_like
    from onnx import numpy_helper

    model = db_like(seed)
    inits = {i.name: i for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    dead = 0
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        gamma, beta = (numpy_helper.to_array(inits[n]).copy() for n in node.input[1:3])
        channels = rng.choice(gamma.size, size=min(2, gamma.size), replace=False)
        gamma[channels], beta[channels] = 1e-9, 1.0
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(gamma, node.input[1]))
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(beta, node.input[2]))
        dead += channels.size
    return model, dead


def bench_dead_channels(n_cal: int, n_held: int, out_dir: Path, log) -> dict:
    import importlib
    import logging

    quantize_module = importlib.import_module("tvm_lowprec.ptq.quantize")
    shape = (1, 3, 96, 96)
    model, dead = dead_channel_textdet()
    rng = np.random.default_rng(CAL_SEED)
    cal = [rng.standard_normal(shape).astype(np.float32) for _ in range(n_cal)]
    held = [rng.standard_normal(shape).astype(np.float32) for _ in range(n_held)]
    with tempfile.TemporaryDirectory() as tmp:
        import onnx

        src, dst = Path(tmp) / "textdet.onnx", Path(tmp) / "textdet.int8.onnx"
        onnx.save(model, src)
        fp32 = ort_session(str(src), 2)
        refs = [fp32.run(None, {"images": x})[0] for x in held]
        quantize_qdq(src, dst, [{"images": x} for x in cal])
        ort_q = ort_session(str(dst), 2, optimize=False)
        row = {"model": "textdet (dead BN channels)", "dead channels": dead,
               "ORT quantize_static": sqnr(refs, [ort_q.run(None, {"images": x})[0] for x in held])}
    mod = tvm_lowprec.from_onnx(model, shape_dict={"images": list(shape)})
    obs = observe(mod, cal, progress=False)
    messages = []

    class Catch(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Catch(logging.WARNING)
    logging.getLogger("tvm_lowprec").addHandler(handler)
    try:
        for label, widen in (("widened weight scales", True), ("float QDQ layers", False)):
            quantize_module.WIDEN_OVERFLOWING_BIAS = widen
            messages.clear()
            compiled = tvm_lowprec.compile(quantize(mod, config=QuantConfig(), observations=obs, progress=False))
            row[label] = sqnr(refs, [compiled(images=x)[0] for x in held])
            row[f"{label}: integer kernels"] = sum(k.name.startswith(("qconv2d", "qdepthwise", "qgemm"))
                                                   for k in compiled.kernels())
            row[f"{label}: adjusted layers"] = sum("widened" in m for m in messages)
            row[f"{label}: float layers"] = sum("stays in float QDQ" in m for m in messages)
            log(f"textdet dead channels: {label}: {row[label]:.2f} dB")
    finally:
        quantize_module.WIDEN_OVERFLOWING_BIAS = True
        logging.getLogger("tvm_lowprec").removeHandler(handler)
    (out_dir / "messages.txt").write_text("\n".join(messages) + "\n")
    return row


def markdown_fallback(rows: list[dict], meta: dict) -> str:
    lines = ["# PTQ with target_sqnr: per-output SQNR on held-out inputs (dB)", "",
             (f"{meta.get('date', '')} · tvm-lowprec {tvm_lowprec.__version__} · default int8 config, then "
              "QuantConfig(target_sqnr=T) (fallback measured on the calibration inputs); SQNR per output against "
              "TVM's FP32 model on held-out inputs; latencies: median, this host, noisy (shared CPU)."), ""]
    for r in rows:
        if "error" in r:
            lines.append(f"- {r['model']}: error: {r['error']}")
            continue
        lines += [f"## {r['model']} (target {r['target_sqnr']} dB)", "",
                  f"- default config: {r['default outputs (dB)']}, quantize {r['quantize_seconds']} s",
                  f"- target_sqnr: {r['fallback outputs (dB)']}, quantize {r['fallback_quantize_seconds']} s",
                  f"- reached on held-out: {r['reached on held-out']}",
                  f"- kept in FP32 ({len(r['fallback kept'])}): {', '.join(r['fallback kept']) or 'none'}",
                  *[(f"- latency, {t} thread(s), ms (interleaved): ORT FP32 {r[f'ORT FP32 latency {t} thr (ms)']}, "
                     f"tvm-lowprec FP32 {r[f'fp32 latency {t} thr (ms)']}, default int8 {r[f'default latency {t} thr (ms)']}, "
                     f"target_sqnr (mixed) {r[f'fallback latency {t} thr (ms)']}: mixed / ORT FP32 = "
                     f"{r[f'fallback latency {t} thr (ms)'] / r[f'ORT FP32 latency {t} thr (ms)']:.2f}x") for t in (1, 2)],
                  *(["- the kept layers were given (`--keep`), not searched"] if r.get("kept given") else []),
                  *[f"- note: {n}" for n in r["notes"]], ""]
    return "\n".join(lines) + "\n"


def _markdown(title: str, note: str, lead: list[str], columns: list[str], rows: list[dict], footer: str) -> str:
    """A results table: one row per model, ``lead`` columns as they are, ``columns`` as dB."""
    lines = [f"# {title}", "", note, "",
             "| " + " | ".join([*lead, *columns]) + " |", "|---|" + "---:|" * (len(lead) - 1 + len(columns))]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |")
            continue
        lines.append("| " + " | ".join([*(str(r[c]) for c in lead), *(f"{r[c]:.2f}" for c in columns)]) + " |")
    lines += ["", footer]
    return "\n".join(lines) + "\n"


def markdown_int4(rows: list[dict], meta: dict) -> str:
    note = (f"{meta.get('date', '')} · tvm-lowprec {tvm_lowprec.__version__} · matmul weights only, activations "
            "float32; int4 symmetric ([-7, 7]) with one scale per group of g weights along K, rounded to nearest "
            "(RTN) or by GPTQ (calibration inputs' x^T x per layer input; GPTQ-shrink: its off-diagonal shrunk by "
            "the sampling noise); int8 per-channel for reference. "
            "SQNR of the final output over held-out inputs, against ONNX Runtime FP32.")
    return _markdown("Weight-only 4-bit PTQ: output SQNR against FP32 (dB, higher is better)", note,
                     ["model", "calibration"], INT4_COLUMNS, rows,
                     "Per-layer SQNR: `<model>_int4_g128_<method>_layers.md` / `.json`.")


def markdown(rows: list[dict], meta: dict) -> str:
    note = (f"{meta.get('date', '')} · tvm-lowprec {tvm_lowprec.__version__} · int8 per-channel weights, uint8 "
            "activations; ORT = onnxruntime.quantization.quantize_static (QDQ, MinMax), run as written; "
            "tvm-lowprec = tvm_lowprec.quantize with the activation observer named, run as integer kernels. "
            "Same calibration inputs for both; SQNR over held-out inputs.")
    return _markdown("Post-training quantization: output SQNR against FP32 (dB, higher is better)", note,
                     ["model"], COLUMNS, rows,
                     "Per-layer SQNR of tvm-lowprec's MinMax model: `<model>_layers.md` / `.json` / `.png`.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="default: encoder,cnn,minilm (with --int4: minilm,encoder)")
    parser.add_argument("--int4", action="store_true", help="weight-only int4 (RTN vs GPTQ) instead of the int8 "
                        "observer comparison")
    parser.add_argument("--fallback", type=float, default=None, metavar="DB",
                        help="quantize with target_sqnr=DB and report per-output SQNR, layers kept, latency")
    parser.add_argument("--keep", default="", help="with --fallback: comma-separated layers to keep in FP32 "
                        "(from an earlier run's report) instead of the fallback's search")
    parser.add_argument("--export", action="store_true", help="ONNX QDQ export: ORT on the exported file vs ours")
    parser.add_argument("--dead-channels", action="store_true", help="widened weight scales vs float layers "
                        "on the text detector with near-zero BatchNorm channels")
    parser.add_argument("--calibration", type=int, default=8, help="calibration samples (default 8)")
    parser.add_argument("--held-out", type=int, default=4, help="held-out samples (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ptq (--int4: ptq-int4)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    args.models = args.models or ("minilm,encoder" if args.int4 else "encoder,cnn,minilm")
    args.out = args.out or HERE / "results" / ("ptq-int4" if args.int4 else "ptq-fallback"
                                               if args.fallback is not None else "ptq-dead-channels"
                                               if args.dead_channels else "ptq-export" if args.export else "ptq")
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.dead_channels:
        row = bench_dead_channels(args.calibration, args.held_out, args.out, log)
        (args.out / "results.json").write_text(json.dumps(json_safe(row), indent=1) + "\n")
        print(json.dumps(json_safe(row), indent=1))
        return 0
    rows = []
    if args.export:
        for name in [n.strip() for n in (args.models or "encoder,cnn,minilm").split(",") if n.strip()]:
            rows.append(bench_export(name, args.cache, args.calibration, args.held_out, args.out, log))
        (args.out / "results.json").write_text(json.dumps(json_safe(rows), indent=1) + "\n")
        print(json.dumps(json_safe(rows), indent=1))
        return 0
    bench = bench_int4 if args.int4 else bench_model
    if args.fallback is not None:
        def bench(*a):
            return bench_fallback(*a, target_db=args.fallback, keep=tuple(k for k in args.keep.split(",") if k))
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        try:
            rows.append(bench(name, args.cache, args.calibration, args.held_out, args.out, log))
        except ModelUnavailable as err:
            rows.append({"model": name, "error": f"model unavailable: {err}"})
    meta = collect_metadata(benchmark="ptq_bench" + (" --int4" if args.int4 else ""), calibration=args.calibration,
                            held_out=args.held_out)
    if args.fallback is not None:
        (args.out / "results.json").write_text(json.dumps(json_safe({"meta": meta, "rows": rows}), indent=1) + "\n")
        text = markdown_fallback(rows, meta)
        (args.out / "report.md").write_text(text)
        print(text)
        return 0
    (args.out / "results.json").write_text(json.dumps(json_safe({"meta": meta, "rows": rows}), indent=1) + "\n")
    columns = (["model", "calibration", *INT4_COLUMNS, "calibration_seconds"] if args.int4
               else ["model", *COLUMNS, "best observer", "calibration_seconds"])
    write_csv(rows, args.out / "results.csv", columns)
    text = markdown_int4(rows, meta) if args.int4 else markdown(rows, meta)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
