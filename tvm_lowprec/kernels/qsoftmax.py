"""Softmax over one axis of an 8-bit tensor (the last, or any other: a DFL head's bins), to an 8-bit
tensor, with a 256-entry exponential table.

With ``x = s * (q - z)`` per tensor, ``exp(x_j - max_k x_k) = exp(-s * (q_max - q_j)) = T[q_max - q_j]``:
the row's maximum is taken on the integers, the exponentials are a table of the 256 possible
differences (computed at compile time, in float32 as a float softmax computes them), and the row sum,
the division and the output quantization (``rint(e / sum / sy) + zy``, clamped) are float32 as ONNX's
Softmax followed by QuantizeLinear. No float input tensor is read or written: the kernel reads the
8-bit scores and writes the 8-bit probabilities.
"""

from __future__ import annotations

import numpy as np
from tvm import te

from .qgemm import quantize_linear


def exp_table(scale: float) -> np.ndarray:
    """``T[d] = exp(-scale * d)``, d = 0..255, float32 arithmetic."""
    d = np.arange(256, dtype=np.float32)
    return np.exp(-(np.float32(scale) * d)).astype(np.float32)


def build_qsoftmax(shape, in_dtype: str, out_dtype: str, out_scale: float, out_zero_point: int, qmin: int, qmax: int,
                   name: str = "qsoftmax", axis: int = -1):
    """Arguments: ``x`` ``shape`` in ``in_dtype``, the [256] float32 table of :func:`exp_table`, and the
    output ``shape`` in ``out_dtype``; the softmax runs along ``axis``."""
    shape = tuple(int(s) for s in shape)
    axis = axis % len(shape)
    lead, n = shape[:axis] + shape[axis + 1:], shape[axis]

    def at(i, v):  # the full index of reduced index ``i`` (the axis dropped) with ``v`` on the axis
        return (*i[:axis], v, *i[axis:])

    def reduced(i):  # the reduced index of a full index
        return (*i[:axis], *i[axis + 1:])

    x = te.placeholder(shape, in_dtype, name="x")
    table = te.placeholder((256,), "float32", name="table")
    j = te.reduce_axis((0, n), "j")
    top = te.compute(lead, lambda *i: te.max(x[at(i, j)].astype("int32"), axis=j), name="row_max")
    e = te.compute(shape, lambda *i: table[top[reduced(i)] - x[i].astype("int32")], name="exp")
    k = te.reduce_axis((0, n), "k")
    total = te.compute(lead, lambda *i: te.sum(e[at(i, k)], axis=k), name="row_sum")

    def out(*i):
        return quantize_linear(e[i] / total[reduced(i)], out_scale, out_zero_point, qmin, qmax, out_dtype)

    y = te.compute(shape, out, name="out")
    func = te.create_prim_func([x, table, y])
    attrs = {"lowprec.op": "qsoftmax", "op_pattern": 8, "lowprec.axis": axis}
    return func.with_attr("global_symbol", name).with_attrs(attrs)
