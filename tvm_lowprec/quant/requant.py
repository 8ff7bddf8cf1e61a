"""Requantization arithmetic shared by the kernels, the graph rewrite and the numpy references.

``float`` mode: ``clamp(rint(float64(acc) * float32(mult)) + zp)``; ``rint`` rounds half to even, as ONNX
``QuantizeLinear`` does, and the float64 product is what ``onnx.reference``'s QLinearMatMul computes. ``fixed_point`` mode: ``mult = m0 * 2**-(31 + shift)``
with ``m0`` in ``[2**30, 2**31)``; ``(acc * m0 + 2**(30 + shift)) >> (31 + shift)`` rounds half up, and
can differ from ``float`` mode by one step where ``acc * mult`` lies within float32 rounding of a tie.
"""

from __future__ import annotations

import numpy as np


def fixed_point_multiplier(scale) -> tuple[np.ndarray, np.ndarray]:
    """Split positive float multipliers into (int32 m0, int32 shift) with ``scale ~= m0 * 2**-(31+shift)``."""
    scale = np.asarray(scale, np.float64)
    if np.any(~np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError("requantization multipliers must be finite and positive")
    if np.any(scale >= 2.0**30):
        raise ValueError("requantization multiplier too large for fixed-point mode (>= 2**30)")
    mant, exp = np.frexp(scale)  # scale = mant * 2**exp, mant in [0.5, 1)
    m0 = np.round(mant * 2.0**31).astype(np.int64)
    carry = m0 == 2**31
    m0[carry] //= 2
    exp = exp + carry
    shift = -exp  # scale = m0 * 2**(exp - 31) = m0 * 2**-(31 + shift)
    if np.any(shift + 31 < 1):
        raise ValueError("requantization multiplier too large for fixed-point mode")
    return m0.astype(np.int32), shift.astype(np.int32)


def qrange(dtype: str) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def requantize_ref(acc, mult, zero_point, out_dtype, qmin=None, qmax=None, mode="float"):
    """numpy reference of the kernel epilogue (used by tests and by constant folding)."""
    lo, hi = qrange(out_dtype)
    lo = lo if qmin is None else max(lo, qmin)
    hi = hi if qmax is None else min(hi, qmax)
    acc = np.asarray(acc)
    if mode == "float":
        y = np.rint(acc.astype(np.float64) * np.asarray(mult, np.float32).astype(np.float64)) + zero_point
    else:
        m0, shift = fixed_point_multiplier(np.broadcast_to(mult, acc.shape[-1:]))
        total = shift.astype(np.int64) + 31
        y = ((acc.astype(np.int64) * m0.astype(np.int64) + (np.int64(1) << (total - 1))) >> total) + zero_point
    return np.clip(y, lo, hi).astype(out_dtype)
