"""Post-training quantization: FP32 Relax module + calibration data -> QDQ module, with a per-layer
accuracy report and an automatic FP32 fallback for the most harmful layers."""

from .calibrate import CalibrationError
from .config import (
    MSE,
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
from .report import AccuracyReport, TensorAccuracy, accuracy_report

__all__ = [
    "MSE", "AccuracyReport", "Observations", "observe", "CalibrationError", "ConfigError", "Entropy", "LayerOverride", "MinMax",
    "PerChannel", "PerGroup", "PerTensor", "Percentile", "QuantConfig", "QuantSpec", "TensorAccuracy",
    "accuracy_report", "quantize",
]
