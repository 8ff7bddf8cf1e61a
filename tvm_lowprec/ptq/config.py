"""Post-training quantization settings: frozen value objects, serialisable to JSON and back.

The default :class:`QuantConfig` is like-for-like with ONNX Runtime's ``quantize_static`` in QDQ form:
uint8 asymmetric per-tensor activations, int8 symmetric per-channel weights, MinMax calibration::

    from tvm_lowprec.ptq import QuantConfig, QuantSpec, Percentile, LayerOverride
    config = QuantConfig(activations=QuantSpec("uint8", observer=Percentile(99.99)),
                         overrides=(LayerOverride("/head/Gemm", skip=True),), target_sqnr=30.0)
    QuantConfig.from_json(config.to_json()) == config   # True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ..errors import LowPrecError


class ConfigError(LowPrecError, ValueError):
    """A quantization setting that is invalid or cannot be applied (names the setting)."""


# ---------------------------------------------------------------------------- granularity


@dataclass(frozen=True)
class PerTensor:
    """One scale and zero point for the whole tensor."""


@dataclass(frozen=True)
class PerChannel:
    """One scale and zero point per index of ``axis`` (for weights: the output channel; negative
    counts from the end). ``axis=None`` picks the output-channel axis of each operator (a conv's 0,
    a matmul's last)."""

    axis: int | None = None


@dataclass(frozen=True)
class PerGroup:
    """One scale per ``size`` consecutive weights along the reduction axis (block quantization).

    Accepted in a config and serialised, but :func:`~tvm_lowprec.ptq.quantize` raises
    :class:`ConfigError` for it: the integer kernels and Relax's dequantize have no blocked scales yet.
    """

    size: int = 128

    def __post_init__(self):
        if self.size < 1:
            raise ConfigError(f"PerGroup size must be positive, got {self.size}")


# ---------------------------------------------------------------------------- observers


@dataclass(frozen=True)
class MinMax:
    """The range of every value seen."""


@dataclass(frozen=True)
class Percentile:
    """Clip to the ``percentile``-th percentile of |x| (symmetric) or to the (100-p, p) percentiles."""

    percentile: float = 99.999

    def __post_init__(self):
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"Percentile must be in (50, 100], got {self.percentile}")


@dataclass(frozen=True)
class Entropy:
    """The clipping threshold that minimises the KL divergence between the histogram of the values and
    its quantized version (TensorRT's calibration), over a ``bins``-bin histogram."""

    bins: int = 2048

    def __post_init__(self):
        if self.bins < 256:
            raise ConfigError(f"Entropy needs at least 256 histogram bins, got {self.bins}")


@dataclass(frozen=True)
class MSE:
    """The clipping range, among ``steps`` shrinkings of the full range down to ``min_fraction`` of it,
    whose quantize-dequantize round trip has the smallest mean squared error on the observed values."""

    steps: int = 100
    min_fraction: float = 0.2

    def __post_init__(self):
        if self.steps < 2 or not 0.0 < self.min_fraction < 1.0:
            raise ConfigError(f"MSE needs steps >= 2 and 0 < min_fraction < 1, got {self.steps}, {self.min_fraction}")


Granularity = PerTensor | PerChannel | PerGroup
Observer = MinMax | Percentile | Entropy | MSE


# ---------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class QuantSpec:
    """How one kind of tensor is quantized."""

    dtype: str = "uint8"
    symmetric: bool = False
    granularity: Granularity = field(default_factory=PerTensor)
    observer: Observer = field(default_factory=MinMax)
    # the integer range used, in bits of ``dtype`` (7: ONNX Runtime's reduce_range, [-64, 63] or [0, 127];
    # symmetric int8 leaves out the lowest value, [-63, 63])
    bits: int = 8

    def __post_init__(self):
        if self.dtype not in ("uint8", "int8"):
            raise ConfigError(f"quantized dtype must be 'uint8' or 'int8', got {self.dtype!r}")
        if not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise ConfigError(f"bits must be an integer from 2 to 8 (the range within {self.dtype}), got {self.bits!r}")


DEFAULT_ACTIVATIONS = QuantSpec("uint8", symmetric=False, granularity=PerTensor(), observer=MinMax())
DEFAULT_WEIGHTS = QuantSpec("int8", symmetric=True, granularity=PerChannel(), observer=MinMax())
OPERATORS = ("matmul", "conv2d")


@dataclass(frozen=True)
class LayerOverride:
    """Settings for one layer, by name (see :func:`~tvm_lowprec.ptq.layers.find_layers`): other
    activation or weight specs, or ``skip=True`` to keep it in FP32."""

    layer: str
    activations: QuantSpec | None = None
    weights: QuantSpec | None = None
    skip: bool = False


@dataclass(frozen=True)
class QuantConfig:
    """What :func:`~tvm_lowprec.ptq.quantize` does.

    operators: which operators to quantize (``"matmul"``, ``"conv2d"``: those with constant weights).
    overrides: per-layer settings. target_sqnr: with a value (dB), layers are kept in FP32, the most
    harmful first, until the model's output SQNR against FP32 reaches it (``quantize`` says which).
    """

    activations: QuantSpec = DEFAULT_ACTIVATIONS
    weights: QuantSpec = DEFAULT_WEIGHTS
    operators: tuple[str, ...] = OPERATORS
    overrides: tuple[LayerOverride, ...] = ()
    target_sqnr: float | None = None

    def __post_init__(self):
        unknown = set(self.operators) - set(OPERATORS)
        if unknown:
            raise ConfigError(f"cannot quantize operator(s) {sorted(unknown)}; supported: {list(OPERATORS)}")
        object.__setattr__(self, "operators", tuple(self.operators))
        object.__setattr__(self, "overrides", tuple(self.overrides))
        names = [o.layer for o in self.overrides]
        if len(names) != len(set(names)):
            raise ConfigError(f"more than one override for a layer: {sorted(n for n in names if names.count(n) > 1)}")

    @classmethod
    def for_target(cls, target="native") -> "QuantConfig":
        """The default config for a target row: ONNX Runtime's defaults, except that on a row whose fast
        exact recipe takes bounded weights (``vpmaddubsw`` without VNNI, which sums pairs of products in
        int16), weights use the widest range it accepts for any values (7 bits), as ORT's
        ``reduce_range`` does there. :func:`~tvm_lowprec.ptq.quantize` with no config uses this."""
        from ..targets import resolve_target

        bits = resolve_target(target).fast_weight_bits()
        if bits is None or bits >= DEFAULT_WEIGHTS.bits:
            return cls()
        return cls(weights=dataclasses.replace(DEFAULT_WEIGHTS, bits=bits))

    def for_layer(self, name: str) -> LayerOverride:
        """The effective settings of layer ``name`` (its override merged over the defaults)."""
        for o in self.overrides:
            if o.layer == name:
                return LayerOverride(name, o.activations or self.activations, o.weights or self.weights, o.skip)
        return LayerOverride(name, self.activations, self.weights, False)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _encode(self)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "QuantConfig":
        config = _decode(data)
        if not isinstance(config, cls):
            raise ConfigError(f"expected a QuantConfig, got {type(config).__name__}")
        return config

    @classmethod
    def from_json(cls, text: str) -> "QuantConfig":
        return cls.from_dict(json.loads(text))


_TYPES = {t.__name__: t for t in (PerTensor, PerChannel, PerGroup, MinMax, Percentile, Entropy, MSE, QuantSpec,
                                   LayerOverride, QuantConfig)}


def _encode(value):
    if dataclasses.is_dataclass(value):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **fields}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value):
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind not in _TYPES:
        raise ConfigError(f"unknown config object type {kind!r}; known: {sorted(_TYPES)}")
    cls = _TYPES[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(value) - names - {"type"}
    if extra:
        raise ConfigError(f"{kind} has no field(s) {sorted(extra)}")
    return cls(**{k: _decode(v) for k, v in value.items() if k != "type"})
