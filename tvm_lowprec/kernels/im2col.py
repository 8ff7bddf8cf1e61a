"""im2col for NHWC activations: ``cols[b, oh, ow, kh, kw, c]`` (a 2-D GEMM operand ``[(b, oh, ow),
(kh, kw, c)]`` once reshaped, which costs nothing), padded with the activation zero point, i.e. real
zero. Each (oh, ow, kh, kw) copies one contiguous run of C channels.

Two blocks: the input is first copied into a padded buffer (filled with the zero point), so the
gather that follows has no bounds test per element; written 6-D, no index needs a division.

``channels``: the channels written per tap, more than the input has where the GEMM's depth would
otherwise need padding to whole instruction steps (a 3-channel stem, K = 27 padded to 28 by a copy of
every row of A inside the GEMM: 4 channels make K = 36, whole steps, and the copy goes); the extra
channels hold the zero point, and the weights' rows for them the weights' zero point, so they add 0.

The zero point is a parameter (``pad_value``, int32[1]), not an immediate: the layers of one geometry
share one kernel whatever their zero points (YOLO11n at 160x160: 31 padding copies, 12 geometries).

A grouped convolution (``geometry.grouped``) gets one im2col per group, ``cols[g, b, oh, ow, kh, kw,
c]`` over the group's ``channels / groups`` channels: the A operands of a batch of GEMMs, one per group.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx


def build_im2col(geometry, dtype: str, name: str = "im2col", channels: int | None = None, gather: bool = True):
    """The PrimFunc ``(x, pad_value int32[1]) -> cols``; ``gather=False``: the padding copy alone
    (``lowprec.op = "pad"``), the input of a GEMM that reads its im2col in place
    (:class:`~tvm_lowprec.kernels.qgemm.ConvWindow`). Call it with :func:`pad_argument`."""
    g = geometry
    (oh_n, ow_n), (kh_n, kw_n), (sh, sw), (dh, dw) = g.out_hw, g.kernel, g.strides, g.dilation
    top, left, bottom, right = g.padding
    h_n, w_n = g.in_hw
    c_out = g.channels if channels is None else channels
    # the padding copy alone in int64 shapes, as TVM legalizes operators: FuseTIR merges it into an
    # injective producer's function (the image's quantize-and-transpose) only where the types agree
    size = (lambda n: tirx.IntImm("int64", n)) if not gather else int
    x = te.placeholder(tuple(size(n) for n in (g.batch, h_n, w_n, g.channels)), dtype, name="x")
    pad_value = te.placeholder((size(1),), "int32", name="pad_value")
    source = x
    if any(g.padding) or c_out != g.channels:
        def pad(b, i, j, c):
            inside = tirx.all(i >= top, i < top + h_n, j >= left, j < left + w_n, c < g.channels)
            value = x[b, tirx.max(tirx.min(i - top, h_n - 1), 0), tirx.max(tirx.min(j - left, w_n - 1), 0),
                      tirx.min(c, g.channels - 1)]
            # Select, not if_then_else: loop partitioning (schedule/qgemm.Im2colRule) folds it away
            # inside, leaving a plain copy of the interior rows
            return tirx.Select(inside, value, pad_value[0].astype(dtype))

        source = te.compute(tuple(size(n) for n in (g.batch, h_n + top + bottom, w_n + left + right, c_out)), pad,
                            name="padded")

    if not gather:
        func = te.create_prim_func([x, pad_value, source])
        # injective, no global symbol (the name is the GlobalVar's): FuseOps merges it into an injective
        # producer (the image's quantize-and-transpose), and FuseTIR then drops it as unused
        return func.without_attr("global_symbol").with_attrs({"lowprec.op": "pad", "op_pattern": 2})

    def element(b, oh, ow, kh, kw, c):
        return source[b, oh * sh + kh * dh, ow * sw + kw * dw, c]

    if g.grouped:
        cg = g.group_channels
        cols = te.compute((g.groups, g.batch, oh_n, ow_n, kh_n, kw_n, cg),
                          lambda gi, b, oh, ow, kh, kw, c: element(b, oh, ow, kh, kw, gi * cg + c), name="im2col")
    else:
        cols = te.compute((g.batch, oh_n, ow_n, kh_n, kw_n, c_out), element, name="im2col")
    func = te.create_prim_func([x, pad_value, cols])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "im2col", "op_pattern": 8,
                                                             "lowprec.dilation_w": dw, "lowprec.groups": g.groups})


def pad_argument(zero_point: int) -> np.ndarray:
    """The ``pad_value`` argument of :func:`build_im2col`'s kernels: the activation's zero point."""
    return np.array([zero_point], np.int32)
