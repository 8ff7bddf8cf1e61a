"""FP32 ONNX -> QDQ INT8 with ONNX Runtime's static quantizer (MinMax calibration on a few samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import onnx

# The settings every model is quantized with (recorded in the build manifest).
QUANT_SETTINGS = {
    "quant_format": "QDQ",
    "per_channel": True,
    "activation_type": "QUInt8",
    "weight_type": "QInt8",
    "calibrate_method": "MinMax",
    "reduce_range": False,
}


class SampleReader:
    """An ``onnxruntime.quantization.CalibrationDataReader`` over a fixed list of feeds."""

    def __init__(self, samples: Iterable[Mapping[str, np.ndarray]]):
        self._samples = [dict(s) for s in samples]
        self._next = 0

    def get_next(self):
        if self._next >= len(self._samples):
            return None
        self._next += 1
        return self._samples[self._next - 1]

    def rewind(self):
        self._next = 0


def preprocess(model: onnx.ModelProto, out_path: Path) -> onnx.ModelProto:
    """ORT's ``quant_pre_process``: symbolic shape inference plus ORT's basic graph optimizations
    (constant folding of shape arithmetic once the input dims are fixed). Writes and returns the result."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    original = model.SerializeToString()  # quant_pre_process moves a large model's weights to a temporary file
    try:
        quant_pre_process(model, out_path)
    except (TypeError, ValueError, KeyError, AssertionError):  # ORT's symbolic shape inference failed inside
        # (an Expand of a computed shape: timm's EdgeNeXt, transformers' wav2vec2): ONNX's own inference then
        # (from a file: given a ModelProto, this path of ORT's reloads weights it never wrote)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="preprocess-") as tmp:
            source = Path(tmp) / "model.onnx"
            source.write_bytes(original)
            quant_pre_process(str(source), out_path, skip_symbolic_shape=True)
    return onnx.load(str(out_path))


def quantize_qdq(fp32_path: Path, int8_path: Path, samples: list[Mapping[str, np.ndarray]],
                 reduce_range: bool = False) -> onnx.ModelProto:
    """Quantize ``fp32_path`` into ``int8_path`` with :data:`QUANT_SETTINGS`, calibrated on ``samples``;
    ``reduce_range=True``: 7-bit weights (ORT's setting for CPUs without VNNI, exact on ``vpmaddubsw``)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        str(fp32_path),
        str(int8_path),
        SampleReader(samples),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=reduce_range,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return onnx.load(str(int8_path))
