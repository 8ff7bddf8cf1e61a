"""Post-training quantization: FP32 Relax module + calibration data -> QDQ module, with a per-layer
accuracy report and an automatic FP32 fallback for the most harmful layers; also weight-only 4-bit
matmul weights with per-group scales, rounded to nearest or by GPTQ."""

from .calibrate import CalibrationError
from .config import (
    GPTQ,
    MSE,
    RTN,
    ConfigError,
    Entropy,
    LayerOverride,
    MinMax,
    PerChannel,
    PerGroup,
    Percentile,
    PerTensor,
    QuantConfig,
    QuantSpec,
)
from .quantize import Observations, observe, quantize
from .rounding import GroupedWeights, round_weights
from .report import AccuracyReport, TensorAccuracy, accuracy_report

__all__ = [
    "GPTQ", "MSE", "RTN", "AccuracyReport", "GroupedWeights", "round_weights", "Observations", "observe",
    "CalibrationError", "ConfigError", "Entropy", "LayerOverride", "MinMax",
    "PerChannel", "PerGroup", "PerTensor", "Percentile", "QuantConfig", "QuantSpec", "TensorAccuracy",
    "accuracy_report", "quantize",
]
