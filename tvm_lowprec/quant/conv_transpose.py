"""QDQ ConvTranspose -> integer GEMM + col2im, the requantization fused into the col2im.

Part of the :mod:`~tvm_lowprec.quant.qdq_to_integer` rewrite: it matches
``quantize([relu/clip](conv2d_transpose(dequantize(x), dequantize(W)) [+ bias]))`` with a constant 8-bit
``W`` (scales per tensor or per output channel) and emits

1. the NCHW input as NHWC rows ``[(b, ih, iw), C_in]`` (the transpose usually cancels against the
   previous layer's, :mod:`~tvm_lowprec.quant.propagate_layout`);
2. the row's integer GEMM against ``W`` as ``[C_in, (kh, kw, C_out)]``, packed at compile time, with an
   int32 epilogue (zero points folded: exact ``sum (x - zx) * (w - zw)`` per tap);
3. :func:`~tvm_lowprec.kernels.col2im.build_col2im`: each output pixel sums its taps, adds the int32
   bias, requantizes (the fused activation as clamp bounds), NHWC -> NCHW.

The result is the same integer arithmetic as a QLinearConv (rounding once, in the epilogue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tvm import relax

from ..kernels.col2im import build_col2im, col2im_float32_exact, col2im_params
from ..kernels.qgemm import Epilogue
from .patterns import (
    ConstWeight,
    call_of,
    DeconvGeometry,
    deconv_geometry,
    dequantized_activation,
    dequantized_deconv_weight,
    dtype_of,
    first_call,
    static_shape,
)

NCHW_TO_NHWC, NHWC_TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


@dataclass(frozen=True)
class ConvTransposeMatch:
    x: relax.Expr  # runtime 8-bit NCHW activation
    x_zero_point: int
    weight: ConstWeight  # [C_in, KH*KW*C_out], per-column scales and zero points
    bias_int: np.ndarray | None  # int32 [C_out] in accumulator units
    epilogue: Epilogue
    mult: np.ndarray  # float32 [C_out]
    geometry: DeconvGeometry

    def emit(self, builder, spec):
        return emit_conv_transpose(builder, self, spec)


def _fits_int32(g: DeconvGeometry) -> bool:
    """Worst-case |sum| of one output pixel: C_in products of 255 x 255 per tap, over the taps that can
    reach one pixel (ceil(K / stride) per axis)."""
    taps = math.ceil(g.kernel[0] / g.strides[0]) * math.ceil(g.kernel[1] / g.strides[1])
    return g.in_channels * 255 * 255 * taps < 2**31


def match_requantized_conv_transpose(call, lookup, mode: str) -> ConvTransposeMatch | None:
    from . import qdq_to_integer as q

    requantized = q.requantized_output(call, lookup)
    if requantized is None:
        return None
    out, out_dtype, inner, lo, hi = requantized
    core, bias_expr = inner, None
    add = call_of(inner, "add", lookup)
    if add is not None:
        for core_side, bias_side in ((0, 1), (1, 0)):
            if first_call(add.args[core_side], ("nn.conv2d_transpose",), lookup) is not None:
                core, bias_expr = add.args[core_side], add.args[bias_side]
                break
    core = first_call(core, ("nn.conv2d_transpose",), lookup)
    if core is None:
        return None
    geometry = deconv_geometry(core)
    x = dequantized_activation(core.args[0], lookup)
    weight, w_params = dequantized_deconv_weight(core.args[1], lookup)
    if geometry is None or x is None or weight is None or not _fits_int32(geometry):
        return None
    if static_shape(x.data) != (geometry.batch, geometry.in_channels, *geometry.in_hw):
        return None
    channels = geometry.out_channels
    acc_scale = np.broadcast_to(np.float32(x.params.scale) * np.asarray(w_params.scale, np.float32).reshape(-1),
                                (channels,)).astype(np.float32)
    bias = None
    if bias_expr is not None:
        bias = q._bias(bias_expr, lookup, acc_scale)
        if bias is None:
            return None
    return ConvTransposeMatch(
        x=x.data,
        x_zero_point=int(x.params.zero_point),
        weight=weight,
        bias_int=bias,
        epilogue=q._requant_epilogue(out, out_dtype, lo, hi, mode),
        mult=(acc_scale / np.float32(out.scale)).astype(np.float32),
        geometry=geometry,
    )


def _float32_exact(match: ConvTransposeMatch) -> bool:
    """A float requantization that float32 computes exactly for these weights and this activation's
    range (:func:`~tvm_lowprec.kernels.col2im.col2im_float32_exact`)."""
    from .qdq_to_integer import float32_bound_terms

    terms = float32_bound_terms(match)
    return terms is not None and col2im_float32_exact(match.geometry, *terms, match.mult)


def emit_conv_transpose(builder, match: ConvTransposeMatch, spec) -> relax.Expr | None:
    from .qdq_to_integer import QGemmMatch, emit_qgemm

    g = match.geometry
    x = builder.emit(relax.op.permute_dims(match.x, NCHW_TO_NHWC))
    rows = builder.emit(relax.op.reshape(x, (g.rows, g.in_channels)))
    gemm = QGemmMatch(x=rows, x_zero_point=match.x_zero_point, acc_scale=np.ones(g.columns, np.float32),
                      weight=match.weight, bias_int=None, epilogue=Epilogue("int32"), mult=None)
    cols = emit_qgemm(builder, gemm, spec)
    if cols is None:
        return None
    a_dtype = dtype_of(match.x)
    name = (f"col2im_{a_dtype[0]}8_{g.out_channels}x{g.out_hw[0]}x{g.out_hw[1]}_k{g.kernel[0]}x{g.kernel[1]}"
            f"_s{g.strides[0]}_{match.epilogue.kind}")
    float32 = spec.float32_requant and _float32_exact(match)
    gvar = builder.add_func(build_col2im(g, match.epilogue, name, float32=float32), name)
    params = col2im_params(match.bias_int, match.mult, match.epilogue, g)
    out_type = relax.TensorType((g.batch, *g.out_hw, g.out_channels), match.epilogue.out_dtype)
    y = builder.emit(relax.call_tir(gvar, [cols] + [relax.const(p) for p in params], out_type))
    return builder.emit(relax.op.permute_dims(y, NHWC_TO_NCHW))
