"""Depthwise convolution (one filter per channel) on NHWC 8-bit activations, requantized in the
epilogue: ``out[b, oh, ow, c] = requant(sum_{kh, kw} x_pad[b, ih, iw, c] * w'[kh, kw, c] + corr[c])``.

``w' = w - zw`` (int16, exact), the input padded with its zero point, and ``corr = bias - zx * sum w'``
so the sum is that of ``(x - zx) * (w - zw)``, exactly. There is no reduction over channels, so a GEMM
intrinsic has nothing to contract: the kernel vectorizes over C instead (the schedule lives in
:mod:`tvm_lowprec.schedule.depthwise`). Weights and the per-channel parameters are constants made at
compile time by :func:`depthwise_params`.

There is no padded copy of the input: each tap reads ``x`` through ``Select(inside, x[clamped], zx)``,
and the schedule asks TVM's loop partitioning to split the output rows and columns into the border
(which keeps the selects) and the interior, where they fold away and the taps are plain loads.

A zero-extended 8-bit activation times a sign-extended int16 weight is what LLVM turns into
``vpmaddwd`` (an int32 multiply of operands that fit 16 bits), which Zen 3 issues twice per cycle.
The ``"float"`` requantization runs in float32 where that is exact (:func:`float32_exact`,
:func:`~tvm_lowprec.kernels.qgemm.requant_f32`), else in float64 as
:func:`~tvm_lowprec.kernels.qgemm.requantize` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from .qgemm import Epilogue, float32_requant_exact, out_range_param, requant_f32, requantize


@dataclass(frozen=True)
class DepthwiseProblem:
    """``geometry``: the convolution's shapes (a :class:`~tvm_lowprec.quant.patterns.ConvGeometry`)."""

    geometry: object
    a_dtype: str
    epilogue: Epilogue

    def __post_init__(self):
        if self.epilogue.kind not in ("requant", "int32"):
            raise ValueError(f"depthwise epilogue must be requant or int32, not {self.epilogue.kind}")


def depthwise_params(w_taps: np.ndarray, w_zero_point, x_zero_point: int, bias_int, mult, epilogue: Epilogue):
    """Constant arguments after the activation: ``w'[KH*KW, C]`` int16, ``corr[C]`` int32, then the
    requantization multiplier(s). ``w_taps``: integer weights ``[KH*KW, C]`` (rows kh-major)."""
    from ..quant.requant import fixed_point_multiplier

    w = w_taps.astype(np.int32) - np.asarray(w_zero_point, np.int32).reshape(-1)
    corr = -int(x_zero_point) * w.sum(axis=0, dtype=np.int64)
    if bias_int is not None:
        corr = corr + np.asarray(bias_int, np.int64)
    channels = w.shape[1]
    params = [w.astype(np.int16), np.broadcast_to(corr, (channels,)).astype(np.int32)]
    if epilogue.kind == "requant":
        mult = np.broadcast_to(np.asarray(mult, np.float32), (channels,))
        if epilogue.mode == "fixed_point":
            params += list(fixed_point_multiplier(mult))
        else:
            params.append(np.ascontiguousarray(mult))
    # then the requantization's zero point and clamp bounds, and the padding's value (the input's zero
    # point): parameters, not immediates, so layers of one shape share a kernel
    return params + out_range_param(epilogue) + [np.array([x_zero_point], np.int32)]


def float32_exact(params, a_dtype: str, ep: Epilogue) -> bool:
    """Whether :func:`~tvm_lowprec.kernels.qgemm.requant_f32` gives exactly the ``"float"``
    requantization for every input, given :func:`depthwise_params`' arrays: the sum is ``x . w' +
    corr`` with ``x`` an 8-bit value (see :func:`~tvm_lowprec.kernels.qgemm.float32_requant_exact`)."""
    if ep.kind != "requant" or ep.mode != "float":
        return False
    w, corr, mult = (np.asarray(v, np.float64) for v in params[:3])
    return float32_requant_exact(np.abs(w).sum(axis=0), 255.0 if a_dtype == "uint8" else 128.0, corr, mult)


def pixels_per_step(extent: int, most: int = 4) -> int:
    """Output pixels a step of the depthwise kernels computes: the largest of 4, 3, 2 dividing the output
    width (no tail), else 1."""
    return next((u for u in range(most, 1, -1) if extent % u == 0), 1)


def weights_fit_int8(w) -> bool:
    """Whether :func:`depthwise_params`' weights ``w - zw`` are all int8 values (symmetric int8 weights
    are; a weight zero point can push them past): what a four-byte dot product needs."""
    w = np.asarray(w)
    return bool(w.size) and int(w.min()) >= -128 and int(w.max()) <= 127


def build_depthwise(p: DepthwiseProblem, name: str = "qdepthwise", params=None, float32_requant: bool = True):
    """The PrimFunc; ``params`` (:func:`depthwise_params`' arrays, optional) lets a ``"float"`` epilogue
    requantize in float32 where that is exact (:func:`float32_exact`) and the row allows it
    (``float32_requant``), and says whether the weights fit int8 (``lowprec.weights_int8``)."""
    f32 = float32_requant and params is not None and float32_exact(params, p.a_dtype, p.epilogue)
    g = p.geometry
    (oh_n, ow_n), (kh_n, kw_n), (sh, sw), (dh, dw) = g.out_hw, g.kernel, g.strides, g.dilation
    top, left, bottom, right = g.padding
    h_n, w_n = g.in_hw
    c_n, batch = g.channels, g.batch
    x = te.placeholder((batch, h_n, w_n, c_n), p.a_dtype, name="x")
    wq = te.placeholder((kh_n * kw_n, c_n), "int16", name="w")
    corr = te.placeholder((c_n,), "int32", name="corr")
    pad = te.placeholder((1,), "int32", name="pad_value")  # the input's zero point
    kh = te.reduce_axis((0, kh_n), name="kh")
    kw = te.reduce_axis((0, kw_n), name="kw")

    def tap(b, oh, ow, c):
        i, j = oh * sh + kh * dh - top, ow * sw + kw * dw - left
        if not any(g.padding):
            return x[b, i, j, c].astype("int32")
        # the padding reads the zero point; the clamped index keeps the (discarded) load in bounds. A
        # Select, not if_then_else: it vectorizes over C, and loop partitioning removes it inside
        value = x[b, tirx.max(tirx.min(i, h_n - 1), 0), tirx.max(tirx.min(j, w_n - 1), 0), c]
        inside = tirx.all(i >= 0, i < h_n, j >= 0, j < w_n)
        return tirx.Select(inside, value, pad[0].astype(p.a_dtype)).astype("int32")

    acc = te.compute(
        (batch, oh_n, ow_n, c_n),
        lambda b, oh, ow, c: te.sum(tap(b, oh, ow, c) * wq[kh * kw_n + kw, c].astype("int32"), axis=[kh, kw]),
        name="acc",
    )
    ep = p.epilogue
    scale, out_range = [], []
    if ep.kind == "int32":
        out = te.compute(acc.shape, lambda b, oh, ow, c: acc[b, oh, ow, c] + corr[c], name="epilogue")
    else:
        scale = [te.placeholder((c_n,), "int32" if ep.mode == "fixed_point" else "float32", name="mult")]
        if ep.mode == "fixed_point":
            scale.append(te.placeholder((c_n,), "int32", name="shift"))
        out_range = [te.placeholder((3,), "int32", name="out_range")]

        def requant(b, oh, ow, c):
            if f32:
                return requant_f32(acc[b, oh, ow, c] + corr[c], ep, scale[0][c], out_range[0])
            shift = scale[1][c] if len(scale) > 1 else None
            return requantize(acc[b, oh, ow, c] + corr[c], ep, scale[0][c], shift, out_range[0])

        out = te.compute(acc.shape, requant, name="epilogue")
    func = te.create_prim_func([x, wq, corr, *scale, *out_range, pad, out])
    attrs = {"lowprec.op": "qdepthwise", "op_pattern": 8, "lowprec.intrin": "none",
             "lowprec.shape": [batch, oh_n, ow_n, c_n, kh_n, kw_n],
             # what a rule that writes the kernel anew needs (kernels.depthwise_dot): the window, the
             # epilogue (kind, mode, float32 requantization), whether w - zw fits int8
             "lowprec.conv": [sh, sw, dh, dw, top, left],
             "lowprec.epilogue": [ep.kind, ep.mode, int(f32)],
             "lowprec.weights_int8": params is not None and weights_fit_int8(params[0])}
    return func.with_attr("global_symbol", name).with_attrs(attrs)
