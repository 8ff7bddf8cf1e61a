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
    parser.add_argument("--calibration", type=int, default=8, help="calibration samples (default 8)")
    parser.add_argument("--held-out", type=int, default=4, help="held-out samples (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ptq (--int4: ptq-int4)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    args.models = args.models or ("minilm,encoder" if args.int4 else "encoder,cnn,minilm")
    args.out = args.out or HERE / "results" / ("ptq-int4" if args.int4 else "ptq")
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    rows = []
    bench = bench_int4 if args.int4 else bench_model
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        try:
            rows.append(bench(name, args.cache, args.calibration, args.held_out, args.out, log))
        except ModelUnavailable as err:
            rows.append({"model": name, "error": f"model unavailable: {err}"})
    meta = collect_metadata(benchmark="ptq_bench" + (" --int4" if args.int4 else ""), calibration=args.calibration,
                            held_out=args.held_out)
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
