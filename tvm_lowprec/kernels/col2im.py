"""col2im for a transposed convolution: the integer GEMM's columns summed into output pixels, then bias
and requantization.

The GEMM before it (:func:`~tvm_lowprec.kernels.qgemm.build_qgemm` with an int32 epilogue) multiplies
the NHWC input ``[(b, ih, iw), C_in]`` by the weights ``[C_in, (kh, kw, C_out)]``: ``cols[b, ih, iw, kh,
kw, co]`` is input pixel ``(ih, iw)``'s contribution through tap ``(kh, kw)``, exact with the zero points
folded. Output pixel ``(oh, ow)`` takes tap ``kh`` from ``ih = (oh + top - kh * dh) / sh`` where that is a
whole number inside the input (the same along W). This kernel gathers those taps (a sum over ``KH x
KW`` with the rest masked: each output reads its taps, so no two threads write one pixel), adds the
int32 bias once per output channel, and requantizes exactly as the GEMM epilogue does
(:func:`~tvm_lowprec.kernels.qgemm.requantize`, fused clamp included). Output NHWC.

Compared with a convolution over the zero-inserted input, which reuses the GEMM alone, this does
``stride²`` times fewer multiply-adds (a 2x2 stride-2 upsampler: 4x).
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .qgemm import Epilogue, float32_requant_exact, requant_f32, requantize


def is_upsample(geometry) -> bool:
    """Strides equal to the kernel, no dilation: each output pixel is reached by one tap at most."""
    g = geometry
    return tuple(g.strides) == tuple(g.kernel) and tuple(g.dilation) == (1, 1)


PARAM_LINE = 16  # 4-byte entries in 64 bytes: TVM's buffer alignment, the most LLVM widens a load to


def param_run(geometry) -> int:
    """Entries each per-channel parameter holds: ``C``, or ``KW*C`` for an upsampler, whose parameters
    are repeated once per column tap so that an output row's run ``(ow % KW, c)`` reads them
    contiguously."""
    return geometry.out_channels * (geometry.kernel[1] if is_upsample(geometry) else 1)


def param_length(geometry) -> int:
    """Length of each parameter buffer: :func:`param_run` padded with zeros to whole 64-byte lines.
    A run that is no power of two long (``KW*C`` = 12 for six channels) is one LLVM vector that the
    backend widens to the next power of two, loading past the run's end as far as the buffer's 64-byte
    alignment allows; unpadded, those lanes read whatever follows the constant, and the float32
    multipliers' FMA then stalls on any denormal there. Measured (AMX Xeon, 1 thread, in the model): the
    text detector's 6-channel 240x240 upsampler 1.16-1.34 ms unpadded, 0.055-0.059 ms padded; the
    model 5.1-5.7 -> 4.2-4.5 ms."""
    return -(-param_run(geometry) // PARAM_LINE) * PARAM_LINE


def col2im_float32_exact(geometry, weight_columns, a_reach: float, bias, mult) -> bool:
    """Whether :func:`~tvm_lowprec.kernels.qgemm.requant_f32` is exact for every output: the bound
    of :func:`~tvm_lowprec.kernels.qgemm.float32_requant_exact` over an output's taps (``weight_columns``:
    the GEMM's ``sum_k |w - zw|`` per column ``(kh, kw, c)``): the largest tap of an upsampler (one tap
    per pixel), the sum of the taps otherwise."""
    taps = np.asarray(weight_columns, np.float64).reshape(-1, geometry.out_channels)
    reach = taps.max(axis=0) if is_upsample(geometry) else taps.sum(axis=0)
    return float32_requant_exact(reach, a_reach, bias, mult)


def build_col2im(geometry, epilogue: Epilogue, name: str = "col2im", float32: bool = False):
    """Arguments: ``cols`` int32 ``[B*H*W, KH*KW*C]`` (rows ``(b, ih, iw)``, columns ``(kh, kw, c)``: the GEMM's
    output, no reshape), ``bias`` int32, the requantization parameters of :func:`col2im_params` (each
    :func:`param_length` long), and the output ``[B, OH, OW, C]`` in ``epilogue.out_dtype``. ``float32``:
    requantize in float32 (:func:`~tvm_lowprec.kernels.qgemm.requant_f32`; the caller checked
    :func:`col2im_float32_exact`)."""
    g, ep = geometry, epilogue
    (h_n, w_n), (oh_n, ow_n), (kh_n, kw_n) = g.in_hw, g.out_hw, g.kernel
    (sh, sw), (dh, dw) = g.strides, g.dilation
    top, left = g.padding[0], g.padding[1]
    c_n, p_n = g.out_channels, param_length(g)
    cols = te.placeholder((g.rows, g.columns), "int32", name="cols")  # the GEMM's output as it is
    bias = te.placeholder((p_n,), "int32", name="bias")
    if ep.mode == "fixed_point":
        params = [te.placeholder((p_n,), "int32", name="mult"), te.placeholder((p_n,), "int32", name="shift")]
    else:
        params = [te.placeholder((p_n,), "float32", name="mult")]
    kh, kw = te.reduce_axis((0, kh_n), "kh"), te.reduce_axis((0, kw_n), "kw")

    def tap(b, oh, ow, c):
        y, x = oh + top - kh * dh, ow + left - kw * dw
        ih, iw = tirx.floordiv(y, sh), tirx.floordiv(x, sw)
        inside = tirx.all(tirx.floormod(y, sh) == 0, tirx.floormod(x, sw) == 0, ih >= 0, ih < h_n, iw >= 0, iw < w_n)
        row = (b * h_n + tirx.max(tirx.min(ih, h_n - 1), 0)) * w_n + tirx.max(tirx.min(iw, w_n - 1), 0)
        value = cols[row, (kh * kw_n + kw) * c_n + c]
        return te.sum(tirx.if_then_else(inside, value, tirx.const(0, "int32")), axis=[kh, kw])

    def one_tap(b, oh, ow, c):  # strides == kernel: each output pixel is reached by one tap at most
        y, x = oh + top, ow + left
        ih, iw = tirx.floordiv(y, sh), tirx.floordiv(x, sw)
        row = (b * h_n + tirx.min(ih, h_n - 1)) * w_n + tirx.min(iw, w_n - 1)
        value = cols[row, (tirx.floormod(y, sh) * kw_n + tirx.floormod(x, sw)) * c_n + c]
        return tirx.if_then_else(tirx.all(ih < h_n, iw < w_n), value, tirx.const(0, "int32"))  # output_padding

    upsample = is_upsample(g)
    total = te.compute((g.batch, oh_n, ow_n, c_n), one_tap if upsample else tap, name="col2im")

    def out(b, oh, ow, c):
        j = tirx.floormod(ow + left, sw) * c_n + c if upsample else c  # the parameters' entry
        acc = total[b, oh, ow, c] + bias[j]
        if float32 and ep.mode == "float":
            return requant_f32(acc, ep, params[0][j])
        return requantize(acc, ep, *(p[j] for p in params))

    y = te.compute((g.batch, oh_n, ow_n, c_n), out, name="epilogue")
    func = te.create_prim_func([cols, bias, *params, y])
    attrs = {"lowprec.op": "col2im", "op_pattern": 8, "lowprec.kernel": [kh_n, kw_n]}
    return func.with_attr("global_symbol", name).with_attrs(attrs)


def col2im_params(bias_int, mult, epilogue: Epilogue, geometry) -> list[np.ndarray]:
    """The constant arguments after ``cols``: the int32 bias (zeros without one) and the multipliers
    (``[mult]``, or ``[m0, shift]`` in fixed-point mode), one per output channel, repeated to
    :func:`param_run` and padded with zeros to :func:`param_length`."""
    channels = geometry.out_channels
    from ..quant.requant import fixed_point_multiplier

    bias = np.zeros(channels, np.int64) if bias_int is None else np.broadcast_to(np.asarray(bias_int, np.int64), (channels,))
    if np.any(np.abs(bias) >= 2**31):
        raise ValueError("transposed convolution bias overflows int32")
    mult = np.broadcast_to(np.asarray(mult, np.float32), (channels,))
    scales = list(fixed_point_multiplier(mult)) if epilogue.mode == "fixed_point" else [np.ascontiguousarray(mult)]
    run, length = param_run(geometry), param_length(geometry)
    return [np.pad(np.tile(v, run // channels), (0, length - run)) for v in [bias.astype(np.int32)] + scales]
