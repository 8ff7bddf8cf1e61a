"""Pass: dequantize -> matmul [-> add bias] [-> relu/clip] -> quantize  ==>  one integer GEMM kernel.

(Transposed convolutions: :mod:`.conv_transpose`, GEMM + col2im, matched by the same pass.)

Runs on the QDQ Relax module that :func:`tvm_lowprec.from_onnx` (or a quantizer) produces, before
legalization. Each match becomes ``call_tir`` to a :func:`~tvm_lowprec.kernels.build_qgemm` PrimFunc with
the weights quantized and packed at compile time, bias and zero points folded into one int32 vector,
and requantization (plus the activation, as clamp bounds) in the kernel's epilogue. ``MatMulInteger``
(an int32 matmul of widened, zero-point-shifted 8-bit operands) becomes the same kernel with an int32
epilogue. Anything that does not match stays as it is (float semantics, still correct).
"""

from __future__ import annotations

import functools
import logging
import operator
from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

from ..errors import LowPrecError
from ..kernels.depthwise import DepthwiseProblem, build_depthwise, depthwise_params
from ..kernels.im2col import build_im2col, pad_argument
from ..kernels.pack_b import build_pack_b
from ..kernels.qgemm import (ConvWindow, Epilogue, GemmLayout, QGemmProblem, build_qgemm, epilogue_params, float32_requant_exact,
                             out_range_param, pack_weights)
from ..targets import TargetSpec
from .patterns import (
    ConstWeight,
    ConvGeometry,
    QParams,
    call_of,
    constant,
    first_call,
    mutate_relax_functions,
    conv_geometry,
    conv_weight_matrix,
    dequantized_activation,
    dequantized_conv_weight,
    dequantized_weight,
    dtype_of,
    qparams,
    gemm_input_shape,
    static_shape,
    trim_dead_taps,
)
from .requant import qrange
from .zero_points import CorrectionOverflow, gemm_corrections, signed_weights, zero_point_coefficient

_log = logging.getLogger("tvm_lowprec.quant")


@dataclass(frozen=True)
class QGemmMatch:
    x: relax.Expr  # runtime 8-bit activation [..., K]
    x_zero_point: int
    acc_scale: np.ndarray  # float32 [N]: scale of one accumulator unit (sx * sw)
    weight: ConstWeight
    bias_int: np.ndarray | None  # int32 [N] in accumulator units
    epilogue: Epilogue
    mult: np.ndarray | None  # float32 [N] requantization multiplier
    x_zero_point_expr: relax.Expr | None = None  # a runtime activation zero point (dynamic quantization)
    conv: ConvGeometry | None = None  # a convolution, computed as im2col + GEMM
    out_scale: float | None = None  # a requantized output's scale
    fbias: np.ndarray | None = None  # float32 [N]: a "float" epilogue's bias (added after the scale)


# ---------------------------------------------------------------------------------------------
# Step 1. Matchers: quantize(...) chains and MatMulInteger chains -> QGemmMatch


def _bound(value) -> float | None:
    """A clip bound (a FloatImm/IntImm in TVM 0.27's relax.clip) as a float."""
    value = getattr(value, "value", None)
    while value is not None and not isinstance(value, (int, float)):
        value = getattr(value, "value", None)
    return None if value is None else float(value)


def _activation_bounds(expr, lookup):
    """Strip relu/clip; return (inner expr, lo, hi) of the float range they impose."""
    lo, hi = -np.inf, np.inf
    while True:
        relu = call_of(expr, "nn.relu", lookup)
        if relu is not None:
            lo, expr = max(lo, 0.0), relu.args[0]
            continue
        clip = call_of(expr, "clip", lookup)
        if clip is not None:
            cmin, cmax = _bound(clip.args[1]), _bound(clip.args[2])
            if cmin is None or cmax is None:
                return expr, lo, hi
            lo, hi, expr = max(lo, cmin), min(hi, cmax), clip.args[0]
            continue
        return expr, lo, hi


def _peel(expr, lookup, names=("reshape", "expand_dims")):
    """Look through shape-only calls (a conv bias arrives as ``reshape(b, [1, C, 1, 1])``)."""
    while True:
        for name in names:
            call = call_of(expr, name, lookup)
            if call is not None:
                expr = call.args[0]
                break
        else:
            return expr


def _bias(expr, lookup, acc_scale):
    """A constant bias ([N] float, or dequantize of int32) in accumulator units."""
    expr = _peel(expr, lookup)
    dq = call_of(expr, "dequantize", lookup)
    if dq is not None:
        values = constant(dq.args[0], lookup)
        p = qparams(dq, lookup, "bias dequantize")
        if values is None or p is None or values.dtype != np.int32:
            return None
        real = (values.astype(np.float64) - p.zero_point) * p.scale
    else:
        real = constant(expr, lookup)
        if real is None or real.dtype != np.float32:
            return None
    real = np.asarray(real, np.float64).reshape(-1)
    if real.size not in (1, acc_scale.size):
        return None
    return np.rint(real / acc_scale.astype(np.float64)).astype(np.int64)


_LINEAR_OPS = ("matmul", "nn.conv2d")


def _linear_call(expr, lookup):
    return first_call(expr, _LINEAR_OPS, lookup)


def _linear_operands(expr, lookup):
    """(matmul or conv2d call, bias expr or None), also through ``add(core, bias)`` in either order."""
    add = call_of(expr, "add", lookup)
    if add is not None:
        for core_side, bias_side in ((0, 1), (1, 0)):
            core = _linear_call(add.args[core_side], lookup)
            if core is not None:
                return core, add.args[bias_side]
        return None, None
    return _linear_call(expr, lookup), None


def _const_weight(core, lookup):
    """(GEMM weights, conv geometry or None) of a matmul or conv2d whose weight is a dequantized constant."""
    if core.op.same_as(tvm.ir.Op.get("relax.matmul")):
        return dequantized_weight(core.args[1], lookup), None
    geometry = conv_geometry(core, grouped=True)
    if geometry is None:
        return None, None
    return dequantized_conv_weight(core.args[1], lookup), geometry


def requantized_output(call, lookup):
    """``quantize([relu/clip](inner))`` to 8 bits per tensor -> (its QParams, out dtype, inner, lo, hi)
    with the float range the activation imposes, or None."""
    if not call.op.same_as(tvm.ir.Op.get("relax.quantize")):
        return None
    out_dtype = str(call.attrs.out_dtype)
    out = qparams(call, lookup, "output quantize")
    if out is None or not out.per_tensor or out_dtype not in ("uint8", "int8"):
        return None
    return (out, out_dtype, *_activation_bounds(call.args[0], lookup))


def match_requantized_linear(call, lookup, mode: str) -> QGemmMatch | None:
    requantized = requantized_output(call, lookup)
    if requantized is None:
        return None
    out, out_dtype, inner, lo, hi = requantized
    core, bias_expr = _linear_operands(inner, lookup)
    if core is None:
        return None
    x = dequantized_activation(core.args[0], lookup)
    w, geometry = _const_weight(core, lookup)
    if x is None or w is None:
        return None
    n = w.values.shape[1]
    acc_scale = np.broadcast_to(np.float32(x.params.scale) * w.scale.astype(np.float32), (n,)).astype(np.float32)
    bias = None
    if bias_expr is not None:
        bias = _bias(bias_expr, lookup, acc_scale)
        if bias is None:
            return None
    return QGemmMatch(
        x=x.data,
        x_zero_point=int(x.params.zero_point),
        acc_scale=acc_scale,
        weight=w,
        bias_int=bias,
        epilogue=_requant_epilogue(out, out_dtype, lo, hi, mode),
        mult=(acc_scale / np.float32(out.scale)).astype(np.float32),
        conv=geometry,
        out_scale=float(out.scale),
    )


def _requant_epilogue(out: QParams, out_dtype: str, lo: float, hi: float, mode: str) -> Epilogue:
    """Fused activation as quantized clamp bounds: exact, since rounding is monotone."""
    zp = int(out.zero_point)
    qlo, qhi = qrange(out_dtype)

    def q(v):
        return int(np.clip(np.rint(np.float32(v) / out.scale) + zp, qlo, qhi))

    return Epilogue(
        "requant",
        out_dtype,
        zero_point=zp,
        qmin=q(lo) if np.isfinite(lo) else None,
        qmax=q(hi) if np.isfinite(hi) else None,
        mode=mode,
    )


def _peeled_constant(expr, lookup):
    """A constant seen through astype / expand_dims / reshape (how importers shape zero points)."""
    return constant(_peel(expr, lookup, ("astype", "expand_dims", "reshape")), lookup)


def _widened(expr, lookup):
    """``astype(x, int32) [- zero point]`` -> (x, zero point array or None, zero point expr or None).

    A zero point that is not a constant (DynamicQuantizeLinear's output) comes back as an expression.
    """
    zp, zp_expr = np.zeros((), np.int64), None
    sub = call_of(expr, "subtract", lookup)
    if sub is not None:
        zp = _peeled_constant(sub.args[1], lookup)
        if zp is None:
            zp_expr = sub.args[1]
        expr = sub.args[0]
    cast = call_of(expr, "astype", lookup)
    if cast is None or dtype_of(cast.args[0]) not in ("uint8", "int8"):
        return None
    return cast.args[0], (None if zp is None else np.asarray(zp, np.int64)), zp_expr


def match_integer_linear(call, lookup, mode: str) -> QGemmMatch | None:
    """MatMulInteger / ConvInteger: an int32 matmul or conv2d of widened, shifted 8-bit operands."""
    if _linear_call(call, lambda v: None) is None or dtype_of(call) != "int32":
        return None
    a, b = _widened(call.args[0], lookup), _widened(call.args[1], lookup)
    if a is None or b is None or b[1] is None:
        return None
    if a[1] is not None and a[1].size != 1:
        return None  # a per-row activation zero point stays on the generic path
    if a[2] is not None and not _scalar_like(a[2]):
        return None
    w = constant(b[0], lookup)
    geometry = None
    if w is not None and w.ndim == 4 and call.op.same_as(tvm.ir.Op.get("relax.nn.conv2d")):
        geometry = conv_geometry(call)
        if geometry is None or a[2] is not None:
            return None  # the im2col padding needs a constant activation zero point
        w = conv_weight_matrix(w)
    if w is None or w.ndim != 2:
        return None
    n = w.shape[1]
    zw = b[1].reshape(-1)
    if zw.size not in (1, n):
        return None
    weight = ConstWeight(w, np.ones((), np.float32), zw if zw.size > 1 else zw.reshape(()))
    za = 0 if a[1] is None else int(a[1].reshape(()))
    return QGemmMatch(a[0], za, np.ones(n, np.float32), weight, None, Epilogue("int32"), None, a[2], geometry)


@dataclass(frozen=True)
class RuntimeQMatmul:
    """``quantize(core(dequantize(x), dequantize(w)) [+ dequantize(int32 bias)])`` that the kernel path
    declined: runtime weights or parameters, or a grouped / depthwise convolution.

    Emitted as an exact int32 matmul or conv2d of zero-point-shifted operands, the int32 bias added,
    and a float64 requantization: the same numbers as the kernel path, on TVM's generic operators.
    Weight scales and zero points may be per output channel.
    """

    x: relax.Expr
    w: relax.Expr
    x_q: relax.Call  # the dequantize calls and the quantize call, for their parameters
    w_q: relax.Call
    out_q: relax.Call
    core: relax.Call  # the matmul or conv2d, for its attributes
    bias: relax.Expr | None = None  # int32 [N], in accumulator units
    channel_shape: tuple = ()  # how a per-output-channel vector broadcasts against the weight
    # (sx, zx, sw, zw, sy, zy) when every parameter is a per-tensor constant: the packed kernel path
    const_params: tuple | None = None


def _bias_int32(expr, lookup):
    """``dequantize(b: int32, scale, 0)`` (through reshapes) -> b; the scale is x_scale * w_scale by
    construction (ONNX QLinearConv, ONNX Runtime's QDQ bias), so b is in accumulator units."""
    dq = call_of(_peel(expr, lookup), "dequantize", lookup)
    if dq is None or dtype_of(dq.args[0]) != "int32":
        return None
    zp = _peeled_constant(dq.args[2], lookup)
    return dq.args[0] if zp is not None and not np.any(zp) else None


def _weight_channel_shape(core, dw):
    """Shape that makes a per-output-channel weight parameter broadcast, or None if it cannot."""
    w_shape = static_shape(dw.args[0])
    n_params = static_shape(dw.args[1])
    if w_shape is None or n_params is None:
        return None
    size = int(np.prod(n_params))
    if size == 1:
        return ()
    is_conv = not core.op.same_as(tvm.ir.Op.get("relax.matmul"))
    channels = w_shape[0] if is_conv else w_shape[-1]
    axis_ok = int(dw.attrs.axis) % len(w_shape) == (0 if is_conv else len(w_shape) - 1)
    if size != channels or not axis_ok:
        return None
    return (channels,) + (1,) * (len(w_shape) - 1) if is_conv else (channels,)


def match_runtime_qlinear(call, lookup, mode: str):
    if not call.op.same_as(tvm.ir.Op.get("relax.quantize")) or str(call.attrs.out_dtype) not in ("uint8", "int8"):
        return None
    mm, bias_expr = _linear_operands(call.args[0], lookup)
    if mm is None:
        return None
    dx, dw = call_of(mm.args[0], "dequantize", lookup), call_of(mm.args[1], "dequantize", lookup)
    if dx is None or dw is None:
        return None
    if any(dtype_of(d.args[0]) not in ("uint8", "int8") for d in (dx, dw)):
        return None
    if not all(_scalar_like(e) for e in (dx.args[1], dx.args[2], call.args[1], call.args[2])):
        return None  # per-axis activation or output parameters: not a matmul requantization
    channel_shape = _weight_channel_shape(mm, dw)
    if channel_shape is None or static_shape(dw.args[2]) != static_shape(dw.args[1]) and not _scalar_like(dw.args[2]):
        return None
    bias = None
    if bias_expr is not None:
        bias = _bias_int32(bias_expr, lookup)
        if bias is None:
            return None
    params = [constant(e, lookup) for e in (dx.args[1], dx.args[2], dw.args[1], dw.args[2], call.args[1], call.args[2])]
    const_params = tuple(np.asarray(v).reshape(()) for v in params) if all(
        v is not None and np.asarray(v).size == 1 for v in params) else None
    return RuntimeQMatmul(dx.args[0], dw.args[0], dx, dw, call, mm, bias, channel_shape, const_params)


def _scalar_like(expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and int(np.prod(shape)) == 1


def _conv_transpose_matcher(call, lookup, mode: str):
    from .conv_transpose import match_requantized_conv_transpose  # it builds on this module's helpers

    return match_requantized_conv_transpose(call, lookup, mode)


def _int16_matcher(call, lookup, mode: str):
    from .int16_linear import match_int16_linear  # 16-bit activations: the int16 x int8 GEMM

    return match_int16_linear(call, lookup, mode)


MATCHERS = (match_requantized_linear, match_integer_linear, match_runtime_qlinear, _conv_transpose_matcher,
            _int16_matcher)


def match_dequantized_linear(call, lookup, mode: str) -> QGemmMatch | None:
    """``dequantize(x) @ dequantize(W)`` (or a conv2d) whose result stays float32 (a graph output, a
    residual add): the integer GEMM with a float epilogue, ``(acc + corrections) * sx * sw``. Tried in
    a second pass (:data:`FLOAT_OUTPUT_MATCHERS`), after every requantized layer has been taken."""
    core = _linear_call(call, lookup)
    if core is None or core is not call or dtype_of(call) != "float32":
        return None
    x = dequantized_activation(core.args[0], lookup)
    w, geometry = _const_weight(core, lookup)
    if x is None or w is None or (geometry is not None and geometry.depthwise):
        return None
    n = w.values.shape[1]
    acc_scale = np.broadcast_to(np.float32(x.params.scale) * w.scale.astype(np.float32), (n,)).astype(np.float32)
    return QGemmMatch(x=x.data, x_zero_point=int(x.params.zero_point), acc_scale=acc_scale, weight=w, bias_int=None,
                      epilogue=Epilogue("float"), mult=acc_scale, conv=geometry)


# the second pass: what the first left of the dequantize -> matmul/conv form
FLOAT_OUTPUT_MATCHERS = (match_dequantized_linear,)


# ---------------------------------------------------------------------------------------------
# Step 2. Emit: QGemmMatch -> reshape + call_tir(qgemm) + reshape


NCHW_TO_NHWC, NHWC_TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _im2col(builder, x, geometry: ConvGeometry, pad_value: int, channels: int | None = None, window: bool = False):
    """``cols[(b, oh, ow), (kh, kw, c)]``: a 2-D view of the NHWC input (pointwise convolutions) or of
    :func:`~tvm_lowprec.kernels.im2col.build_im2col` (``channels`` per tap: see :func:`_tap_channels`);
    with ``window``, the padded NHWC input that a GEMM reads its im2col from in place
    (:class:`~tvm_lowprec.kernels.qgemm.ConvWindow`; the padding copy only where there is padding).
    The NCHW -> NHWC transpose emitted here usually cancels against the previous layer's
    (:mod:`~tvm_lowprec.quant.propagate_layout`)."""
    g = geometry
    c = g.channels if channels is None else channels
    x = builder.emit(relax.op.permute_dims(x, NCHW_TO_NHWC))
    if window:
        if not any(g.padding) and c == g.channels:
            return x
        name = f"pad_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}"
        gvar = builder.add_func(build_im2col(g, dtype_of(x), name, channels=c, gather=False), name)
        return builder.emit(relax.call_tir(gvar, [x, relax.const(pad_argument(pad_value))],
                                           relax.TensorType(conv_window(g, c).shape, dtype_of(x))))
    if not g.is_pointwise:
        name = f"im2col_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}_k{g.kernel[0]}x{g.kernel[1]}"
        gvar = builder.add_func(build_im2col(g, dtype_of(x), name, channels=c), name)
        shape6 = (g.batch, *g.out_hw, *g.kernel, c)
        x = builder.emit(relax.call_tir(gvar, [x, relax.const(pad_argument(pad_value))],
                                        relax.TensorType(shape6, dtype_of(x))))
    return builder.emit(relax.op.reshape(x, (g.rows, g.kernel[0] * g.kernel[1] * c)))


def _tap_channels(match: QGemmMatch, layout) -> int | None:
    """Channels per tap that make an im2col GEMM's depth whole instruction steps of ``layout``, where
    one more channel does it (a 3x3 stem of 3 channels: K = 27, which the GEMM would pad to 28 by
    copying every row of A; 4 channels: K = 36, the copy gone, 0.082 -> 0.055-0.062 ms for 25600x8 on
    Zen 5); None where the depth is already whole, more channels would be needed, or the GEMM is wider
    than one vector of columns: a narrow GEMM is bound by its rows' costs (the copy among them), a wide
    one by its multiply-adds, which the extra channel adds a third to (ResNet's 7x7 stem, 12544x64:
    0.320 -> 0.360 ms with a fourth channel)."""
    g = match.conv
    if g is None or g.is_pointwise or g.depthwise or layout.kp == g.depth or match.x_zero_point_expr is not None:
        return None
    if layout.np_ > layout.lanes:
        return None
    taps = g.kernel[0] * g.kernel[1]
    return g.channels + 1 if (taps * (g.channels + 1)) % layout.kstep == 0 else None


def _with_tap_channels(weight: ConstWeight, geometry: ConvGeometry, channels: int) -> ConstWeight:
    """The ``[(kh, kw, c), N]`` weights with rows for the extra channels, each the column's zero point
    (so ``w - zw`` is 0 there, whatever the activation holds)."""
    kh, kw = geometry.kernel
    values = weight.values.reshape(kh, kw, geometry.channels, -1)
    n = values.shape[-1]
    zw = np.broadcast_to(np.asarray(weight.zero_point).reshape(-1), (n,)).astype(values.dtype)
    extra = np.broadcast_to(zw, (kh, kw, channels - geometry.channels, n))
    padded = np.concatenate([values, extra], axis=2).reshape(kh * kw * channels, n)
    return replace(weight, values=np.ascontiguousarray(padded))


def conv_window(g: ConvGeometry, channels: int | None = None, groups: int = 1) -> ConvWindow:
    """The window of a convolution's padded NHWC input (``channels`` per tap: see :func:`_tap_channels`;
    a grouped convolution's: one group's channels, and its ``groups``)."""
    top, left, bottom, right = g.padding
    return ConvWindow(g.batch, (g.in_hw[0] + top + bottom, g.in_hw[1] + left + right), tuple(g.out_hw), tuple(g.kernel),
                      tuple(g.strides), tuple(g.dilation), g.channels if channels is None else channels, groups)


def _reads_window(match: QGemmMatch, layout, channels: int | None, row_term: bool) -> bool:
    """Whether the GEMM reads the convolution's im2col in place (:class:`~tvm_lowprec.kernels.qgemm.ConvWindow`)
    instead of from an im2col buffer: a CPU layout of one row per instruction whose K step divides the
    channels per tap (each step one tap's contiguous channels) and that stores the activations as they
    are, a constant zero point (it pads), no row term. Measured (AMX Xeon, 1 thread, GEMM ms in place
    vs. im2col + GEMM): 122x122x24 -> 14400x6 0.084 vs 0.137 + 0.086; the 4-channel 322x322 stem -> 25600x8
    0.042 vs 0.048 + 0.033; 82x82x8 -> 6400x8 0.021 vs 0.011 + 0.018."""
    g = match.conv
    if g is None or g.is_pointwise or g.depthwise or match.x_zero_point_expr is not None or row_term:
        return False
    return _layout_reads_window(layout, g, g.channels if channels is None else channels, dtype_of(match.x))


def _layout_reads_window(layout, g: ConvGeometry, channels: int, a_dtype: str) -> bool:
    """The layout's side of :func:`_reads_window` (also a grouped convolution's, ``channels`` one
    group's): one row per instruction, B in panels, K steps within a tap's ``channels``, A as stored."""
    if layout.b_order != "panels" or layout.rows != 1 or channels % layout.kstep:
        return False
    return layout.a_storage == a_dtype and layout.kp == g.kernel[0] * g.kernel[1] * channels


def _row_term(weight: ConstWeight) -> bool:
    """Whether the weights' zero point (as the kernel stores them, int8) is not zero: the GEMM then
    needs the activation rows' sums."""
    return bool(np.any(np.asarray(weight.zero_point) - (128 if weight.values.dtype == np.uint8 else 0)))


def _gemm_input(builder, match: QGemmMatch, channels: int | None = None, window: bool = False):
    """(activation: 2-D [M, K], or with ``window`` the padded NHWC input; shape to restore the output
    with or None; output permutation)."""
    if match.conv is not None:
        g = match.conv
        if static_shape(match.x) != (g.batch, g.channels, *g.in_hw):
            return None, None, None
        x2 = _im2col(builder, match.x, g, match.x_zero_point, channels, window)
        return x2, (g.batch, *g.out_hw), NHWC_TO_NCHW  # [B*OH*OW, OC] -> NHWC -> NCHW
    xshape = static_shape(match.x)
    if xshape is None:  # symbolic rows (a prompt's tokens): the GEMM's M is their product, K must be constant
        xshape = gemm_input_shape(match.x)
        if xshape is None or len(xshape) < 2:
            return None, None, None  # no shape, or a symbolic K: the generic path
        m = functools.reduce(operator.mul, xshape[:-1])
    elif len(xshape) < 2:
        return None, None, None
    else:
        m = int(np.prod(xshape[:-1]))
    x2 = match.x if len(xshape) == 2 else builder.emit(relax.op.reshape(match.x, (m, xshape[-1])))
    return x2, (xshape[:-1] if len(xshape) != 2 else None), None


def _rows_of(x2):
    """The M of a 2-D GEMM input: an int, or for rows known at run time a fresh TIR variable (the
    kernel's own; TVM binds it from the argument's shape at each call)."""
    m = x2.ty.shape[0]
    return int(m) if isinstance(m, tvm.tirx.IntImm) else tvm.tirx.Var("m", "int64")


def emit_depthwise(builder, match: QGemmMatch, spec: TargetSpec) -> relax.Expr | None:
    """A depthwise convolution: its own NHWC kernel (:mod:`~tvm_lowprec.kernels.depthwise`)."""
    g = match.conv
    if static_shape(match.x) != (g.batch, g.channels, *g.in_hw) or match.x_zero_point_expr is not None:
        return None
    a_dtype = dtype_of(match.x)
    problem = DepthwiseProblem(g, a_dtype, match.epilogue)
    name = f"qdepthwise_{a_dtype[0]}8_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}_k{g.kernel[0]}x{g.kernel[1]}_s{g.strides[0]}"
    params = depthwise_params(match.weight.values, match.weight.zero_point, match.x_zero_point, match.bias_int,
                              match.mult, match.epilogue)
    # the parameters let the epilogue requantize in float32 where exact, with LLVM's FMA (CPU rows)
    gvar = builder.add_func(build_depthwise(problem, name, params, spec.float32_requant), name)
    x = builder.emit(relax.op.permute_dims(match.x, NCHW_TO_NHWC))
    out_type = relax.TensorType((g.batch, *g.out_hw, g.channels), match.epilogue.out_dtype)
    y = builder.emit(relax.call_tir(gvar, [x] + [relax.const(p) for p in params], out_type))
    return builder.emit(relax.op.permute_dims(y, NHWC_TO_NCHW))


def float32_bound_terms(match) -> tuple | None:
    """``(sum_k |w - zw| per column, the largest |a - za|, bias)`` for a ``"float"`` requantization
    (:func:`~tvm_lowprec.kernels.qgemm.float32_requant_exact`'s inputs but the multiplier), None for any
    other epilogue. ``match``: a :class:`QGemmMatch` or a transposed convolution's match (same fields)."""
    ep = match.epilogue
    if ep.kind != "requant" or ep.mode != "float":
        return None
    za = int(np.asarray(match.x_zero_point).reshape(-1)[0])
    w = match.weight.values.astype(np.int64) - np.asarray(match.weight.zero_point, np.int64).reshape(1, -1)
    bias = 0 if match.bias_int is None else match.bias_int
    return np.abs(w).sum(axis=0), _reach(dtype_of(match.x), za), bias


def _reach(dtype: str, zero_point) -> int:
    """The largest ``|q - zero_point|`` over the codes of ``dtype``."""
    info = np.iinfo(dtype)
    return max(int(zero_point) - int(info.min), int(info.max) - int(zero_point))


def _float32_exact(match: QGemmMatch) -> bool:
    """A float requantization that float32 computes exactly for these weights (see
    :func:`~tvm_lowprec.kernels.qgemm.float32_requant_exact`)."""
    terms = float32_bound_terms(match)
    return terms is not None and float32_requant_exact(*terms, match.mult)


def _correction_overflow(match: QGemmMatch) -> CorrectionOverflow | None:
    """Whether some channel's folded bias and zero-point correction would not fit int32, for any
    activation offset a layout may take (checked before anything is emitted)."""
    for a_offset in (0, -128, 128):
        try:
            gemm_corrections(match.weight.values, match.x_zero_point, match.weight.zero_point, a_offset,
                             match.bias_int)
        except CorrectionOverflow as err:
            return err
    return None


def _emit_with_float_bias(builder, match: QGemmMatch, spec: TargetSpec) -> relax.Expr | None:
    """A requantized layer whose bias does not fit int32 in accumulator units (near-zero weights meeting
    a large bias: a random or pruned channel, YOLOv8-pose's keypoint head): the integer GEMM without the
    bias, its ``"float"`` epilogue ``acc * sx * sw + bias`` (the bias in float32, as the QDQ graph
    dequantizes it), then the output's quantize and the activation's clamp. None where the zero-point
    corrections alone overflow too, or for a depthwise/grouped convolution or a run-time zero point."""
    ep = match.epilogue
    if (ep.kind != "requant" or match.out_scale is None or match.x_zero_point_expr is not None
            or match.conv is not None and (match.conv.depthwise or match.conv.grouped)):
        return None
    fbias = None if match.bias_int is None else (np.asarray(match.bias_int, np.float64) * match.acc_scale).astype(np.float32)
    floated = replace(match, bias_int=None, fbias=fbias, epilogue=Epilogue("float"), mult=match.acc_scale)
    if _correction_overflow(floated) is not None:
        return None
    y = emit_qgemm(builder, floated, spec)
    if y is None:
        return None
    q = builder.emit(relax.op.quantize(y, relax.const(np.float32(match.out_scale)), relax.const(ep.zero_point, ep.out_dtype),
                                       -1, ep.out_dtype))
    if (ep.qmin, ep.qmax) != qrange(ep.out_dtype):
        q = builder.emit(relax.op.clip(q, ep.qmin, ep.qmax))
    return q


def emit_qgemm(builder, match: QGemmMatch, spec: TargetSpec) -> relax.Expr | None:
    if match.conv is not None and not match.conv.depthwise:
        conv, weight = trim_dead_taps(match.conv, match.weight)
        match = replace(match, conv=conv, weight=weight)
    overflow = _correction_overflow(match)
    if overflow is not None:
        y = _emit_with_float_bias(builder, match, spec)
        if y is not None:
            return y
        # exact either way: the layer keeps the QDQ graph's own float arithmetic (dequantize, float
        # matmul/conv with the float bias, quantize) instead of one int32 kernel; PTQ widens such
        # channels' weight scales instead (tvm_lowprec.ptq), so its layers keep the integer kernel
        _log.warning("a quantized %s [K=%d, N=%d] stays in float QDQ arithmetic: %s", "conv2d" if match.conv else
                     "matmul", *match.weight.values.shape, overflow)
        return None
    if match.conv is not None and match.conv.depthwise:
        return emit_depthwise(builder, match, spec)
    if match.conv is not None and match.conv.grouped:
        return emit_grouped(builder, match, spec)
    k, n = match.weight.values.shape
    row_term = _row_term(match.weight)
    runtime_za = match.x_zero_point_expr is not None

    requant_f32 = spec.float32_requant and not runtime_za and _float32_exact(match)  # the extra channels add 0

    def problem_for(m_rows, depth):
        return QGemmProblem(m_rows, n, depth, dtype_of(match.x), match.epilogue, row_term=row_term,
                            runtime_a_zero_point=runtime_za, requant_f32=requant_f32)

    channels = None
    if match.conv is not None and not match.conv.is_pointwise:
        first = GemmLayout.choose(problem_for(match.conv.rows, k), spec, signed_weights(match.weight.values)[0])
        channels = _tap_channels(match, first)
        if channels is not None:
            match = replace(match, weight=_with_tap_channels(match.weight, match.conv, channels))
            k = match.weight.values.shape[0]
    window = None
    if match.conv is not None and not match.conv.is_pointwise:
        flat = GemmLayout.choose(problem_for(match.conv.rows, k), spec, signed_weights(match.weight.values)[0])
        window = conv_window(match.conv, channels) if _reads_window(match, flat, channels, row_term) else None
    x2, out_lead, perm = _gemm_input(builder, match, channels, window is not None)
    if x2 is None or (window is None and int(x2.ty.shape[-1]) != k):
        return None
    m = _rows_of(x2) if window is None else window.rows
    problem = replace(problem_for(m, k), window=window)
    layout = GemmLayout.choose(problem, spec, signed_weights(match.weight.values)[0])
    corr = gemm_corrections(match.weight.values, match.x_zero_point, match.weight.zero_point, layout.a_offset, match.bias_int)
    zcoef = zero_point_coefficient(match.weight.values, match.weight.zero_point) if runtime_za else None
    kind = "qconv2d" if match.conv is not None else "qgemm"
    name = f"{kind}_{problem.a_dtype[0]}8_{m if isinstance(m, int) else 'M'}x{n}x{k}_{problem.epilogue.kind}{'_dynzp' if runtime_za else ''}"
    gvar = builder.add_func(build_qgemm(problem, layout, name).with_attr("op_pattern", 8), name)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, match.mult, fbias=match.fbias, zcoef=zcoef)
    args = [x2]
    if runtime_za:
        args.append(builder.emit(relax.op.reshape(relax.op.astype(match.x_zero_point_expr, "int32"), (1,))))
    args += [relax.const(pack_weights(corr.b_signed, layout))] + [relax.const(p) for p in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((m if isinstance(m, int) else x2.ty.shape[0], n), problem.epilogue.out_dtype)))
    if out_lead is not None:
        y = builder.emit(relax.op.reshape(y, (*out_lead, n)))
    if perm is not None:
        y = builder.emit(relax.op.permute_dims(y, perm))
    return y


def emit_grouped(builder, match: QGemmMatch, spec: TargetSpec) -> relax.Expr | None:
    """A grouped convolution as one batched GEMM kernel, a group per batch: each group's weights packed
    for the row's intrinsic, its corrections and multipliers per group, the output written ``[M,
    groups, N/groups]`` (the NHWC channels in order). The GEMMs read the padded NHWC input in place
    (:class:`~tvm_lowprec.kernels.qgemm.ConvWindow`, group ``g`` from channel ``g * C/groups``) where
    a group's channels are whole instruction steps, else an im2col of each group's channels
    ``[groups, M, kh * kw * C/groups]``. Declined (the generic int32 path) with a weight zero point that
    needs the row term or a runtime activation zero point."""
    g = match.conv
    row_term = _row_term(match.weight)
    if row_term or match.x_zero_point_expr is not None or static_shape(match.x) != (g.batch, g.channels, *g.in_hw):
        return None
    k, n = match.weight.values.shape
    groups, ng = g.groups, n // g.groups
    if k != g.depth or n != g.out_channels:
        return None
    a_dtype = dtype_of(match.x)
    problem = QGemmProblem(g.rows, ng, k, a_dtype, match.epilogue, batch=groups, grouped=True,
                           requant_f32=spec.float32_requant and _float32_exact(match))
    b_signed = signed_weights(match.weight.values)[0]
    layout = GemmLayout.choose(problem, spec, b_signed)
    if _layout_reads_window(layout, g, g.group_channels, a_dtype):
        problem = replace(problem, window=conv_window(g, g.group_channels, groups))
        layout = GemmLayout.choose(problem, spec, b_signed)
        cols = _im2col(builder, match.x, g, match.x_zero_point, g.channels, window=True)
    else:
        x = builder.emit(relax.op.permute_dims(match.x, NCHW_TO_NHWC))
        cols_name = f"im2col_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}_k{g.kernel[0]}x{g.kernel[1]}_g{groups}"
        cols_gvar = builder.add_func(build_im2col(g, a_dtype, cols_name), cols_name)
        cols_shape = (groups, g.batch, *g.out_hw, *g.kernel, g.group_channels)
        cols = builder.emit(relax.call_tir(cols_gvar, [x, relax.const(pad_argument(match.x_zero_point))],
                                           relax.TensorType(cols_shape, a_dtype)))
        cols = builder.emit(relax.op.reshape(cols, (groups, g.rows, k)))
    corr = gemm_corrections(match.weight.values, match.x_zero_point, match.weight.zero_point, layout.a_offset,
                            match.bias_int)
    columns = [slice(i * ng, (i + 1) * ng) for i in range(groups)]
    packed = np.stack([pack_weights(corr.b_signed[:, c], layout) for c in columns])
    mult = None if match.mult is None else np.broadcast_to(np.asarray(match.mult, np.float32), (n,))
    per_group = [epilogue_params(problem, layout, corr.corr[c], None, None if mult is None else mult[c],
                                 with_out_range=False) for c in columns]
    params = [np.stack(column) for column in zip(*per_group)] + out_range_param(problem.epilogue)
    name = f"qgconv2d_{a_dtype[0]}8_{groups}x{g.rows}x{ng}x{k}_{problem.epilogue.kind}"
    gvar = builder.add_func(build_qgemm(problem, layout, name).with_attr("op_pattern", 8), name)
    args = [cols, relax.const(packed)] + [relax.const(p) for p in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((g.rows, groups, ng), problem.epilogue.out_dtype)))
    y = builder.emit(relax.op.reshape(y, (g.batch, *g.out_hw, n)))
    return builder.emit(relax.op.permute_dims(y, NHWC_TO_NCHW))


def _as_scalar(builder, expr, dtype):
    return builder.emit(relax.op.astype(relax.op.reshape(expr, ()), dtype))


def emit_runtime_qmatmul(builder, match: RuntimeQMatmul, spec: TargetSpec):
    def shifted(data, zp, shape=()):
        zp32 = builder.emit(relax.op.reshape(relax.op.astype(zp, "int32"), shape))
        return builder.emit(relax.op.subtract(relax.op.astype(data, "int32"), zp32))

    per_channel = match.channel_shape if _weight_zp_per_channel(match) else ()
    x32, w32 = shifted(match.x, match.x_q.args[2]), shifted(match.w, match.w_q.args[2], per_channel)
    is_matmul = match.core.op.same_as(tvm.ir.Op.get("relax.matmul"))
    if is_matmul:
        acc = builder.emit(relax.op.matmul(x32, w32, out_dtype="int32"))
    else:
        a = match.core.attrs
        acc = builder.emit(
            relax.op.nn.conv2d(x32, w32, a.strides, a.padding, a.dilation, a.groups, a.data_layout, a.kernel_layout,
                               a.out_layout, out_dtype="int32")
        )
    # a per-output-channel vector lies along the output's last axis (matmul) or axis 1 (NCHW conv)
    out_channel = (-1,) if is_matmul else (1, -1, 1, 1)
    if match.bias is not None:
        bias = builder.emit(relax.op.astype(match.bias, "int32"))  # reshape with -1 needs a typed input
        acc = builder.emit(relax.op.add(acc, relax.op.reshape(bias, out_channel)))
    sx, sy = (relax.op.reshape(q.args[1], ()) for q in (match.x_q, match.out_q))
    sw = relax.op.reshape(match.w_q.args[1], out_channel if match.channel_shape else ())
    # the multiplier in the scales' own dtype (as onnx.reference computes it), the product in float64
    mult = builder.emit(relax.op.astype(relax.op.divide(relax.op.multiply(sx, sw), sy), "float64"))
    zy = _as_scalar(builder, match.out_q.args[2], "float64")
    y = relax.op.add(relax.op.round(relax.op.multiply(relax.op.astype(acc, "float64"), mult)), zy)
    out_dtype = str(match.out_q.attrs.out_dtype)
    lo, hi = qrange(out_dtype)
    return builder.emit(relax.op.astype(relax.op.clip(y, lo, hi), out_dtype))


def _weight_zp_per_channel(match: RuntimeQMatmul) -> bool:
    return not _scalar_like(match.w_q.args[2])


def _batched_shapes(match: RuntimeQMatmul):
    """(batch, M, K, N, lead dims of the output) for a matmul of runtime operands, or None."""
    xs, ws = static_shape(match.x), static_shape(match.w)
    if xs is None or ws is None or len(xs) < 2 or len(ws) < 2 or xs[-1] != ws[-2]:
        return None
    k, n = ws[-2], ws[-1]
    if len(ws) == 2:  # one weight matrix: every leading dim of x is rows
        return 1, int(np.prod(xs[:-1])), k, n, xs[:-1]
    lead_x, lead_w = tuple(xs[:-2]), tuple(ws[:-2])
    if len(lead_w) > len(lead_x):
        return None
    lead_w = (1,) * (len(lead_x) - len(lead_w)) + lead_w  # numpy's broadcasting aligns the dims right
    shared = len(lead_w)
    while shared and lead_w[shared - 1] == 1 and lead_x[shared - 1] != 1:
        shared -= 1  # B's trailing batch dims of 1 broadcast (multi-query attention's one K and V for every
        # head): those of A's batch dims become rows of one GEMM per remaining batch
    if lead_x[:shared] != lead_w[:shared] or any(d != 1 for d in lead_w[shared:]):
        return None  # another broadcast (A's batch dims of 1 against B's): the generic path
    return int(np.prod(lead_x[:shared])), int(np.prod(lead_x[shared:])) * xs[-2], k, n, xs[:-1]


def emit_runtime_packed(builder, match: RuntimeQMatmul, spec: TargetSpec):
    """Runtime weights, per-tensor constant parameters: pack B at run time, then the batched kernel."""
    shapes = _batched_shapes(match)
    if shapes is None or match.const_params is None or match.bias is not None or not _is_matmul(match.core):
        return None
    batch, m, k, n, lead = shapes
    sx, zx, sw, zw, sy, zy = match.const_params
    out_dtype, b_dtype = str(match.out_q.attrs.out_dtype), dtype_of(match.w)
    b_off = 128 if b_dtype == "uint8" else 0
    zb_p = int(zw) - b_off
    epilogue = Epilogue("requant", out_dtype, zero_point=int(zy))
    mult = np.float32(np.float32(sx) * np.float32(sw)) / np.float32(sy)
    # a row term whose accumulator would not stay in cache: the row sums made beforehand (a reduction over K,
    # cheap where K is short), so the epilogue joins the GEMM's tiles (rowsum_input)
    big = batch * m * n * 4 > ROWSUM_INPUT_BYTES and k <= ROWSUM_INPUT_MAX_K and spec.backend.row_sums_first
    problem = QGemmProblem(m, n, k, dtype_of(match.x), epilogue, row_term=zb_p != 0, batch=batch,
                           requant_f32=spec.float32_requant and _runtime_float32_exact(match, k, mult),
                           rowsum_input=zb_p != 0 and big)
    layout = GemmLayout.choose(problem, spec, None)
    za_p = int(zx) + layout.a_offset
    pack = builder.add_func(build_pack_b(batch, k, n, b_dtype, layout, za_p, zb_p, f"pack_b_{batch}x{k}x{n}"),
                            f"pack_b_{batch}x{k}x{n}")
    w3 = builder.emit(relax.op.reshape(match.w, (batch, k, n)))
    packed = builder.emit(relax.call_tir(pack, [w3], [
        relax.TensorType((batch,) + layout.packed_shape, layout.b_storage), relax.TensorType((batch, layout.np_), "int32")]))
    name = f"qgemm_batched_{problem.a_dtype[0]}8_{batch}x{m}x{n}x{k}"
    gvar = builder.add_func(build_qgemm(problem, layout, name).with_attr("op_pattern", 8), name)
    params = epilogue_params(problem, layout, None, np.full(n, -zb_p, np.int32), mult)
    x3 = builder.emit(relax.op.reshape(match.x, (batch, m, k)))
    args = [x3, builder.emit(relax.TupleGetItem(packed, 0)), builder.emit(relax.TupleGetItem(packed, 1))]
    if problem.rowsum_input:
        args.append(builder.emit(relax.op.sum(relax.op.astype(x3, "int32"), axis=[-1])))
    args += [relax.const(v) for v in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((batch, m, n), out_dtype)))
    return builder.emit(relax.op.reshape(y, (*lead, n)))


# The runtime-operand GEMM's int32 accumulator, from which size its row sums come from outside the kernel
# (so its epilogue runs per tile): Whisper's 6x250x250 scores (1.5 MB) gained nothing, its 6x1500x1500
# (54 MB) spent most of their time writing and reading it. Only where K is short: the graph's reduction
# over K costs a pass over A (the probabilities' 1500 would cost more than it saves).
ROWSUM_INPUT_BYTES = 8 << 20
ROWSUM_INPUT_MAX_K = 256


def _runtime_float32_exact(match: RuntimeQMatmul, k: int, mult) -> bool:
    """Whether float32 requantizes a GEMM of two runtime operands exactly whatever their values
    (:func:`~tvm_lowprec.kernels.qgemm.float32_requant_exact` with every ``|b - zb|`` at its largest:
    ``K * max|b - zb|`` per column). Attention's score GEMM (K = 64) qualifies: float32's fused
    multiply-add in the epilogue (Whisper's 6x250x250x64 on one thread of the Zen 4: 353-403 -> 265 us a
    call; 6x250x64x250 168 -> 140 us)."""
    sx, zx, sw, zw, sy, zy = match.const_params
    column = np.full(1, k * _reach(dtype_of(match.w), zw), np.float64)
    return float32_requant_exact(column, _reach(dtype_of(match.x), zx), 0, np.full(1, mult, np.float64))


def _is_matmul(call) -> bool:
    return call.op.same_as(tvm.ir.Op.get("relax.matmul"))


def emit(builder, match, spec: TargetSpec):
    if hasattr(match, "emit"):  # matches defined beside this pass (conv_transpose) emit themselves
        return match.emit(builder, spec)
    if isinstance(match, RuntimeQMatmul):
        packed = emit_runtime_packed(builder, match, spec)
        return packed if packed is not None else emit_runtime_qmatmul(builder, match, spec)
    return emit_qgemm(builder, match, spec)


# ---------------------------------------------------------------------------------------------
# Step 3. The pass


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, spec: TargetSpec, mode: str, matchers=MATCHERS):
        super().__init__(mod)
        self.spec, self.mode, self.matchers, self.rewritten = spec, mode, matchers, 0
        self.error = None  # raised by rewrite_module: the C++ visitor would turn it into RuntimeError

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if self.error is not None:
            return call
        try:
            return self._rewrite(call)
        except LowPrecError as err:
            self.error = err
            return call

    def _rewrite(self, call):
        for matcher in self.matchers:
            match = matcher(call, self.lookup_binding, self.mode)
            if match is None:
                continue
            new = emit(self.builder_, match, self.spec)
            if new is not None:
                self.rewritten += 1
                return new
        return call


def rewrite_module(mod, spec: TargetSpec, requant_mode: str = "float"):
    """Apply the rewrite to every Relax function of ``mod`` (plain Python: errors keep their type)."""
    mod = mutate_relax_functions(mod, _Rewriter(mod, spec, requant_mode))
    # the layers the first pass took leave their float matmul behind, unused: gone before the second
    mod = relax.transform.DeadCodeElimination()(mod)
    return mutate_relax_functions(mod, _Rewriter(mod, spec, requant_mode, FLOAT_OUTPUT_MATCHERS))


def qdq_to_integer(spec: TargetSpec, requant_mode: str = "float"):
    """The rewrite as a TVM pass. ``requant_mode``: ``"float"`` (ONNX rounding, default) or ``"fixed_point"``."""

    @tvm.ir.transform.module_pass(opt_level=0, name="lowprec.QDQToInteger")
    def _pass(mod, _ctx):
        return rewrite_module(mod, spec, requant_mode)

    return _pass
