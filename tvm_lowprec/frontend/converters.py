"""Converters for ONNX operators that TVM 0.27's Relax importer lacks, in its own converter form.

``Clip`` with constant bounds becomes ``relax.op.clip`` (below). ``ConvInteger`` is an int32 convolution of zero-point-shifted 8-bit operands; it has no float
equivalent in ONNX (a float Conv loses exactness past 2**24), so it is converted here, into the same
``astype -> subtract -> conv2d`` shape that ``MatMulInteger`` takes, which the integer rewrite matches.
The importer is given these converters only for the duration of :func:`tvm_lowprec.from_onnx`.
"""

from __future__ import annotations

import contextlib

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx


def _widen(bb, x, zero_point, channel_axis_shape=None):
    x = relax.op.astype(x, "int32")
    if zero_point is None:
        return x
    zp = bb.normalize(relax.op.astype(zero_point, "int32"))
    if channel_axis_shape is not None and len(zp.ty.shape) == 1:
        zp = relax.op.reshape(zp, channel_axis_shape)  # per-output-channel weight zero point
    elif len(zp.ty.shape) == 1:
        zp = relax.op.reshape(zp, ())
    return relax.op.subtract(x, zp)


class ConvInteger(_tvm_onnx.OnnxOpConverter):
    """``y = conv(x - x_zero_point, w - w_zero_point)`` in int32 (ONNX ConvInteger-10)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w = inputs[0], inputs[1]
        x_zp = inputs[2] if len(inputs) > 2 else None
        w_zp = inputs[3] if len(inputs) > 3 else None
        out_channels = int(w.ty.shape[0])
        ndim = len(w.ty.shape)
        x32 = bb.normalize(_widen(bb, x, x_zp))
        w32 = bb.normalize(_widen(bb, w, w_zp, (out_channels,) + (1,) * (ndim - 1)))
        return _tvm_onnx.Conv._impl_v11(bb, [x32, w32, None], dict(attr), params)


def _scalar_bound(expr):
    """The float value of a constant scalar Clip bound, or None (absent, non-constant, NaN)."""
    import numpy as np
    import tvm

    if expr is None or not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = expr.value.numpy()
    if value.size != 1 or np.isnan(value.reshape(())):
        return None
    return float(value.reshape(()))


class Clip(_tvm_onnx.Clip):
    """Clip with constant bounds as ``relax.op.clip`` (TVM's importer emits two ``call_tir`` of TE
    maximum/minimum, which no pass can read): the integer rewrite then folds it into the kernel's
    output range, and calibration sees it as the layer's activation."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        lo, hi = float(attr.get("min", float("-inf"))), float(attr.get("max", float("inf")))
        return relax.op.clip(inputs[0], lo, hi)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        given = [inputs[i] if len(inputs) > i else None for i in (1, 2)]
        bounds = [_scalar_bound(b) for b in given]
        if any(g is not None and b is None for g, b in zip(given, bounds)):
            return super()._impl_v13(bb, inputs, attr, params)  # run-time or NaN bounds: TVM's form
        lo = bounds[0] if bounds[0] is not None else float("-inf")
        hi = bounds[1] if bounds[1] is not None else float("inf")
        return relax.op.clip(inputs[0], lo, hi)


EXTRA_CONVERTERS = {"ConvInteger": ConvInteger, "Clip": Clip}


@contextlib.contextmanager
def extra_converters():
    """TVM's ONNX importer, with :data:`EXTRA_CONVERTERS` added, inside this block only."""
    original = _tvm_onnx._get_convert_map

    def extended():
        table = dict(original())
        table.update(EXTRA_CONVERTERS)
        return table

    _tvm_onnx._get_convert_map = extended
    try:
        yield
    finally:
        _tvm_onnx._get_convert_map = original
