#!/usr/bin/env python
"""Where ONNX Runtime spends a zoo model's time against where tvm-lowprec does, by coarse category.

    python benchmarks/ort_profile.py --models resnet50,deeplabv3_mobilenet_v3_large,vit_b_16,distilbert \\
        --small --threads 1 --out DIR
    python benchmarks/ort_profile.py --heldout --models mixnet_s,wav2vec2_4l --small --out DIR   # held-out models

Each model's QDQ file (the zoo's ``build``, cached in ``~/.cache/tvm-lowprec-zoo``) runs on both sides:

- ONNX Runtime: CPU session with ``enable_profiling``, ``intra_op_num_threads=--threads``, the default
  graph optimizations (``ORT_ENABLE_ALL``: the fused QLinearConv/QGemm/QLinearMatMul kernels users get),
  ``--warmup`` runs then ``--runs`` runs; the trace's ``Node`` events (``*_kernel_time``, ``dur`` in us)
  inside the timed ``model_run`` events are summed per node and per ``op_name``, averaged per run.
- tvm-lowprec: ``compile(..., target="native")`` of the same file, ``Compiled.profile`` (in the model,
  by the VM instrument, as ORT's profiler times its nodes; ``--isolated``: each kernel alone).

Both sides' op types / kernels go into the same categories (:data:`CATEGORIES`); GEMM/conv work includes
tvm-lowprec's im2col, pad and pack_b kernels (ORT's QLinearConv/QLinearMatMul do that work inside the
node), shown as a sub-row. GEMM GOPS: ORT's from the nodes' shapes in the trace (2 per multiply-add:
conv ``2·|Y|·|W|/Cout``, matmul ``2·|Y|·K``), tvm-lowprec's from its kernels' ``ops``. End-to-end
times (no profiler) by ``tvm_lowprec.bench.timing.measure_interleaved``. Writes ``DIR/report.md``,
``DIR/results.json``, ORT's traces ``DIR/ort-<model>_*.json`` and optimized graphs
``DIR/ort-<model>.optimized.onnx`` (where ORT's convolution weights are read: the trace lacks the
pre-packed ones); prints the report.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # zoo, models, model_bench
sys.path.insert(0, str(HERE.parent))  # tvm_lowprec from this checkout

import zoo  # noqa: E402
from model_bench import _ms, _op_summary, _short  # noqa: E402
from models.build import make_feed  # noqa: E402
from zoo.build import build  # noqa: E402

from tvm_lowprec.bench.cli_args import names_parser  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, load_average  # noqa: E402
from tvm_lowprec.bench.providers import ort_session  # noqa: E402
from tvm_lowprec.bench.report import json_safe, profile_figures, write_json  # noqa: E402
from tvm_lowprec.bench.timing import QUICK_TIMING, measure_interleaved, wall_loop  # noqa: E402

CATEGORIES = ("gemm/conv", "quantize/requantize", "elementwise/activation", "softmax", "norm/reduce",
              "layout/copy", "pooling", "resize", "other")

# ---------------------------------------------------------------- ONNX Runtime op types

ORT_CATEGORY = {
    **dict.fromkeys(("Conv", "ConvInteger", "QLinearConv", "FusedConv", "NhwcFusedConv", "MatMul", "MatMulInteger",
                     "QLinearMatMul", "Gemm", "QGemm", "FusedGemm", "FusedMatMul", "MatMulIntegerToFloat",
                     "DynamicQuantizeMatMul", "Attention", "QAttention", "MultiHeadAttention", "ConvTranspose",
                     "QLinearConvTranspose"), "gemm/conv"),
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QDQ"), "quantize/requantize"),
    **dict.fromkeys(("Softmax", "QLinearSoftmax", "LogSoftmax"), "softmax"),
    **dict.fromkeys(("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                     "BatchNormalization", "InstanceNormalization", "ReduceMean", "ReduceSum", "QLinearReduceMean"),
                    "norm/reduce"),
    **dict.fromkeys(("Transpose", "Reshape", "Concat", "QLinearConcat", "Slice", "Split", "Gather", "GatherND",
                     "GatherElements", "Expand", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Pad", "Tile",
                     "Shape", "ReorderInput", "ReorderOutput", "DepthToSpace", "SpaceToDepth", "Size"),
                    "layout/copy"),
    **dict.fromkeys(("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "QLinearAveragePool",
                     "QLinearGlobalAveragePool", "NhwcMaxPool"), "pooling"),
    **dict.fromkeys(("Resize", "Upsample"), "resize"),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Erf", "Tanh", "Sigmoid", "HardSigmoid",
                     "HardSwish", "Relu", "LeakyRelu", "Clip", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Where",
                     "Equal", "Less", "Greater", "And", "Or", "Not", "IsNaN", "Cast", "Neg", "Abs", "Min", "Max",
                     "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearWhere",
                     "QLinearHardSigmoid", "QLinearHardSwish", "BiasAdd", "Mish", "Softplus"),
                    "elementwise/activation"),
}


def ort_category(op_type: str) -> str:
    return ORT_CATEGORY.get(op_type, "other")


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


def _shapes(entries) -> list[list[int] | None]:
    """A trace event's ``input_type_shape`` / ``output_type_shape``: one shape per tensor ([] for a scalar)."""
    return [next(iter(e.values()), None) if isinstance(e, dict) else None for e in entries or []]


_CONV_WEIGHT = {"QLinearConv": 3, "ConvInteger": 1, "Conv": 1, "FusedConv": 1, "NhwcFusedConv": 1}  # its input


def conv_weights(optimized: Path) -> dict[str, list[int]]:
    """Node name -> weight shape of every convolution in ORT's optimized graph (the trace lacks the
    weights ORT pre-packed at load)."""
    import onnx

    model = onnx.load(str(optimized), load_external_data=False)
    dims = {i.name: list(i.dims) for i in model.graph.initializer}
    return {n.name: dims[n.input[_CONV_WEIGHT[n.op_type]]] for n in model.graph.node
            if n.op_type in _CONV_WEIGHT and len(n.input) > _CONV_WEIGHT[n.op_type]
            and n.input[_CONV_WEIGHT[n.op_type]] in dims}


def ort_node_ops(op_type: str, args: dict, weight: list[int] | None = None) -> int | None:
    """Operations (2 per multiply-add) of one GEMM/conv node from the shapes in its trace event (and for
    a convolution its ``weight`` shape); None where they are not derivable (attention, a missing shape)."""
    inputs, outputs = _shapes(args.get("input_type_shape")), _shapes(args.get("output_type_shape"))
    y = outputs[0] if outputs else None
    try:
        if op_type in _CONV_WEIGHT:  # |Y| x (Cin/group x kh x kw); the output's layout (NCHW, NHWC) does not matter
            return 2 * _prod(y) * _prod(weight[1:]) if weight else None
        if op_type in ("QLinearMatMul", "MatMulInteger", "MatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                       "FusedMatMul"):
            return 2 * _prod(y) * int(inputs[0][-1])
        if op_type in ("QGemm", "Gemm", "FusedGemm"):  # A is M x K or K x M (transA): K = |A| / M
            return 2 * _prod(y) * (_prod(inputs[0]) // int(y[0]))
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        return None
    return None


def ort_session_profiled(path: Path, threads: int, prefix: Path, optimized: Path):
    """ORT CPU session with the profiler on, ``threads`` intra-op threads and the default optimizations,
    its optimized graph saved to ``optimized`` (the other options as
    :func:`tvm_lowprec.bench.providers.ort_session`'s)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_profile(path: Path, feed: dict, threads: int, warmup: int, runs: int, prefix: Path) -> dict:
    """ORT's profiler over ``runs`` runs after ``warmup``: per-node rows (ms per run, op type,
    category, ops) and the trace file."""
    optimized = prefix.with_name(prefix.name + ".optimized.onnx")
    session = ort_session_profiled(path, threads, prefix, optimized)
    weights = conv_weights(optimized)
    for _ in range(warmup + runs):
        session.run(None, feed)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    model_runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                        if e.get("cat") == "Session" and e.get("name") == "model_run")
    timed = model_runs[warmup:]
    if len(timed) != runs:
        raise RuntimeError(f"ORT trace {trace}: {len(model_runs)} model_run events, expected {warmup + runs}")
    nodes: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if not any(start <= e["ts"] <= end for start, end in timed):
            continue  # a warm-up run's
        name, op = e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?")
        row = nodes.setdefault(name, {"name": name, "op": op, "category": ort_category(op), "us": [0.0] * runs,
                                      "calls": 0, "ops": ort_node_ops(op, e["args"], weights.get(name)),
                                      "provider": e["args"].get("provider")})
        run = next(i for i, (start, end) in enumerate(timed) if start <= e["ts"] <= end)
        row["us"][run] += e["dur"]
        row["calls"] += 1
    rows = []
    for row in nodes.values():
        per_run = row.pop("us")
        ms = sum(per_run) / runs / 1e3  # the mean per run (ms_median: the median, for a noisy host)
        calls = row["calls"] // runs
        gops = row["ops"] * calls / (ms * 1e6) if row["ops"] and ms > 0 else None
        rows.append({**row, "calls": calls, "ms": ms, "ms_median": float(np.median(per_run)) / 1e3, "gops": gops})
    run_ms = float(np.median([end - start for start, end in timed])) / 1e3
    return {"rows": sorted(rows, key=lambda r: -r["ms"]), "trace": str(trace), "optimized": str(optimized),
            "model_run_ms": run_ms}


# ---------------------------------------------------------------- tvm-lowprec kernels

GEMM_OPS = {"qgemm", "qgemm16", "qdepthwise", "fp32_gemm", "bf16_gemm", "nbits_gemm", "fp8_weights", "fp32_depthwise"}
GEMM_PREP_OPS = {"im2col", "pack_b", "col2im", "pad"}  # inside ORT's QLinearConv / QLinearMatMul nodes
OP_CATEGORY = {**dict.fromkeys(GEMM_OPS | GEMM_PREP_OPS, "gemm/conv"), "qsoftmax": "softmax",
               "qlayernorm": "norm/reduce", "max_pool": "pooling", "resize_linear": "resize",
               "lookup": "elementwise/activation"}  # lookup: an element-wise chain as a 256-entry table

# name pieces of TVM's kernels (``fused_<op>_<op>...``, split at "_", numbering stripped), by category, in
# the order tried: a fused kernel goes to the first category any of its pieces names
_PIECES = (
    ("gemm/conv", {"matmul", "conv2d", "conv1d", "conv3d", "dense", "batch", "qgemm", "qdepthwise"}),
    ("softmax", {"softmax"}),
    ("pooling", {"pool", "pool1d", "pool2d", "pool3d", "adaptive"}),  # before "max" (max_pool2d)
    ("norm/reduce", {"norm", "mean", "variance", "rsqrt", "sum", "max", "min", "qlayernorm"}),
    ("resize", {"resize", "resize1d", "resize2d", "resize3d", "upsampling"}),
    ("layout/copy", {"concatenate"}),  # ORT's QLinearConcat, with the requantization of its inputs
    ("elementwise/activation", {"sigmoid", "tanh", "erf", "exp", "sqrt", "power", "divide", "subtract", "where",
                                "isnan", "less", "greater", "equal", "logical", "relu", "gelu", "hardswish",
                                "log", "abs", "negative", "lookup", "floor", "ceil", "sin", "cos"}),
)
_GLUE = {"fused", "quantize", "dequantize", "requantize", "cast", "multiply", "add", "right", "shift", "maximum",
         "minimum", "clip", "round", "tir", "fixed", "point", "q"}  # requantization arithmetic
_LAYOUT = {"reshape", "transpose", "concatenate", "strided", "slice", "split", "take", "gather", "nd", "te",
           "layout", "transform", "squeeze", "expand", "dims", "copy", "broadcast", "to", "flip", "repeat", "tile",
           "pad", "view"}


def tvm_category(row: dict) -> str:
    """A :meth:`Compiled.profile` row's category: from its ``op`` (the kernel's ``lowprec.op``), else
    from the operators its name lists. A fused chain of only requantization arithmetic (casts, fixed-
    point multiply-add-shift, clamp) is quantize/requantize, unless it rescales two inputs (two
    multiplies or dequantizes: a quantized add or multiply, ORT's QLinearAdd/QLinearMul) - then
    element-wise."""
    if row["op"] in OP_CATEGORY:
        return OP_CATEGORY[row["op"]]
    pieces = [p.rstrip("0123456789") for p in row["name"].split("_")]
    pieces = [p for p in pieces if p and not re.search(r"^\d|\dx\d", p)]  # less shapes ("3x160x160")
    for category, words in _PIECES:
        if any(p in words for p in pieces):
            return category
    if all(p in _GLUE or p in _LAYOUT for p in pieces) and any(p in _GLUE - {"fused"} for p in pieces):
        binary = pieces.count("multiply") >= 2 or (pieces.count("dequantize") >= 2 and "add" in pieces)
        return "elementwise/activation" if binary else "quantize/requantize"
    if all(p in _LAYOUT or p == "fused" for p in pieces):
        return "layout/copy"
    if len(pieces) == 1 and pieces[0] in ("quantize", "dequantize", "requantize"):
        return "quantize/requantize"
    if pieces == ["cast"]:
        return "elementwise/activation"  # as ORT's Cast
    return "other"


def tvm_profile(path: Path, feed: dict, threads: int, warmup: int, runs: int, isolated: bool):
    """Compile ``path`` for ``native`` at ``threads`` threads; its :meth:`Compiled.profile` rows (with
    ``category``) over ``runs`` runs, and the compiled model."""
    import tvm_lowprec

    start = time.perf_counter()
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native", num_threads=threads)
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        compiled(feed)
    rows = compiled.profile(feed, repeat=runs, isolated=isolated)
    for r in rows:
        r["category"] = tvm_category(r)
    return rows, compiled, compile_s


# ---------------------------------------------------------------- one model

def by_category(rows: list[dict]) -> dict[str, float]:
    sums = dict.fromkeys(CATEGORIES, 0.0)
    for r in rows:
        sums[r["category"]] += r["ms"]
    return sums


def gemm_rate(rows: list[dict], ops_per_call) -> dict:
    """GOPS of the GEMM/conv rows with a known operation count: their ops over their ms; the ms and Gop
    of those rows and the ms of those without."""
    known = [r for r in rows if r["category"] == "gemm/conv" and ops_per_call(r)]
    ops = sum(ops_per_call(r) * r.get("calls", 1) for r in known)
    ms = sum(r["ms"] for r in known)
    return {"gop": ops / 1e9, "ms": ms, "gops": ops / (ms * 1e6) if ms else None,
            "unknown_ms": sum(r["ms"] for r in rows if r["category"] == "gemm/conv") - ms}


def _tvm_ops(r: dict) -> float | None:  # ops per call from the profile's gops (= ops x calls / seconds)
    return r["gops"] * 1e9 * (r["ms"] / 1e3) / r["calls"] if r.get("gops") else None


def profile_model(name: str, args: argparse.Namespace) -> dict:
    entry = zoo.REGISTRY[name]
    built = build(entry, args.cache, small=args.small, size=args.size)
    feed = make_feed(built.spec)
    print(f"[{name}] {built.int8_path.name}: ORT profile", file=sys.stderr, flush=True)
    ort = ort_profile(built.int8_path, feed, args.threads, args.warmup, args.runs, args.out / f"ort-{name}")
    print(f"[{name}] tvm-lowprec compile + profile", file=sys.stderr, flush=True)
    tvm_rows, compiled, compile_s = tvm_profile(built.int8_path, feed, args.threads, args.warmup, args.runs,
                                                args.isolated)
    print(f"[{name}] end to end", file=sys.stderr, flush=True)
    session = ort_session(built.int8_path, args.threads)  # no profiler
    session.run(None, feed)
    measured = measure_interleaved({"ort": wall_loop(lambda: session.run(None, feed)),
                                    "tvm": wall_loop(lambda: compiled(feed))}, QUICK_TIMING, quiesce=True)
    return {
        "model": name, "file": str(built.int8_path), "size": entry.resolve_size(args.size, args.small),
        "input": ", ".join(f"{i.name} {'x'.join(map(str, i.shape))}" for i in built.spec.inputs),
        "threads": args.threads, "runs": args.runs, "warmup": args.warmup, "isolated": args.isolated,
        "compile_s": compile_s, "target": compiled.spec.name,
        "end_to_end_ms": {k: m.seconds * 1e3 for k, m in measured.items()},
        "ort": {"rows": ort["rows"], "trace": ort["trace"], "optimized": ort["optimized"],
                "model_run_ms": ort["model_run_ms"],
                "categories": by_category(ort["rows"]), "gemm": gemm_rate(ort["rows"], lambda r: r.get("ops"))},
        "tvm": {"rows": [{k: v for k, v in r.items() if isinstance(v, (str, int, float, type(None)))} for r in tvm_rows],
                "categories": by_category(tvm_rows), "gemm": gemm_rate(tvm_rows, _tvm_ops),
                "gemm_prep_ms": sum(r["ms"] for r in tvm_rows if r["op"] in GEMM_PREP_OPS)},
    }


# ---------------------------------------------------------------- report

def _pct(part: float, total: float) -> str:
    return f"{100 * part / total:.1f}%" if total else "—"


def _gops(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def category_table(res: dict) -> list[str]:
    ort, tvm = res["ort"]["categories"], res["tvm"]["categories"]
    ort_total, tvm_total = sum(ort.values()), sum(tvm.values())
    lines = ["| category | ORT ms | ORT % | tvm-lowprec ms | tvm % | ratio tvm/ORT |", "|---|---:|---:|---:|---:|---:|"]
    for c in CATEGORIES:
        if not ort[c] and not tvm[c]:
            continue
        ratio = f"{tvm[c] / ort[c]:.2f}" if ort[c] and tvm[c] else "—"
        lines.append(f"| {c} | {_ms(ort[c])} | {_pct(ort[c], ort_total)} | {_ms(tvm[c])} | {_pct(tvm[c], tvm_total)} "
                     f"| {ratio} |")
        if c == "gemm/conv" and res["tvm"]["gemm_prep_ms"]:
            prep = res["tvm"]["gemm_prep_ms"]
            lines.append(f"| ↳ of which im2col/pad/pack_b (tvm) | | | {_ms(prep)} | {_pct(prep, tvm_total)} | |")
    lines.append(f"| **total (profiled)** | **{_ms(ort_total)}** | 100% | **{_ms(tvm_total)}** | 100% "
                 f"| **{tvm_total / ort_total:.2f}** |")
    e2e = res["end_to_end_ms"]
    lines.append(f"| end to end, no profiler | {_ms(e2e['ort'])} | | {_ms(e2e['tvm'])} | | {e2e['tvm'] / e2e['ort']:.2f} |")
    return lines


def ort_top(res: dict, top: int) -> list[str]:
    total = sum(res["ort"]["categories"].values())
    lines = [f"ORT's top {top} nodes:", "", "| # | node | op type | category | calls | ms | share | GOPS |",
             "|---:|---|---|---|---:|---:|---:|---:|"]
    for i, r in enumerate(res["ort"]["rows"][:top], 1):
        lines.append(f"| {i} | `{_short(r['name'])}` | {r['op']} | {r['category']} | {r['calls']} | {_ms(r['ms'])} "
                     f"| {_pct(r['ms'], total)} | {_gops(r['gops'])} |")
    return lines


def tvm_top(res: dict, top: int) -> list[str]:
    lines = [f"tvm-lowprec's top {top} kernels:", "",
             "| # | kernel | op | intrinsic | schedule | shape | category | calls | ms | share | GOPS | % copy |",
             "|---:|---|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(res["tvm"]["rows"][:top], 1):
        cells = profile_figures(r, empty="—")
        lines.append(f"| {i} | `{_short(r['name'])}` | {_op_summary(r)} | {r['intrinsic']} | {r['schedule']} "
                     f"| {r['shape']} | {r['category']} | {r['calls']} | {_ms(r['ms'])} | {100 * r['share']:.1f}% "
                     f"| {cells['GOPS']} | {cells['% copy']} |")
    return lines


def model_section(res: dict, top: int) -> list[str]:
    ort_gemm, tvm_gemm = res["ort"]["gemm"], res["tvm"]["gemm"]
    how = "each kernel alone (isolated)" if res["isolated"] else "in the model (VM instrument)"

    def gemm_line(label: str, g: dict) -> str:
        rest = f"; {_ms(g['unknown_ms'])} ms of GEMM/conv work without an op count" if g["unknown_ms"] >= 5e-3 else ""
        return f"- {label}: {g['gop']:.2f} Gop per run in {_ms(g['ms'])} ms = **{_gops(g['gops'])} GOPS**{rest}"

    return [
        f"## {res['model']} ({res['input']}; {res['threads']} thread{'s' if res['threads'] > 1 else ''})", "",
        f"ORT: profiler, mean of {res['runs']} runs after {res['warmup']} (its model_run median "
        f"{_ms(res['ort']['model_run_ms'])} ms). tvm-lowprec ({res['target']}, compiled in {res['compile_s']:.1f} s): "
        f"`Compiled.profile`, {how}, {res['runs']} runs. End to end: wall clock, interleaved, quiesced.", "",
        *category_table(res), "",
        "GEMM/conv throughput (2 ops per multiply-add):",
        gemm_line("ORT", ort_gemm), gemm_line("tvm-lowprec", tvm_gemm),
        *(["- the Gop differ: ORT's is the nodes' nominal work, tvm-lowprec's its kernels' own (a convolution's "
            "taps that only ever read padding, such as dilated ASPP taps on a small map, are not computed)"]
          if abs(ort_gemm["gop"] - tvm_gemm["gop"]) > 0.01 * max(ort_gemm["gop"], tvm_gemm["gop"]) else []), "",
        *ort_top(res, top), "", *tvm_top(res, top), "",
    ]


def render(results: list[dict], meta: dict, top: int) -> str:
    cpu = meta["host"]["cpu"]
    lines = ["# ONNX Runtime's profile vs tvm-lowprec's, per category", "",
             f"- date: {meta['date']}; host: {cpu['model']} ({cpu['logical_cpus']} logical CPUs)",
             "- versions: " + ", ".join(f"{k} {v or 'n/a'}" for k, v in meta["versions"].items()),
             f"- load average at start: {meta.get('loadavg_start')}, at end: {meta.get('loadavg_end')}",
             "- categories: ORT by op type; tvm-lowprec by kernel op / the operators in its name. ORT's fused "
             "QLinear* nodes include their requantization; tvm-lowprec fuses it into its GEMMs where it can, "
             "and a quantized add (two rescaled inputs) counts as element-wise on both sides.",
             "- ratio: tvm-lowprec ms / ORT ms (below 1: tvm-lowprec faster).", ""]
    for res in results:
        lines += model_section(res, top) if not res.get("error") else [f"## {res['model']}", "", f"error: {res['error']}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    held_out = "--heldout" in (sys.argv[1:] if argv is None else argv)
    if held_out:  # the held-out models join the registry before --models is parsed against it
        import heldout

        heldout.register()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", action="store_true",
                        help="benchmarks/heldout.py's models (and their cache) may be named in --models")
    parser.add_argument("--models", type=names_parser(zoo.REGISTRY, "model"),
                        default=["resnet50", "deeplabv3_mobilenet_v3_large", "vit_b_16", "distilbert"])
    parser.add_argument("--small", action="store_true", help="the zoo's reduced input sizes")
    parser.add_argument("--size", type=int, default=None, help="input size for every model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--isolated", action="store_true", help="tvm-lowprec: time each kernel alone")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--cache", type=Path, default=heldout.CACHE if held_out else zoo.DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    load_start = load_average()
    results = []
    for name in args.models:
        try:
            results.append(profile_model(name, args))
        except Exception as err:  # noqa: BLE001 - one model's failure is its section
            results.append({"model": name, "error": f"{type(err).__name__}: {err}"[:600]})
            print(f"[{name}] {results[-1]['error']}", file=sys.stderr, flush=True)
    meta = collect_metadata(benchmark={"name": "ort_profile", "models": args.models, "threads": args.threads,
                                       "runs": args.runs, "warmup": args.warmup, "isolated": args.isolated,
                                       "small": args.small, "size": args.size})
    meta.update(loadavg_start=load_start, loadavg_end=load_average())
    write_json(results, meta, args.out / "results.json")
    report = render(json_safe(results), meta, args.top)
    (args.out / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
