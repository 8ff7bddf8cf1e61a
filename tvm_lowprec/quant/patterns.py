"""Read-only matchers over Relax dataflow: is this expression a dequantize of a constant, a matmul ...

Each matcher takes an expression and a ``lookup(var) -> bound expr`` and returns a small frozen record
or ``None``. The rewrite passes combine them; nothing here edits IR.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

from ..errors import QuantizationParameterError

_OPS = {}


def op(name: str):
    if name not in _OPS:
        _OPS[name] = tvm.ir.Op.get(name)
    return _OPS[name]


def call_of(expr, name: str, lookup):
    """The call producing ``expr`` if it is a call to ``relax.<name>``, else None (follows one var)."""
    if isinstance(expr, relax.Var):
        expr = lookup(expr)
    if isinstance(expr, relax.Call) and expr.op.same_as(op("relax." + name)):
        return expr
    return None


_FOLDABLE = {"relax.multiply": np.multiply, "relax.divide": np.divide}


def first_call(expr, names, lookup):
    """The call producing ``expr`` if it is a call to any of ``relax.<name>`` for ``names``, else None."""
    for name in names:
        call = call_of(expr, name, lookup)
        if call is not None:
            return call
    return None


def constant(expr, lookup=None) -> np.ndarray | None:
    """The value of a constant, also through a var binding and constant ``multiply``/``divide``
    (an importer's ``x_scale * w_scale``, folded later by FoldConstant)."""
    if lookup is not None and isinstance(expr, relax.Var):
        bound = lookup(expr)
        if bound is not None:
            expr = bound
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in _FOLDABLE and lookup is not None:
        values = [constant(a, lookup) for a in expr.args]
        if all(v is not None for v in values):
            return _FOLDABLE[expr.op.name](*values).astype(values[0].dtype)
    return None


def static_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    shape = getattr(ty, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


def gemm_input_shape(expr) -> tuple | None:
    """The shape of a GEMM activation ``[.., K]`` as ints and TIR expressions (its rows may be known at
    run time only), or None where it has no shape or its last axis, K, is not a constant."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or len(shape) < 1 or not isinstance(shape[-1], tvm.tirx.IntImm):
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in shape)


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


@dataclass(frozen=True)
class QParams:
    scale: np.ndarray  # float32, scalar () or per-axis [C]
    zero_point: np.ndarray  # int, same shape
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1


def qparams(call, lookup, what: str) -> QParams | None:
    """Constant scale/zero point of a quantize/dequantize call; bad values raise with ``what`` named."""
    scale = constant(call.args[1], lookup)
    zp = constant(call.args[2], lookup)
    if scale is None or zp is None:
        return None
    scale = np.asarray(scale, np.float32)
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise QuantizationParameterError(
            f"{what}: scale must be finite and positive, got {scale.ravel()[:8].tolist()}"
        )
    if scale.size == 1:
        scale = scale.reshape(())
    if zp.size == 1:
        zp = zp.reshape(())
    return QParams(scale, np.asarray(zp), int(call.attrs.axis))


@dataclass(frozen=True)
class DequantizedInput:
    """``dequantize(x)`` of a runtime tensor with per-tensor parameters."""

    data: relax.Expr
    params: QParams


def dequantized_activation(expr, lookup) -> DequantizedInput | None:
    dq = call_of(expr, "dequantize", lookup)
    if dq is None or dtype_of(dq.args[0]) not in ("uint8", "int8"):
        return None
    p = qparams(dq, lookup, "activation dequantize")
    if p is None or not p.per_tensor:
        return None
    return DequantizedInput(dq.args[0], p)


@dataclass(frozen=True)
class ConstWeight:
    """A constant weight as ``[K, N]`` integers with scales and zero points per column (or scalar)."""

    values: np.ndarray  # [K, N] int8 or uint8
    scale: np.ndarray  # () or [N]
    zero_point: np.ndarray  # () or [N]


def _per_column(p: QParams, values_shape, col_axis: int) -> bool:
    return p.per_tensor or (p.axis % len(values_shape) == col_axis and p.scale.shape == (values_shape[col_axis],))


def _dequantized_constant(expr, lookup, ndim: int, what: str):
    """(8-bit constant of rank ``ndim``, its constant QParams) under a dequantize, or (None, None)."""
    dq = call_of(expr, "dequantize", lookup)
    if dq is None:
        return None, None
    w = constant(dq.args[0], lookup)
    if w is None or w.ndim != ndim or w.dtype not in (np.int8, np.uint8):
        return None, None
    p = qparams(dq, lookup, what)
    return (w, p) if p is not None else (None, None)


def dequantized_weight(expr, lookup) -> ConstWeight | None:
    """``dequantize(W)`` or ``permute_dims(dequantize(W))`` with W a 2-D integer constant."""
    transposed = False
    perm = call_of(expr, "permute_dims", lookup)
    if perm is not None:
        axes = perm.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return None
        transposed, expr = True, perm.args[0]
    w, p = _dequantized_constant(expr, lookup, 2, "weight dequantize")
    if w is None:
        return None
    col_axis = 0 if transposed else 1
    if not _per_column(p, w.shape, col_axis):
        return None  # a per-row (K-axis) weight scale cannot be applied after the dot product
    if transposed:
        w = np.ascontiguousarray(w.T)
    return ConstWeight(w, p.scale, p.zero_point)


def dequantized_conv_weight(expr, lookup) -> ConstWeight | None:
    """``dequantize(W)`` with W a constant ``[OC, C, KH, KW]`` -> GEMM weights (:func:`conv_weight_matrix`)."""
    w, p = _dequantized_constant(expr, lookup, 4, "convolution weight dequantize")
    if w is None or not _per_column(p, w.shape, 0):
        return None
    return ConstWeight(conv_weight_matrix(w), p.scale, p.zero_point)


def conv_weight_matrix(w: np.ndarray) -> np.ndarray:
    """OIHW weights -> ``[KH*KW*C, OC]``: the row order of the NHWC im2col columns (kh, kw, c)."""
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0]))


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-D NCHW/OIHW convolution as the im2col GEMM sees it (the GEMM itself runs on NHWC
    activations: rows ``(b, oh, ow)``, depth ``(kh, kw, c)`` over one group's channels): one group, a
    depthwise one (one filter per channel, ``groups == channels == output channels``), or a grouped one
    (``groups`` GEMMs side by side, each over ``channels / groups`` input channels and writing
    ``out_channels / groups`` outputs: RegNet, ResNeXt, a depthwise convolution with a channel
    multiplier)."""

    batch: int
    channels: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int = 1
    out_channels: int = 0  # 0: not recorded (one group, or depthwise: the input's channels)

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.channels and self.out_channels in (0, self.channels)

    @property
    def multiplier(self) -> int:
        """``m`` for a depthwise convolution with ``m > 1`` filters per input channel (one group per
        channel, ``m * channels`` outputs), else 0."""
        if self.groups != self.channels or self.channels < 2 or self.out_channels <= self.channels:
            return 0
        return self.out_channels // self.channels if self.out_channels % self.channels == 0 else 0

    @property
    def grouped(self) -> bool:
        """More than one group and not depthwise: a batch of GEMMs, one per group."""
        return self.groups > 1 and not self.depthwise

    @property
    def group_channels(self) -> int:
        return self.channels // self.groups

    @property
    def rows(self) -> int:
        return self.batch * self.out_hw[0] * self.out_hw[1]

    @property
    def depth(self) -> int:
        """One group's GEMM depth: ``kh * kw * channels / groups``."""
        return self.group_channels * self.kernel[0] * self.kernel[1]

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: the NHWC input already is the GEMM operand (no im2col)."""
        return self.kernel == (1, 1) and self.strides == (1, 1) and not any(self.padding)


def _live_taps(out_n: int, in_n: int, kernel: int, stride: int, dilation: int, pad: int) -> tuple[int, int]:
    """``(first, last)`` kernel taps along one axis that read at least one input element for some
    output (the others read only padding); ``(0, -1)`` where none does."""
    live = [t for t in range(kernel) if any(0 <= o * stride + t * dilation - pad < in_n for o in range(out_n))]
    return (live[0], live[-1]) if live else (0, -1)


def trim_dead_taps(g: ConvGeometry, weight: ConstWeight) -> tuple[ConvGeometry, ConstWeight]:
    """Drop the kernel taps that read only padding for every output (an atrous convolution whose
    dilation passes the feature map: DeepLab's ASPP rates 12/24/36 on a 10x10 map leave the centre
    tap alone, K 8640 -> 960): each such tap reads the zero point, so ``(a - za) * (w - zw)`` is 0 and
    the result is the same integers. Returns the smaller convolution (its padding shifted by the
    dropped taps) and its weight rows; the inputs as they are where every tap is live or the live taps
    are not a sub-window of whole rows and columns of taps."""
    top, left, bottom, right = g.padding
    (kh0, kh1), (kw0, kw1) = (_live_taps(g.out_hw[i], g.in_hw[i], g.kernel[i], g.strides[i], g.dilation[i], pad)
                              for i, pad in ((0, top), (1, left)))
    kh, kw = kh1 - kh0 + 1, kw1 - kw0 + 1
    if (kh, kw) == tuple(g.kernel) or kh < 1 or kw < 1:
        return g, weight
    new_top, new_left = top - kh0 * g.dilation[0], left - kw0 * g.dilation[1]
    if new_top < 0 or new_left < 0:
        return g, weight

    def far_pad(i, near, k):  # enough padding after the input for the last output's last live tap
        return max(0, (g.out_hw[i] - 1) * g.strides[i] + (k - 1) * g.dilation[i] + 1 - g.in_hw[i] - near)

    trimmed = replace(g, kernel=(kh, kw), padding=(new_top, new_left, far_pad(0, new_top, kh), far_pad(1, new_left, kw)))
    rows = weight.values.reshape(*g.kernel, g.group_channels, -1)[kh0:kh1 + 1, kw0:kw1 + 1]
    return trimmed, replace(weight, values=np.ascontiguousarray(rows.reshape(trimmed.depth, -1)))


def conv_geometry(conv, grouped: bool = False) -> ConvGeometry | None:
    """The geometry of a static NCHW/OIHW ``relax.nn.conv2d``: one group or depthwise, and with
    ``grouped`` any group count (the callers that build a grouped kernel ask for it); else None."""
    attrs = conv.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return None
    x_shape, w_shape, y_shape = static_shape(conv.args[0]), static_shape(conv.args[1]), static_shape(conv)
    if x_shape is None or w_shape is None or y_shape is None or len(x_shape) != 4:
        return None
    groups = int(attrs.groups)
    depthwise = groups == x_shape[1] == w_shape[0] and w_shape[1] == 1
    if groups != 1 and not depthwise and not (grouped and x_shape[1] % groups == 0 and w_shape[0] % groups == 0):
        return None  # grouped, or depthwise with a channel multiplier, where the caller has no grouped kernel
    return ConvGeometry(
        batch=x_shape[0],
        channels=x_shape[1],
        in_hw=(x_shape[2], x_shape[3]),
        out_hw=(y_shape[2], y_shape[3]),
        kernel=(w_shape[2], w_shape[3]),
        strides=tuple(int(s) for s in attrs.strides),
        padding=_padding(attrs),
        dilation=tuple(int(d) for d in attrs.dilation),
        groups=groups,
        out_channels=w_shape[0],
    )


def _padding(attrs) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from a conv's ``padding`` (2 values mean symmetric)."""
    pad = [int(p) for p in attrs.padding]
    return tuple(pad * 2 if len(pad) == 2 else pad)


def mutate_relax_functions(mod, mutator):
    """Run ``mutator`` (a PyExprMutator built on ``mod``) over every Relax function; the new module.
    A mutator that keeps an ``error`` (a LowPrecError it caught, which the C++ visitor would turn
    into a RuntimeError) has it raised here, unwrapped, after the function where it happened."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
            if getattr(mutator, "error", None) is not None:
                raise mutator.error
    return mutator.builder_.get()


def use_counts(func) -> dict:
    """var -> the number of binding values (and the function's result) of ``func`` that read it."""
    counts: dict = {}
    values = [b.value for block in func.body.blocks for b in block.bindings] + [func.body.body]
    for value in values:
        for var in relax.analysis.free_vars(value):
            counts[var] = counts.get(var, 0) + 1
    return counts


def is_scalar_constant(expr) -> bool:
    """A constant tensor of one element (a per-tensor scale or zero point, a literal operand)."""
    shape = static_shape(expr) if isinstance(expr, tvm.ir.expr.Constant) else None
    return shape is not None and int(np.prod(shape)) == 1


def reads_an_input(expr, lookup) -> bool:
    """Whether ``expr`` depends on a parameter of the function (not on constants and shapes alone).
    A worklist over producers: its depth does not grow with the graph's."""
    seen, todo = set(), [expr]
    while todo:
        expr = todo.pop()
        if isinstance(expr, relax.Var):
            if expr in seen:
                continue
            seen.add(expr)
            bound = lookup(expr)
            if bound is None:
                return True
            todo.append(bound)
        elif isinstance(expr, relax.Tuple):
            todo.extend(expr.fields)
        elif isinstance(expr, relax.TupleGetItem):
            todo.append(expr.tuple_value)
        elif isinstance(expr, relax.Call):
            todo.extend(expr.args)
    return False


def bindings(func) -> list:
    """The var bindings of a Relax function's body, in order."""
    return [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]


@dataclass(frozen=True)
class DeconvGeometry:
    """A 2-D NCHW/IOHW transposed convolution with one group. Input pixel ``(ih, iw)`` and kernel tap
    ``(kh, kw)`` add to output pixel ``(ih * sh - top + kh * dh, iw * sw - left + kw * dw)``; as a GEMM,
    rows ``(b, ih, iw)`` (the NHWC input), depth ``C_in``, columns ``(kh, kw, C_out)``, then a col2im
    that sums each output pixel's taps."""

    batch: int
    in_channels: int
    out_channels: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]

    @property
    def rows(self) -> int:
        return self.batch * self.in_hw[0] * self.in_hw[1]

    @property
    def columns(self) -> int:
        return self.kernel[0] * self.kernel[1] * self.out_channels


def deconv_geometry(call) -> DeconvGeometry | None:
    attrs = call.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "IOHW" or int(attrs.groups) != 1:
        return None
    x_shape, w_shape, y_shape = static_shape(call.args[0]), static_shape(call.args[1]), static_shape(call)
    if x_shape is None or w_shape is None or y_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    return DeconvGeometry(
        batch=x_shape[0],
        in_channels=x_shape[1],
        out_channels=w_shape[1],
        in_hw=(x_shape[2], x_shape[3]),
        out_hw=(y_shape[2], y_shape[3]),
        kernel=(w_shape[2], w_shape[3]),
        strides=tuple(int(s) for s in attrs.strides),
        padding=_padding(attrs),
        dilation=tuple(int(d) for d in attrs.dilation),
    )


def deconv_weight_matrix(w: np.ndarray) -> np.ndarray:
    """IOHW weights ``[C_in, C_out, KH, KW]`` -> ``[C_in, KH*KW*C_out]``, columns in ``(kh, kw, c_out)`` order."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


def dequantized_deconv_weight(expr, lookup) -> tuple[ConstWeight, QParams] | tuple[None, None]:
    """``dequantize(W)`` with W a constant IOHW ``[C_in, C_out, KH, KW]``, scales per tensor or per
    output channel (axis 1) -> (GEMM weights with per-column scales and zero points, the QParams)."""
    w, p = _dequantized_constant(expr, lookup, 4, "transposed convolution weight dequantize")
    if w is None or not _per_column(p, w.shape, 1):
        return None, None
    taps = w.shape[2] * w.shape[3]

    def per_column(v):
        return v if p.per_tensor else np.tile(np.asarray(v).reshape(-1), taps)

    return ConstWeight(deconv_weight_matrix(w), per_column(p.scale), per_column(p.zero_point)), p
