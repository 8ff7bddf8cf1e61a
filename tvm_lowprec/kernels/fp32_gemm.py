"""Float32 GEMM with constant weights packed at compile time: ``Y[m, n] = act(sum_k X[m, k] W[k, n] + bias[n])``.

The float sibling of :mod:`tvm_lowprec.kernels.fp8_weights` (same column panels, same register tile,
same loop nest; no decode step): the weights ``W[K, N]`` are packed into panels of ``nr`` vectors
(``panel = nr * lanes`` columns) so that each step of K reads one panel's ``panel`` floats
contiguously and each task streams one contiguous block. Bias and activation (ReLU, GELU) are the
epilogue, applied while the tile is hot.

The same loop nest computes a convolution when ``X`` is the im2col view of an NCHW input
(:func:`build_fp32_conv`): rows are output pixels, K runs over ``(c, kh, kw)`` as a direct loop nest
(no im2col buffer), and the epilogue writes NCHW.

This file builds the computations and packs the weights; the schedule is
:mod:`tvm_lowprec.schedule.fp32_gemm`, the Relax rewrite :mod:`tvm_lowprec.quant.float_gemm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from .fp8_weights import ColumnPanels, _even_split

OP = "fp32_gemm"  # the PrimFunc's ``lowprec.op``: what the schedule rule recognises
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")


def _activation(value, act: str):
    if act == "relu":
        return tirx.max(value, tirx.const(0.0, "float32"))
    if act == "gelu":  # 0.5 x (1 + erf(x / sqrt 2)): ONNX Gelu, BERT's
        half = tirx.const(0.5, "float32")
        return value * half * (tirx.const(1.0, "float32") + tirx.erf(value * tirx.const(1 / math.sqrt(2), "float32")))
    if act == "gelu_tanh":
        inner = tirx.const(math.sqrt(2 / math.pi), "float32") * (value + tirx.const(0.044715, "float32") * value * value * value)
        return value * tirx.const(0.5, "float32") * (tirx.const(1.0, "float32") + tirx.tanh(inner))
    return value


@dataclass(frozen=True)
class FloatGemmLayout(ColumnPanels):
    """The decision, stored on the PrimFunc: ``lanes`` float32 lanes per vector, a register tile of
    ``mr`` rows x ``nr`` vectors (``panel = nr * lanes`` columns), padded sizes ``mp`` and ``np_``
    (padding columns hold weight 0; padding rows re-read the last row and are not stored),
    ``k_unroll`` steps of K per unrolled loop body, ``bias`` and ``act`` the epilogue."""

    m: int
    n: int
    k: int
    lanes: int
    mr: int
    nr: int
    k_unroll: int
    bias: bool = False
    act: str = "none"
    kblock: int = 0  # reduction steps per pass over a weight panel slice kept in L1 (0: all of K)

    def __post_init__(self):
        if min(self.m, self.n, self.k, self.lanes, self.mr, self.nr, self.k_unroll) < 1 or self.k % self.k_unroll:
            raise ValueError(f"bad float32 GEMM layout {self}")
        if self.kblock and (self.k % self.kblock or self.kblock % self.k_unroll):
            raise ValueError(f"float32 GEMM layout {self}: kblock must divide K and be a multiple of k_unroll")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"float32 GEMM epilogue {self.act!r} is not one of {ACTIVATIONS}")


    @property
    def packed_shape(self) -> tuple[int, int, int]:
        """``[N / panel, K, panel]`` float32."""
        return (self.np_ // self.panel, self.k, self.panel)

    @staticmethod
    def choose(recipe, m: int, n: int, k: int, bias: bool = False, act: str = "none") -> FloatGemmLayout | None:
        """The recipe's tile for M (a :class:`~tvm_lowprec.hwspec.GemmRecipe` of an
        :class:`~tvm_lowprec.hwspec.FmaIntrin`), shrunk to pad M and N least; None without a recipe."""
        if recipe is None or min(m, n, k) < 1:
            return None
        tile = recipe.tile_for(m)
        lanes = recipe.intrin.lanes
        mr = _even_split(m, min(tile.mr, m))
        nr = _even_split(-(-n // lanes), tile.nr)
        k_unroll = next(u for u in (4, 2, 1) if k % u == 0)
        return FloatGemmLayout(m, n, k, lanes, mr, nr, k_unroll, bias, act, k_block(k, tile.kblock, k_unroll))

    def attrs(self, kind: str = "gemm") -> dict:
        return {"lowprec.op": OP, "op_pattern": 8, "lowprec.shape": [self.m, self.n, self.k], "lowprec.kind": kind,
                "lowprec.tile": [self.mr, self.nr, self.kblock], "lowprec.vector": self.lanes, "lowprec.k_unroll": self.k_unroll,
                "lowprec.epilogue": ("bias+" if self.bias else "") + self.act}


def k_block(depth: int, most: int, step: int = 1) -> int:
    """The largest divisor of ``depth`` in ``[most / 2, most]`` that is a multiple of ``step``: the
    K block (no tail iteration); 0 (all of K) when ``most`` is 0, ``depth`` fits, or none divides."""
    if not most or depth <= most:
        return 0
    return next((b for b in range(most, most // 2 - 1, -1) if depth % b == 0 and b % step == 0), 0)


def pack_fp32_weights(w: np.ndarray, layout: FloatGemmLayout) -> np.ndarray:
    """``w[K, N]`` float32 -> :attr:`FloatGemmLayout.packed_shape`, zeros in the padding columns."""
    k, n = w.shape
    lay = layout
    padded = np.zeros((k, lay.np_), np.float32)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, lay.np_ // lay.panel, lay.panel).transpose(1, 0, 2))


def padded_bias(bias, layout: FloatGemmLayout) -> np.ndarray:
    out = np.zeros((layout.np_,), np.float32)
    out[: layout.n] = np.broadcast_to(np.asarray(bias, np.float32).reshape(-1), (layout.n,))
    return out


def _epilogue(acc, bias, lay: FloatGemmLayout, shape, index):
    """``act(acc[row, n] + bias[n])`` over ``shape``; ``index(*out_indices) -> (row, n)``."""

    def element(*idx):
        row, n = index(*idx)
        value = acc[row, n] + bias[n] if bias is not None else acc[row, n]
        return _activation(value, lay.act)

    return te.compute(shape, element, name="fp32_epilogue")


def build_fp32_gemm(layout: FloatGemmLayout, name: str = "fp32_gemm"):
    """The unscheduled PrimFunc ``(X[M, K], W_packed, [bias[Np]]) -> Y[M, N]``, all float32."""
    lay = layout
    X = te.placeholder((lay.m, lay.k), "float32", name="X")
    Wp = te.placeholder(lay.packed_shape, "float32", name="W_packed")
    bias = te.placeholder((lay.np_,), "float32", name="bias") if lay.bias else None
    k = te.reduce_axis((0, lay.k), name="k")

    def product(m, n):
        x = X[tirx.min(m, lay.m - 1) if lay.mp != lay.m else m, k]
        return te.sum(x * Wp[n // lay.panel, k, n % lay.panel], axis=k)

    acc = te.compute((lay.mp, lay.np_), product, name="fp32_gemm")
    out = _epilogue(acc, bias, lay, (lay.m, lay.n), lambda m, n: (m, n))
    func = te.create_prim_func([X, Wp, *([bias] if bias is not None else []), out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs())


@dataclass(frozen=True)
class FloatConvGeometry:
    """A 2-D NCHW convolution with one group and batch 1 as the GEMM's rows (output pixels) and depth
    ``(c, kh, kw)``."""

    channels: int
    in_hw: tuple[int, int]
    out_channels: int
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]

    @property
    def rows(self) -> int:
        return self.out_hw[0] * self.out_hw[1]

    @property
    def depth(self) -> int:
        return self.channels * self.kernel[0] * self.kernel[1]


def conv_weight_columns(w: np.ndarray) -> np.ndarray:
    """OIHW -> ``[C*KH*KW, O]`` (rows in ``(c, kh, kw)`` order, the kernel's reduction order)."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def build_fp32_conv(geometry: FloatConvGeometry, layout: FloatGemmLayout, name: str = "fp32_conv"):
    """The unscheduled PrimFunc ``(X[1, C, H, W], W_packed, [bias]) -> Y[1, O, OH, OW]``: the GEMM of
    :func:`build_fp32_gemm` with rows ``oh * OW + ow`` read straight from the (padded) input."""
    g, lay = geometry, layout
    (h_n, w_n), (oh_n, ow_n), (kh_n, kw_n) = g.in_hw, g.out_hw, g.kernel
    (sh, sw), (dh, dw) = g.strides, g.dilation
    top, left, bottom, right = g.padding
    X = te.placeholder((1, g.channels, h_n, w_n), "float32", name="X")
    Wp = te.placeholder(lay.packed_shape, "float32", name="W_packed")
    bias = te.placeholder((lay.np_,), "float32", name="bias") if lay.bias else None
    source = X
    if any(g.padding):
        def pad(b, c, i, j):
            inside = tirx.all(i >= top, i < top + h_n, j >= left, j < left + w_n)
            value = X[b, c, tirx.max(tirx.min(i - top, h_n - 1), 0), tirx.max(tirx.min(j - left, w_n - 1), 0)]
            return tirx.if_then_else(inside, value, tirx.const(0.0, "float32"))

        source = te.compute((1, g.channels, h_n + top + bottom, w_n + left + right), pad, name="fp32_pad")
    c = te.reduce_axis((0, g.channels), name="c")
    kh = te.reduce_axis((0, kh_n), name="kh")
    kw = te.reduce_axis((0, kw_n), name="kw")

    def product(m, n):
        row = tirx.min(m, lay.m - 1) if lay.mp != lay.m else m
        oh, ow = row // ow_n, row % ow_n
        x = source[0, c, oh * sh + kh * dh, ow * sw + kw * dw]
        return te.sum(x * Wp[n // lay.panel, (c * kh_n + kh) * kw_n + kw, n % lay.panel], axis=[c, kh, kw])

    acc = te.compute((lay.mp, lay.np_), product, name="fp32_gemm")
    out = _epilogue(acc, bias, lay, (1, g.out_channels, oh_n, ow_n), lambda b, o, i, j: (i * ow_n + j, o))
    func = te.create_prim_func([X, Wp, *([bias] if bias is not None else []), out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs("conv"))


def build_fp32_deconv(geometry, layout: FloatGemmLayout, name: str = "fp32_deconv"):
    """A transposed convolution whose kernel equals its strides, without padding (``ConvTranspose(2,
    s2)`` of a segmentation head): each output pixel takes exactly one tap, so it is the GEMM of the
    input pixels ``[H*W, C_in]`` by the weights ``[C_in, (kh, kw, O)]``, whose epilogue scatters each
    column to its pixel: ``Y[o, ih*KH + a, iw*KW + b] = act(acc[ih*W + iw, (a*KW + b)*O + o] + bias)``.
    ``geometry``: a :class:`~tvm_lowprec.quant.patterns.DeconvGeometry`; ``bias`` (when the layout has
    one) is per column, the channel's bias repeated for each tap. The unscheduled PrimFunc
    ``(X[1, C, H, W], W_packed, [bias]) -> Y[1, O, H*KH, W*KW]``; the schedule is the convolution's."""
    g, lay = geometry, layout
    (h_n, w_n), (kh_n, kw_n), o_n = g.in_hw, g.kernel, g.out_channels
    X = te.placeholder((1, g.in_channels, h_n, w_n), "float32", name="X")
    Wp = te.placeholder(lay.packed_shape, "float32", name="W_packed")
    bias = te.placeholder((lay.np_,), "float32", name="bias") if lay.bias else None
    c = te.reduce_axis((0, g.in_channels), name="c")
    kh = te.reduce_axis((0, 1), name="kh")  # unit window loops: the convolution's loop nest, one tap
    kw = te.reduce_axis((0, 1), name="kw")

    def product(m, n):
        row = tirx.min(m, lay.m - 1) if lay.mp != lay.m else m
        return te.sum(X[0, c, row // w_n + kh, row % w_n + kw] * Wp[n // lay.panel, c, n % lay.panel], axis=[c, kh, kw])

    acc = te.compute((lay.mp, lay.np_), product, name="fp32_gemm")

    def index(b, o, y, x):
        return (y // kh_n) * w_n + x // kw_n, ((y % kh_n) * kw_n + x % kw_n) * o_n + o

    out = _epilogue(acc, bias, lay, (1, o_n, h_n * kh_n, w_n * kw_n), index)
    func = te.create_prim_func([X, Wp, *([bias] if bias is not None else []), out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs("conv"))
