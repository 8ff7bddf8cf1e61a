"""Post-training quantization settings: frozen value objects, serialisable to JSON and back.

The default :class:`QuantConfig` is like-for-like with ONNX Runtime's ``quantize_static`` in QDQ form:
uint8 asymmetric per-tensor activations, int8 symmetric per-channel weights, MinMax calibration::

    from tvm_lowprec.ptq import QuantConfig, QuantSpec, Percentile, LayerOverride
    config = QuantConfig(activations=QuantSpec("uint8", observer=Percentile(99.99)),
                         overrides=(LayerOverride("/head/Gemm", skip=True),), target_sqnr=30.0)
    QuantConfig.from_json(config.to_json()) == config   # True

Weight-only 4-bit (activations stay float; one scale per 128 weights along K, error feedback)::

    QuantConfig(activations=None, weights=QuantSpec("int4", symmetric=True, granularity=PerGroup(128),
                                                    method=GPTQ()), operators=("matmul",))
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
    """One scale (and zero point) per ``size`` consecutive weights along the reduction axis K of a
    matmul weight [K, N], for each output column (block quantization; the last group of a K that is
    not a multiple of ``size`` is shorter). For 4-bit weights (``int4``/``uint4``) of matmul layers:
    :func:`~tvm_lowprec.ptq.quantize` refuses it for activations, 8-bit weights and conv2d weights."""

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


# ---------------------------------------------------------------------------- weight rounding


@dataclass(frozen=True)
class RTN:
    """Round to nearest: each weight rounded on its own with its group's (or channel's) scale."""


@dataclass(frozen=True)
class GPTQ:
    """Error feedback (Frantar et al. 2022, "GPTQ"): the weights are rounded one K row at a time, and
    each row's rounding error is spread over the rows not yet rounded, weighted by the inverse of the
    layer input's second moments ``H = X^T X`` seen in calibration, so that the *output* error on
    data like the calibration data is smallest. Group scales are computed when a group starts, from
    the already-corrected weights. For matmul weights with PerGroup or PerChannel granularity.

    damp: added to H's diagonal, as a fraction of its mean diagonal (keeps H invertible).
    block: rows per lazy batch update (rounded to whole groups); only speed depends on it.
    shrink: shrink H's off-diagonal toward 0 by the share of it that sampling noise explains (a
    Ledoit-Wolf-style intensity from the number of calibration rows, Gaussian approximation). Plain
    GPTQ (False) fits the calibration rows: with weakly correlated inputs and calibration rows not
    many times K it rounds *worse* than RTN on other inputs; with ``shrink=True`` it falls back
    towards RTN there and keeps most of its gain on correlated inputs (docs/ptq.md has numbers).
    """

    damp: float = 0.01
    block: int = 128
    shrink: bool = False

    def __post_init__(self):
        if not 0.0 < self.damp <= 1.0 or not isinstance(self.block, int) or self.block < 1:
            raise ConfigError(f"GPTQ needs 0 < damp <= 1 and an integer block >= 1, got {self.damp}, {self.block!r}")


Method = RTN | GPTQ


# ---------------------------------------------------------------------------- specs


# quantized dtype -> the 8-bit type that carries its values (4-bit values are stored one per byte)
CARRIERS = {"uint8": "uint8", "int8": "int8", "uint4": "uint8", "int4": "int8"}
# float weight dtypes: no scale, no zero point; the layer's activations stay float (``"bfloat16"``:
# the weights rounded to bf16, on the bf16 GEMM where the target has one: docs/ptq.md)
FLOAT_WEIGHTS = ("bfloat16",)


@dataclass(frozen=True)
class QuantSpec:
    """How one kind of tensor is quantized.

    ``int4``/``uint4`` are for weights ([-8, 7] / [0, 15]; symmetric int4 uses [-7, 7]), with PerGroup
    or PerChannel granularity; their ``bits`` is at most 4 (the default 8 reads as the whole dtype, 4).
    ``method`` (weights only) chooses how the weights are rounded: :class:`RTN` or :class:`GPTQ`.
    ``bfloat16`` (weights only, for layers too sensitive for 8 bits): the weights rounded to bf16 (to
    nearest even), the layer's activations left float; granularity, observer, bits and method do not
    apply.
    """

    dtype: str = "uint8"
    symmetric: bool = False
    granularity: Granularity = field(default_factory=PerTensor)
    observer: Observer = field(default_factory=MinMax)
    # the integer range used, in bits of ``dtype`` (7: ONNX Runtime's reduce_range, [-64, 63] or [0, 127];
    # symmetric int8 leaves out the lowest value, [-63, 63])
    bits: int = 8
    method: Method = field(default_factory=RTN)

    def __post_init__(self):
        if self.dtype in FLOAT_WEIGHTS:
            return
        if self.dtype not in CARRIERS:
            raise ConfigError(f"quantized dtype must be one of {sorted(CARRIERS) + list(FLOAT_WEIGHTS)}, "
                              f"got {self.dtype!r}")
        width = 4 if self.dtype.endswith("4") else 8
        if width == 4 and self.bits == 8:
            object.__setattr__(self, "bits", 4)
        if not isinstance(self.bits, int) or not 2 <= self.bits <= width:
            raise ConfigError(f"bits must be an integer from 2 to {width} (the range within {self.dtype}), "
                              f"got {self.bits!r}")
        if width == 4 and isinstance(self.granularity, PerTensor):
            raise ConfigError(f"{self.dtype} needs PerGroup or PerChannel granularity: one scale for a whole "
                              f"tensor leaves 16 levels for every weight")
        if not isinstance(self.method, (RTN, GPTQ)):
            raise ConfigError(f"method must be RTN() or GPTQ(), got {self.method!r}")

    @property
    def carrier(self) -> str:
        """The 8-bit dtype that holds the quantized values (int8 for int4, uint8 for uint4; bfloat16 itself)."""
        return CARRIERS.get(self.dtype, self.dtype)

    def describe(self) -> str:
        """A short label: ``"int4 sym g128 GPTQ"``, ``"uint8 per-tensor"``, ``"bfloat16"``."""
        if self.dtype in FLOAT_WEIGHTS:
            return self.dtype
        g, m = self.granularity, self.method
        full = 4 if self.dtype.endswith("4") else 8
        parts = [self.dtype + (f"/{self.bits}b" if self.bits != full else ""), "sym" if self.symmetric else "",
                 f"g{g.size}" if isinstance(g, PerGroup) else "per-channel" if isinstance(g, PerChannel) else "per-tensor",
                 ("GPTQ-shrink" if m.shrink else "GPTQ") if isinstance(m, GPTQ) else ""]
        return " ".join(p for p in parts if p)


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

    activations: ``None`` for weight-only quantization: the layers' inputs and outputs stay float (no
    activation quantize/dequantize; calibration is skipped unless a weight method such as
    :class:`GPTQ` needs the inputs' statistics).
    operators: which operators to quantize (``"matmul"``, ``"conv2d"``: those with constant weights).
    overrides: per-layer settings. target_sqnr: with a value (dB), layers are kept in FP32, the most
    harmful first, until the model's output SQNR against FP32 reaches it (``quantize`` says which),
    on every output, or on the outputs named in target_outputs (each output's own SQNR: a large output
    that stays exact does not hide a small one that does not; unknown names are an error).
    """

    activations: QuantSpec | None = DEFAULT_ACTIVATIONS
    weights: QuantSpec = DEFAULT_WEIGHTS
    operators: tuple[str, ...] = OPERATORS
    overrides: tuple[LayerOverride, ...] = ()
    target_sqnr: float | None = None
    target_outputs: tuple[str, ...] | None = None

    def __post_init__(self):
        unknown = set(self.operators) - set(OPERATORS)
        if unknown:
            raise ConfigError(f"cannot quantize operator(s) {sorted(unknown)}; supported: {list(OPERATORS)}")
        object.__setattr__(self, "operators", tuple(self.operators))
        object.__setattr__(self, "overrides", tuple(self.overrides))
        if self.target_outputs is not None:
            if isinstance(self.target_outputs, str) or not self.target_outputs:
                raise ConfigError(f"target_outputs must be a non-empty list of output names, got "
                                  f"{self.target_outputs!r}")
            object.__setattr__(self, "target_outputs", tuple(str(n) for n in self.target_outputs))
            if self.target_sqnr is None:
                raise ConfigError("target_outputs names the outputs target_sqnr is for; set target_sqnr too")
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


_TYPES = {t.__name__: t for t in (PerTensor, PerChannel, PerGroup, MinMax, Percentile, Entropy, MSE, RTN, GPTQ,
                                   QuantSpec, LayerOverride, QuantConfig)}


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
