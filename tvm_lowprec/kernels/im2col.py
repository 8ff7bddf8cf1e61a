"""im2col for NCHW convolutions: ``cols[b, oh, ow, c, kh, kw]`` (a 2-D GEMM operand once reshaped,
which costs nothing), padded with the activation zero point, i.e. real zero.

Written 6-D so that no index needs a division: each output row ``(b, oh, ow)`` copies ``C`` short
runs of ``KW`` input bytes per kernel row.
"""

from __future__ import annotations

from tvm import te, tirx


def build_im2col(geometry, dtype: str, pad_value: int, name: str = "im2col"):
    g = geometry
    (oh_n, ow_n), (kh_n, kw_n), (sh, sw), (dh, dw) = g.out_hw, g.kernel, g.strides, g.dilation
    top, left = g.padding[0], g.padding[1]
    h_n, w_n = g.in_hw
    x = te.placeholder((g.batch, g.channels, h_n, w_n), dtype, name="x")

    def element(b, oh, ow, c, kh, kw):
        ih, iw = oh * sh + kh * dh - top, ow * sw + kw * dw - left
        inside = tirx.all(ih >= 0, ih < h_n, iw >= 0, iw < w_n)
        value = x[b, c, tirx.max(tirx.min(ih, h_n - 1), 0), tirx.max(tirx.min(iw, w_n - 1), 0)]
        return tirx.if_then_else(inside, value, tirx.const(pad_value, dtype))

    cols = te.compute((g.batch, oh_n, ow_n, g.channels, kh_n, kw_n), element, name="im2col")
    func = te.create_prim_func([x, cols])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "im2col", "op_pattern": 8})
