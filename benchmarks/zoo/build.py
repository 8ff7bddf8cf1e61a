"""Export -> ORT pre-processing -> ORT static quantization of a zoo model, cached by name and options.

The FP32 graph goes through ONNX Runtime's ``quant_pre_process`` and is quantized by its
``quantize_static``, as the reference models are (``benchmarks/models/quantize.py``, reused here):
QDQ, per-channel int8 weights, uint8 activations, MinMax calibration on a few random inputs
(``benchmarks/models/build.py``'s calibration seed). ``QuantOptions`` adds the QOperator format and
int8 activations (S8S8). The cached files, in the cache folder:

- ``<name>-<size>-<exporter>.fp32-export.onnx``: the exporter's file;
- ``<name>-<size>-<exporter>.fp32.onnx``: after ``quant_pre_process`` (ORT FP32 runs this one);
- ``<name>-<size>-<exporter>.<qdq|qoperator>-<u8s8|s8s8>-c<N>.int8.onnx`` and ``.json`` (its manifest).
"""

from __future__ import annotations

import collections
import datetime
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from models.build import BuiltModel, InputSpec, ModelSpec, calibration_samples  # noqa: E402  (benchmarks/)
from models.quantize import QUANT_SETTINGS, SampleReader, preprocess, quantize_qdq  # noqa: E402

from .common import DEFAULT_CACHE, ZooModel


@dataclass(frozen=True)
class QuantOptions:
    """How the FP32 graph is quantized: ``fmt`` QDQ (default) or QOperator; ``s8s8``: int8 activations
    (default uint8); ``calibration``: random calibration inputs (at most 8); ``reduce_range``: 7-bit
    weights, ORT's advice for CPUs without VNNI (its AVX2 u8s8 kernel, ``vpmaddubsw``, saturates a pair of
    full-range products; with 7-bit weights it cannot, and tvm-lowprec's AVX2 row takes ``vpmaddubsw`` too)."""

    fmt: str = "QDQ"
    s8s8: bool = False
    calibration: int = 4
    reduce_range: bool = False

    def __post_init__(self):
        if self.fmt not in ("QDQ", "QOperator"):
            raise ValueError(f"quantization format must be QDQ or QOperator, not {self.fmt!r}")
        if not 1 <= self.calibration <= 8:
            raise ValueError("calibration samples: 1 to 8")

    @property
    def key(self) -> str:
        return (f"{self.fmt.lower()}-{'s8s8' if self.s8s8 else 'u8s8'}-c{self.calibration}"
                + ("-rr" if self.reduce_range else ""))

    @property
    def settings(self) -> dict:
        return {**QUANT_SETTINGS, "quant_format": self.fmt, "activation_type": "QInt8" if self.s8s8 else "QUInt8",
                "calibration_samples": self.calibration, "reduce_range": self.reduce_range}


def input_specs(model: onnx.ModelProto) -> tuple[InputSpec, ...]:
    """The graph inputs as :class:`InputSpec`: floats ``normal``, int64 ``*mask*`` ``ones``, other int64
    ``tokens`` (every dimension must be fixed)."""
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value for d in tensor.shape.dim)
        if any(d <= 0 for d in dims):
            raise ValueError(f"input {value.name} has a dynamic shape {dims}; export with static shapes")
        if tensor.elem_type == onnx.TensorProto.FLOAT:
            kind = "normal"
        elif tensor.elem_type == onnx.TensorProto.INT64:
            kind = "ones" if "mask" in value.name else "tokens"
        else:
            raise ValueError(f"input {value.name}: element type {tensor.elem_type} is not float32 or int64")
        specs.append(InputSpec(value.name, dims, kind))
    return tuple(specs)


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def quantize(fp32_path: Path, int8_path: Path, samples: list[dict], options: QuantOptions) -> None:
    """The default options through the reference models' own :func:`quantize_qdq`; QOperator or S8S8
    through ``quantize_static`` with the same settings otherwise."""
    if options.fmt == "QDQ" and not options.s8s8:
        quantize_qdq(fp32_path, int8_path, samples, reduce_range=options.reduce_range)
        return
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(str(fp32_path), str(int8_path), SampleReader(samples),
                    quant_format=getattr(QuantFormat, options.fmt), per_channel=True, reduce_range=options.reduce_range,
                    activation_type=QuantType.QInt8 if options.s8s8 else QuantType.QUInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)


def build(entry: ZooModel, cache: Path = DEFAULT_CACHE, size: int | None = None, small: bool = False,
          dynamo: bool = True, options: QuantOptions = QuantOptions(), force: bool = False,
          timings: dict | None = None) -> BuiltModel:
    """Export (cached), pre-process (cached) and quantize (cached) ``entry``: a :class:`BuiltModel` whose
    spec compares the graph's first output. ``timings`` receives ``export_s``, ``preprocess_s`` and
    ``quantize_s`` (0 where the cache had the file)."""
    timings = {} if timings is None else timings
    cache = Path(cache)
    size = entry.resolve_size(size, small)
    key = entry.key(size, dynamo)
    start = time.perf_counter()
    exported = entry(cache, size=size, dynamo=dynamo, force=force)
    timings["export_s"] = time.perf_counter() - start

    fp32_path = cache / f"{key}.fp32.onnx"
    start = time.perf_counter()
    if force or not fp32_path.exists():
        tmp = fp32_path.with_suffix(".tmp.onnx")
        preprocess(onnx.load(str(exported)), tmp)
        tmp.replace(fp32_path)
    timings["preprocess_s"] = time.perf_counter() - start
    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    spec = ModelSpec(entry.name, entry.description, input_specs(fp32), fp32.graph.output[0].name,
                     lambda _cache: onnx.load(str(exported)))

    int8_path = cache / f"{key}.{options.key}.int8.onnx"
    manifest_path = int8_path.with_suffix("").with_suffix(".json")
    start = time.perf_counter()
    if force or not int8_path.exists() or not manifest_path.exists():
        tmp = int8_path.with_suffix(".tmp.onnx")
        quantize(fp32_path, tmp, calibration_samples(spec)[: options.calibration], options)
        tmp.replace(int8_path)
        int8 = onnx.load(str(int8_path), load_external_data=False)
        manifest = {
            "name": entry.name, "source": entry.source, "description": entry.description, "size": size,
            "exporter": key.rsplit("-", 1)[1],
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "inputs": [asdict(i) for i in spec.inputs], "output": spec.output,
            "quantization": options.settings,
            "fp32": {"file": fp32_path.name, "nodes": len(fp32.graph.node), "ops": _ops(fp32)},
            "int8": {"file": int8_path.name, "nodes": len(int8.graph.node), "ops": _ops(int8)},
        }
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    timings["quantize_s"] = time.perf_counter() - start
    return BuiltModel(spec, fp32_path, int8_path, json.loads(manifest_path.read_text()))


# ops that move or average values without changing their unit: the step of their input is the output's
_PASS_THROUGH = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "ReduceMean",
                 "GlobalAveragePool", "AveragePool", "MaxPool", "GlobalMaxPool", "Slice", "Gather"}


def output_scale(int8_path: Path, output: str) -> float | None:
    """The quantization step of ``output`` in the quantized graph: the per-tensor scale of the
    DequantizeLinear producing it, looking through ops that keep the unit (:data:`_PASS_THROUGH`:
    reshapes, averages); None where float arithmetic follows the last DequantizeLinear."""
    model = onnx.load(str(int8_path), load_external_data=False)
    producers = {out: n for n in model.graph.node for out in n.output}
    init = {i.name: i for i in model.graph.initializer}
    name = output
    for _ in range(8):
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "DequantizeLinear":
            scale = init.get(node.input[1])
            if scale is None:
                return None
            value = onnx.numpy_helper.to_array(scale)
            return float(value) if value.size == 1 else None
        if node.op_type not in _PASS_THROUGH:
            return None
        name = node.input[0]
    return None
