"""Float32 depthwise convolution (one filter per channel), NCHW: ``Y[c] = act(sum_{kh,kw} X[c] * W[c] + b[c])``.

A depthwise convolution has no reduction over channels, so it is not a GEMM: each output row is a
few multiply-adds per pixel, vectorized along the output width. The computation writes a row padded
to a whole number of ``vectors * lanes`` (the padded input is wide enough that the extra columns
read zeros), so the width splits exactly; the epilogue (bias, activation) stores the real columns.
The schedule is :mod:`tvm_lowprec.schedule.fp32_depthwise`, the Relax rewrite
:mod:`tvm_lowprec.quant.float_gemm`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from .fp32_gemm import ACTIVATIONS, _activation

OP = "fp32_depthwise"


@dataclass(frozen=True)
class DepthwiseLayout:
    """The decision: ``lanes`` float32 lanes per vector, ``vectors`` accumulators per step along the
    output width (``block = vectors * lanes`` columns), the padded width ``owp``."""

    channels: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    lanes: int
    vectors: int
    bias: bool = False
    act: str = "none"

    def __post_init__(self):
        if min(self.channels, self.lanes, self.vectors, *self.out_hw, *self.kernel, *self.strides) < 1:
            raise ValueError(f"bad float32 depthwise layout {self}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"float32 depthwise epilogue {self.act!r} is not one of {ACTIVATIONS}")

    @property
    def block(self) -> int:
        return self.vectors * self.lanes

    @property
    def owp(self) -> int:
        return -(-self.out_hw[1] // self.block) * self.block

    @staticmethod
    def choose(recipe, geometry, bias: bool = False, act: str = "none"):
        """Up to 4 vectors per step (independent FMA chains), no more than the width needs; None
        without an FMA recipe."""
        if recipe is None:
            return None
        g, lanes = geometry, recipe.intrin.lanes
        vectors = max(1, min(4, -(-g.out_hw[1] // lanes)))
        return DepthwiseLayout(g.channels, g.in_hw, g.out_hw, g.kernel, g.strides, g.padding, g.dilation, lanes,
                               vectors, bias, act)

    def attrs(self) -> dict:
        return {"lowprec.op": OP, "op_pattern": 8, "lowprec.vector": self.lanes, "lowprec.tile": [1, self.vectors],
                "lowprec.shape": [self.channels, *self.out_hw, *self.kernel],
                "lowprec.epilogue": ("bias+" if self.bias else "") + self.act}


def build_fp32_depthwise(layout: DepthwiseLayout, name: str = "fp32_depthwise"):
    """The unscheduled PrimFunc ``(X[1, C, H, W], W[C, KH, KW], [bias[C]]) -> Y[1, C, OH, OW]``."""
    lay = layout
    c_n, (h_n, w_n), (oh_n, ow_n) = lay.channels, lay.in_hw, lay.out_hw
    (kh_n, kw_n), (sh, sw), (dh, dw) = lay.kernel, lay.strides, lay.dilation
    top, left, _, _ = lay.padding
    ph = (oh_n - 1) * sh + (kh_n - 1) * dh + 1  # the rows and (padded) columns the windows read
    pw = (lay.owp - 1) * sw + (kw_n - 1) * dw + 1
    X = te.placeholder((1, c_n, h_n, w_n), "float32", name="X")
    W = te.placeholder((c_n, kh_n, kw_n), "float32", name="W")
    bias = te.placeholder((c_n,), "float32", name="bias") if lay.bias else None

    def pad(b, c, i, j):
        inside = tirx.all(i >= top, i < top + h_n, j >= left, j < left + w_n)
        value = X[b, c, tirx.max(tirx.min(i - top, h_n - 1), 0), tirx.max(tirx.min(j - left, w_n - 1), 0)]
        return tirx.if_then_else(inside, value, tirx.const(0.0, "float32"))

    src = te.compute((1, c_n, ph, pw), pad, name="fp32_pad")
    kh = te.reduce_axis((0, kh_n), name="kh")
    kw = te.reduce_axis((0, kw_n), name="kw")
    acc = te.compute((1, c_n, oh_n, lay.owp),
                     lambda b, c, i, j: te.sum(src[b, c, i * sh + kh * dh, j * sw + kw * dw] * W[c, kh, kw], axis=[kh, kw]),
                     name="fp32_dw")

    def epilogue(b, c, i, j):
        value = acc[b, c, i, j] + bias[c] if bias is not None else acc[b, c, i, j]
        return _activation(value, lay.act)

    out = te.compute((1, c_n, oh_n, ow_n), epilogue, name="fp32_epilogue")
    func = te.create_prim_func([X, W, *([bias] if bias is not None else []), out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs())
