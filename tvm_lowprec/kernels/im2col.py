"""im2col for NHWC activations: ``cols[b, oh, ow, kh, kw, c]`` (a 2-D GEMM operand ``[(b, oh, ow),
(kh, kw, c)]`` once reshaped, which costs nothing), padded with the activation zero point, i.e. real
zero. Each (oh, ow, kh, kw) copies one contiguous run of C channels.

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
    x = te.placeholder((g.batch, h_n, w_n, g.channels), dtype, name="x")
    source = x
    if any(g.padding):
        def pad(b, i, j, c):
            inside = tirx.all(i >= top, i < top + h_n, j >= left, j < left + w_n)
            value = x[b, tirx.max(tirx.min(i - top, h_n - 1), 0), tirx.max(tirx.min(j - left, w_n - 1), 0), c]
            # Select, not if_then_else: loop partitioning (schedule/qgemm.Im2colRule) folds it away
            # inside, leaving a plain copy of the interior rows
            return tirx.Select(inside, value, tirx.const(pad_value, dtype))

        source = te.compute((g.batch, h_n + top + bottom, w_n + left + right, g.channels), pad, name="padded")

    def element(b, oh, ow, kh, kw, c):
        return source[b, oh * sh + kh * dh, ow * sw + kw * dw, c]

    cols = te.compute((g.batch, oh_n, ow_n, kh_n, kw_n, g.channels), element, name="im2col")
    func = te.create_prim_func([x, cols])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "im2col", "op_pattern": 8,
                                                             "lowprec.dilation_w": dw})
