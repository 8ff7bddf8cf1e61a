"""Bilinear resize as two 1-D passes with the coordinates in tables: along W into every input row,
then along H from two of those rows::

    rows[.., ih, ow] = x[.., ih, x0[ow]] * wx0[ow] + x[.., ih, x1[ow]] * wx1[ow]
    out[.., oh, ow]  = rows[.., y0[oh], ow] * wy0[oh] + rows[.., y1[oh], ow] * wy1[oh]

TVM's legalization computes each output's source coordinates in float (a floor, casts and clamps on
int64 per element) and reads its four pixels: DeepLabV3's 8x upsampling of 21x20x20 to 160x160 took
1.32 ms on a Zen 4 thread (2.5 ns an output, 1.8% of copy bandwidth). The tables hold, per output row
and column, the two source indices (clamped to the image) and the two weights, computed at compile time
with TVM's float32 arithmetic (:func:`axis_tables`), and the products are TVM's ``_lerp``, W first:
the same values, an H pass that is two contiguous vector loads and two multiply-adds per vector of
outputs, and a W pass over the input's rows only. Coordinate modes: ``half_pixel``,
``pytorch_half_pixel``, ``align_corners``, ``asymmetric`` (ONNX's, the source coordinate ``x * in /
out``, interpolated; TVM's own takes an integer division there where the sizes divide, which is not
interpolation). Scheduled by :class:`~tvm_lowprec.schedule.resize.ResizeRule`.
"""

from __future__ import annotations

import numpy as np
from tvm import te

OP = "resize_linear"
MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def source_coordinates(in_n: int, out_n: int, mode: str) -> np.ndarray:
    """The float32 source coordinate of each output index along one axis (TVM's ``get_inx``)."""
    o = np.arange(out_n, dtype=np.float32)
    scale = np.float32(in_n) / np.float32(out_n)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out_n > 1):
        return (o + np.float32(0.5)) * scale - np.float32(0.5)
    if mode == "pytorch_half_pixel":
        return np.zeros(out_n, np.float32)
    if mode == "align_corners":
        return np.float32(in_n - 1) / np.float32(max(out_n - 1, 1)) * o
    if mode == "asymmetric":
        return scale * o
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not one of {MODES}")


def axis_tables(in_n: int, out_n: int, mode: str) -> tuple[np.ndarray, ...]:
    """``(i0, i1, w0, w1)`` along one axis: the two source indices, clamped to ``[0, in_n)``, and the
    weights ``1 - t``, ``t`` with ``t = c - floor(c)`` (as TVM: from the unclamped floor)."""
    c = source_coordinates(in_n, out_n, mode)
    base = np.floor(c)
    t = (c - base).astype(np.float32)
    i0 = np.clip(base.astype(np.int64), 0, in_n - 1).astype(np.int32)
    i1 = np.clip(base.astype(np.int64) + 1, 0, in_n - 1).astype(np.int32)
    return i0, i1, (np.float32(1.0) - t).astype(np.float32), t


def _lerp_along(source, axis: int, extent, i0, i1, w0, w1, name: str):
    shape = list(source.shape)
    shape[axis] = extent

    def element(*i):
        a, b = list(i), list(i)
        a[axis], b[axis] = i0[i[axis]], i1[i[axis]]
        return source[tuple(a)] * w0[i[axis]] + source[tuple(b)] * w1[i[axis]]

    return te.compute(shape, element, name=name)


def separable_linear_resize(x, y0, y1, wy0, wy1, x0, x1, wx0, wx1, layout: str):
    """The TE output of the bilinear resize of ``x`` (NCHW or NHWC) from its tables (te tensors of
    :func:`axis_tables`: H's, then W's)."""
    h_axis, w_axis = layout.index("H"), layout.index("W")
    rows = _lerp_along(x, w_axis, x0.shape[0], x0, x1, wx0, wx1, "resize_rows")
    return _lerp_along(rows, h_axis, y0.shape[0], y0, y1, wy0, wy1, "resize")
