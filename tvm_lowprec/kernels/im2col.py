"""im2col for NCHW convolutions: ``cols[b, oh, ow, c, kh, kw]`` (a 2-D GEMM operand once reshaped,
which costs nothing), padded with the activation zero point, i.e. real zero.

Two blocks: the input is first copied into a padded buffer (filled with the zero point), so the
gather that follows has no bounds test per element; written 6-D, no index needs a division.
"""

from __future__ import annotations

from tvm import te, tirx


def build_im2col(geometry, dtype: str, pad_value: int, name: str = "im2col"):
    g = geometry
    (oh_n, ow_n), (kh_n, kw_n), (sh, sw), (dh, dw) = g.out_hw, g.kernel, g.strides, g.dilation
    top, left, bottom, right = g.padding
    h_n, w_n = g.in_hw
    x = te.placeholder((g.batch, g.channels, h_n, w_n), dtype, name="x")
    source = x
    if any(g.padding):
        def pad(b, c, i, j):
            inside = tirx.all(i >= top, i < top + h_n, j >= left, j < left + w_n)
            value = x[b, c, tirx.max(tirx.min(i - top, h_n - 1), 0), tirx.max(tirx.min(j - left, w_n - 1), 0)]
            return tirx.if_then_else(inside, value, tirx.const(pad_value, dtype))

        source = te.compute((g.batch, g.channels, h_n + top + bottom, w_n + left + right), pad, name="padded")

    def element(b, oh, ow, c, kh, kw):
        return source[b, c, oh * sh + kh * dh, ow * sw + kw * dw]

    cols = te.compute((g.batch, oh_n, ow_n, g.channels, kh_n, kw_n), element, name="im2col")
    func = te.create_prim_func([x, cols])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "im2col", "op_pattern": 8})
