"""Softmax over one axis of an 8-bit tensor (the last, or any other: a DFL head's bins), to an 8-bit
tensor.

With ``x = s * (q - z)`` per tensor, ``exp(x_j - max_k x_k) = exp(-s * (q_max - q_j))``: the row's
maximum is taken on the integers, and the exponential of ``t = -s * d`` (``d = q_max - q_j``, 0..255;
``s * d`` rounded to float32 as a float softmax's subtraction would round it) is computed in the
vector lanes by :func:`neg_exp`: a range reduction to ``2^n * exp(r)``, ``|r| <= ln2 / 2``, and a
degree-7 polynomial, within 2 ulp of ``numpy.exp`` of the same ``t`` (checked over all 256 ``d`` for
scales from 1e-3 to 10 by the tests). The row sum, the division and the output quantization
(``rint(e / sum / sy) + zy``, clamped) are float32 as ONNX's Softmax followed by QuantizeLinear. No
float tensor is read or written: the kernel reads the 8-bit scores and writes the 8-bit probabilities.

A 256-entry table of the exponentials (the first form of this kernel) costs a gather per element:
``vgatherdps`` at best, which made the attention softmax of a BERT-base layer (1x12x128x128) 0.19 ms
on the Zen 5 host at one thread against 0.06 ms computed.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import te, tirx

from .qgemm import quantize_linear


# ln 2 split so that n * LN2_HI is exact in float32 for |n| < 2^8 (LN2_HI has 16 significant bits)
LN2_HI, LN2_LO = 0.693145751953125, 1.428606765330187e-06
_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(7, -1, -1))  # exp(r), Horner order, degree 7
_MIN_EXPONENT = -126  # below 2^-126 (t < -87.3) the result is 0: a probability no 8-bit output resolves


def neg_exp(d, scale: float):
    """``exp(-scale * d)`` in float32 for an int32 expression ``d >= 0``: ``t = -scale * d``, ``n =
    round(t / ln2)``, ``r = t - n ln2`` (in two parts), ``exp(r)`` by Horner's rule and ``2^n`` built
    in the exponent bits; 0 where ``2^n`` would be subnormal."""
    f32 = lambda v: tirx.const(float(np.float32(v)), "float32")  # noqa: E731
    t = f32(-scale) * d.astype("float32")
    n = tirx.round(t * f32(1 / math.log(2)))
    r = t - n * f32(LN2_HI) - n * f32(LN2_LO)
    p = f32(_TAYLOR[0])
    for c in _TAYLOR[1:]:
        p = p * r + f32(c)
    k = n.astype("int32")
    two_n = tirx.reinterpret("float32", tirx.shift_left(tirx.max(k, _MIN_EXPONENT) + 127, 23))
    return tirx.Select(k < _MIN_EXPONENT, f32(0.0), p * two_n)


def build_qsoftmax(shape, in_dtype: str, in_scale: float, out_dtype: str, out_scale: float, out_zero_point: int,
                   qmin: int, qmax: int, name: str = "qsoftmax", axis: int = -1):
    """Arguments: ``x`` ``shape`` in ``in_dtype`` (scale ``in_scale``: its zero point cancels) and the
    output ``shape`` in ``out_dtype``; the softmax runs along ``axis``."""
    shape = tuple(int(s) for s in shape)
    axis = axis % len(shape)
    lead, n = shape[:axis] + shape[axis + 1:], shape[axis]

    def at(i, v):  # the full index of reduced index ``i`` (the axis dropped) with ``v`` on the axis
        return (*i[:axis], v, *i[axis:])

    def reduced(i):  # the reduced index of a full index
        return (*i[:axis], *i[axis + 1:])

    x = te.placeholder(shape, in_dtype, name="x")
    j = te.reduce_axis((0, n), "j")
    top = te.compute(lead, lambda *i: te.max(x[at(i, j)].astype("int32"), axis=j), name="row_max")
    e = te.compute(shape, lambda *i: neg_exp(top[reduced(i)] - x[i].astype("int32"), in_scale), name="exp")
    k = te.reduce_axis((0, n), "k")
    total = te.compute(lead, lambda *i: te.sum(e[at(i, k)], axis=k), name="row_sum")
    # one division per row, not two per element (a DFL head's 4-bin rows: 4 elements a row): the
    # probability and its quantization as one product, exp x 1 / (sum x scale)
    inverse = te.compute(lead, lambda *i: tirx.const(1.0, "float32") / (total[i] * tirx.const(np.float32(out_scale),
                                                                                             "float32")),
                         name="row_scale")

    def out(*i):
        return quantize_linear(e[i] * inverse[reduced(i)], 1.0, out_zero_point, qmin, qmax, out_dtype)

    y = te.compute(shape, out, name="out")
    func = te.create_prim_func([x, y])
    attrs = {"lowprec.op": "qsoftmax", "op_pattern": 8, "lowprec.axis": axis}
    return func.with_attr("global_symbol", name).with_attrs(attrs)
