"""Weight rounding for matmul weights [K, N] in groups along K: from float weights to integers, one scale
(and zero point) per group of ``block`` consecutive K rows and output column.

Used by :mod:`.quantize` for 4-bit weights (PerGroup: ``block`` = the group size; PerChannel: one group
of K rows) and for weights rounded by :class:`~.config.GPTQ`. The rounding method is found by the
type of ``QuantSpec.method`` (:data:`ROUNDERS`): :func:`round_to_nearest` here, :func:`~.gptq.gptq`
in its own file. Each returns a :class:`GroupedWeights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import GPTQ, RTN, ConfigError, QuantSpec
from .observers import (
    dequantize_values,
    group_range,
    qparams_array,
    qrange,
    quantize_values,
)


@dataclass(frozen=True)
class GroupedWeights:
    """Integer weights and their per-group parameters: ``values`` int32 [K, N], ``scale`` float32 and
    ``zero_point`` int32 [ceil(K / block), N]."""

    values: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    block: int

    def expand(self, params: np.ndarray) -> np.ndarray:
        """Per-group ``params`` [G, N] repeated to one row per K row [K, N]."""
        return np.repeat(params, self.block, axis=0)[: self.values.shape[0]]

    def dequantized(self) -> np.ndarray:
        """The float32 weights the compiled model multiplies by (the numpy model of its dequantize)."""
        return dequantize_values(self.values, self.expand(self.scale), self.expand(self.zero_point))


def group_params(rows: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """Scale [N] and zero point [N] of one group of weight rows [g, N], from ``spec``'s observer."""
    lo, hi = group_range(spec.observer, rows, spec.carrier, spec.symmetric, spec.bits)
    return qparams_array(lo, hi, spec.carrier, spec.symmetric, spec.bits)


def limits(spec: QuantSpec) -> tuple[int, int]:
    return qrange(spec.carrier, spec.symmetric, spec.bits)


def round_to_nearest(w: np.ndarray, spec: QuantSpec, block: int, hessian=None) -> GroupedWeights:
    """Each group's scale from its own weights, each weight rounded to the nearest level."""
    k = w.shape[0]
    scales, zps = zip(*(group_params(w[start:start + block], spec) for start in range(0, k, block)))
    scale, zp = np.stack(scales), np.stack(zps)
    out = GroupedWeights(np.empty(w.shape, np.int32), scale, zp, block)
    values = quantize_values(w, out.expand(scale), out.expand(zp), limits(spec))
    return GroupedWeights(values, scale, zp, block)


def _gptq(w, spec, block, hessian):
    from .gptq import gptq

    return gptq(w, spec, block, hessian)


# the rounding of each QuantSpec.method type: (weights [K, N], spec, block, H [K, K] or None) -> GroupedWeights
ROUNDERS = {RTN: round_to_nearest, GPTQ: _gptq}
NEEDS_MOMENTS = (GPTQ,)  # methods that need the layer input's second moments from calibration


def round_weights(w: np.ndarray, spec: QuantSpec, block: int, hessian=None) -> GroupedWeights:
    """``w`` [K, N] rounded in groups of ``block`` rows by ``spec.method``."""
    rounder = ROUNDERS.get(type(spec.method))
    if rounder is None:
        raise ConfigError(f"no weight rounding for method {spec.method!r}")
    return rounder(np.asarray(w, np.float64), spec, block, hessian)
