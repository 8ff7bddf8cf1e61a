"""Converters for ONNX operators that TVM 0.27's Relax importer lacks, in its own converter form.

``Clip`` with constant bounds becomes ``relax.op.clip`` (below); ``Celu`` and ``Swish`` (opset 24), which the
importer lacks, become their element-wise formulas. ``ConvInteger`` is an int32 convolution of zero-point-shifted 8-bit operands; it has no float
equivalent in ONNX (a float Conv loses exactness past 2**24), so it is converted here, into the same
``astype -> subtract -> conv2d`` shape that ``MatMulInteger`` takes, which the integer rewrite matches.
ONNX Runtime's decoder operators as its GenAI model builder writes them (``SimplifiedLayerNormalization``,
``com.microsoft.SkipSimplifiedLayerNormalization`` and ``RotaryEmbedding``) become Relax's RMS norm and
the rotary formula. The importer is given these converters only for the duration of :func:`tvm_lowprec.from_onnx`.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm_onnx
from tvm.sym import Analyzer, ConstIntBound

from ..errors import UnsupportedOperatorError
from .narrow_types import ROUND_TO
from ..quant.dequantized import block_at, emit_blocked_dequantize


def _widen(bb, x, zero_point, channel_axis_shape=None):
    x = relax.op.astype(x, "int32")
    if zero_point is None:
        return x
    zp = bb.normalize(relax.op.astype(zero_point, "int32"))
    if channel_axis_shape is not None and len(zp.ty.shape) == 1:
        zp = relax.op.reshape(zp, channel_axis_shape)  # per-output-channel weight zero point
    elif len(zp.ty.shape) == 1:
        zp = relax.op.reshape(zp, ())
    return relax.op.subtract(x, zp)


class ConvInteger(_tvm_onnx.OnnxOpConverter):
    """``y = conv(x - x_zero_point, w - w_zero_point)`` in int32 (ONNX ConvInteger-10)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w = inputs[0], inputs[1]
        x_zp = inputs[2] if len(inputs) > 2 else None
        w_zp = inputs[3] if len(inputs) > 3 else None
        out_channels = int(w.ty.shape[0])
        ndim = len(w.ty.shape)
        x32 = bb.normalize(_widen(bb, x, x_zp))
        w32 = bb.normalize(_widen(bb, w, w_zp, (out_channels,) + (1,) * (ndim - 1)))
        return _tvm_onnx.Conv._impl_v11(bb, [x32, w32, None], dict(attr), params)


def _scalar_bound(expr):
    """The float value of a constant scalar Clip bound, or None (absent, non-constant, NaN)."""
    import numpy as np
    import tvm

    if expr is None or not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = expr.value.numpy()
    if value.size != 1 or np.isnan(value.reshape(())):
        return None
    return float(value.reshape(()))


class Pad(_tvm_onnx.Pad):
    """A constant-mode Pad with constant pads and value as ``relax.op.nn.pad`` (TVM's importer emits a
    ``call_tir`` of TE's pad, which no pass can read): the layout pass then carries NHWC through it and
    the Q/DQ fold pads the codes (HGNetV2's stem pads before a max pool). Other modes: TVM's form."""

    @classmethod
    def _relax_pad(cls, bb, inputs, attr, params, fallback):
        if attr.get("mode", b"constant").decode("utf-8") == "constant":
            try:
                before, after, value = cls._parse_pads_and_axes(inputs, params)
            except ValueError:  # run-time pads or axes: TVM's converter says so
                return fallback(bb, inputs, attr, params)
            return relax.op.nn.pad(inputs[0], [int(v) for pair in zip(before, after) for v in pair], "constant", float(value))
        return fallback(bb, inputs, attr, params)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return cls._relax_pad(bb, inputs, attr, params, super()._impl_v11)

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        return cls._relax_pad(bb, inputs, attr, params, super()._impl_v18)

    @classmethod
    def _impl_v19(cls, bb, inputs, attr, params):
        return cls._relax_pad(bb, inputs, attr, params, super()._impl_v19)


class Clip(_tvm_onnx.Clip):
    """Clip with constant bounds as ``relax.op.clip`` (TVM's importer emits two ``call_tir`` of TE
    maximum/minimum, which no pass can read): the integer rewrite then folds it into the kernel's
    output range, and calibration sees it as the layer's activation."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        lo, hi = float(attr.get("min", float("-inf"))), float(attr.get("max", float("inf")))
        return relax.op.clip(inputs[0], lo, hi)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        given = [inputs[i] if len(inputs) > i else None for i in (1, 2)]
        bounds = [_scalar_bound(b) for b in given]
        if any(g is not None and b is None for g, b in zip(given, bounds)):
            return super()._impl_v13(bb, inputs, attr, params)  # run-time or NaN bounds: TVM's form
        lo = bounds[0] if bounds[0] is not None else float("-inf")
        hi = bounds[1] if bounds[1] is not None else float("inf")
        return relax.op.clip(inputs[0], lo, hi)


def _float8_of(*exprs):
    """The :class:`~tvm_lowprec.quant.float8.Float8Format` of the first expression with a float8
    dtype, or None."""
    from ..quant.float8 import FORMATS

    for expr in exprs:
        if expr is not None and str(expr.ty.dtype) in FORMATS:
            return FORMATS[str(expr.ty.dtype)]
    return None


def _per_axis(bb, param, ndim: int, axis: int):
    """A per-tensor parameter as a scalar, a 1-D per-axis one shaped to broadcast along ``axis``."""
    if param is None or len(param.ty.shape) == 0 or ndim == 0:
        return param
    if len(param.ty.shape) == 1 and int(param.ty.shape[0]) == 1:
        return bb.normalize(relax.op.reshape(param, ()))
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return bb.normalize(relax.op.reshape(param, shape))


def _broadcast_at(t, index):
    """``t`` at the trailing dimensions of ``index`` (a scalar, or a parameter shaped by
    :func:`_per_axis` to broadcast against the input: its dimensions of size 1 read index 0)."""
    trailing = index[len(index) - len(t.shape):]
    return t[tuple(0 if int(size) == 1 else i for size, i in zip(t.shape, trailing))]


def _float8_first(cls, inherited):
    """A converter that takes the blocked form (``cls._blocked``: ``block_size`` > 0) or the float8
    form (``cls._float8``) where they apply, else TVM's own converter for the model's opset."""

    def convert(bb, inputs, attr, params):
        converted = cls._blocked(bb, inputs, attr) if int(attr.get("block_size", 0)) > 0 else None
        converted = cls._float8(bb, inputs, attr) if converted is None else converted
        return inherited(bb, inputs, attr, params) if converted is None else converted

    return convert




def _check_blocked(x, param, axis: int, block: int, what: str):
    xs, ps = [int(d) for d in x.ty.shape], [int(d) for d in param.ty.shape]
    want = [-(-d // block) if i == axis else d for i, d in enumerate(xs)]
    if ps != want:
        raise ValueError(f"blocked {what}: shape {ps} does not match input {xs} with block_size {block} on axis "
                         f"{axis} (expected {want})")


class QuantizeLinear(_tvm_onnx.QuantizeLinear):
    """Float8 outputs (``float8e4m3fn``, ``float8e5m2``) by the formats' own rounding and ``saturate``
    (:mod:`tvm_lowprec.quant.float8`: TVM's float8 cast is wrong outside the normal range); ONNX's
    reference ignores a float8 zero point here, and so does this. Integer types: TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        return _float8_first(cls, super().get_converter(opset))

    @classmethod
    def _blocked(cls, bb, inputs, attr):
        """Blocked quantization (opset 21): each ``block_size`` run along ``axis`` has its own scale and
        zero point; ``rint(x / scale) + zero_point`` in float32, saturated to the output type."""
        import numpy as np
        from onnx import helper
        from tvm import te, tirx

        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        if zp is not None:
            out_dtype = str(zp.ty.dtype)
        else:
            code = attr.get("output_dtype")
            out_dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))) if code else "uint8"
        if out_dtype not in ("uint8", "int8", "uint16", "int16"):
            raise UnsupportedOperatorError(f"QuantizeLinear with block_size and a {out_dtype} output is not supported yet")
        axis, block = int(attr.get("axis", 1)) % len(x.ty.shape), int(attr["block_size"])
        for name, param in (("scale", scale), ("zero point", zp)):
            if param is not None:
                _check_blocked(x, param, axis, block, name)
        info = np.iinfo(out_dtype)

        def compute(x, scale, *zp):
            def element(*i):
                q = tirx.round(x[i].astype("float32") / block_at(scale, i, axis, block).astype("float32"))
                if zp:
                    q = q + block_at(zp[0], i, axis, block).astype("float32")
                return tirx.max(tirx.min(q, float(info.max)), float(info.min)).astype(out_dtype)

            return te.compute(x.shape, element, name="quantize_blocked")

        return bb.emit_te(compute, x, scale, *([zp] if zp is not None else []))

    @classmethod
    def _float8(cls, bb, inputs, attr):
        from tvm import te, tirx

        from ..quant.float8 import FORMATS, encode

        zp = inputs[2] if len(inputs) > 2 else None
        fmt = _float8_of(zp)
        output_dtype = attr.get("output_dtype")
        if fmt is None and output_dtype is not None:
            from onnx import helper

            fmt = FORMATS.get(str(helper.tensor_dtype_to_np_dtype(int(output_dtype))))
        if fmt is None:
            return None
        x, ndim = inputs[0], len(inputs[0].ty.shape)
        axis = int(attr.get("axis", 1))
        scale = _per_axis(bb, inputs[1], ndim, axis)
        saturate = bool(attr.get("saturate", 1))
        round_to = attr.get(ROUND_TO)
        if round_to is not None:  # float4 carried as float8 (narrow_types): its grid, then the carrier
            return cls._float4(bb, x, scale, _per_axis(bb, zp, ndim, axis), fmt)

        def compute(x, scale):
            def element(*i):
                s = _broadcast_at(scale, i).astype("float32")
                return tirx.reinterpret(fmt.name, encode(x[i].astype("float32") / s, fmt, saturate))

            return te.compute(x.shape, element, name="quantize_float8")

        return bb.emit_te(compute, x, scale)

    @classmethod
    def _float4(cls, bb, x, scale, zp, carrier):
        """ONNX's float4 e2m1 QuantizeLinear, ``float4(x / scale + zero_point)`` (the zero point is added,
        unlike float8's), rounded to nearest even and saturated to +-6, stored as the ``carrier`` code of
        that value (exact: e4m3fn holds every float4 value)."""
        from tvm import te, tirx

        from ..quant.float8 import E2M1, decode, encode

        if carrier.name != "float8_e4m3fn":
            raise UnsupportedOperatorError(f"float4 carried as {carrier.name}: only float8_e4m3fn is")

        def compute(x, scale, *zp):
            def element(*i):
                v = x[i].astype("float32") / _broadcast_at(scale, i).astype("float32")
                if zp:
                    v = v + decode(tirx.reinterpret("uint8", _broadcast_at(zp[0], i)), carrier)
                # the float4 code, bound once (the conversions nested as plain expressions repeat it
                # in every use: TVM then took minutes on 12 elements), then its e4m3fn code: 0, 0.5 =
                # 0x30, and from 1.0 = 0x38 up, 4 per float4 step (0x3C 1.5, 0x40 2, ..., 0x4C 6)
                c = tirx.Var("float4_code", "uint8")
                m = c & tirx.const(7, "uint8")
                mag = tirx.Select(m >= tirx.const(2, "uint8"), (m - tirx.const(2, "uint8")) * tirx.const(4, "uint8")
                                  + tirx.const(0x38, "uint8"),
                                  tirx.Select(m == tirx.const(1, "uint8"), tirx.const(0x30, "uint8"), tirx.const(0, "uint8")))
                byte = ((c & tirx.const(8, "uint8")) << tirx.const(4, "uint8")) | mag
                return tirx.reinterpret(carrier.name, tirx.Let(c, encode(v, E2M1), byte))

            return te.compute(x.shape, element, name="quantize_float4")

        return bb.emit_te(compute, x, scale, *([zp] if zp is not None else []))


class DequantizeLinear(_tvm_onnx.DequantizeLinear):
    """Float8 inputs decoded exactly (:mod:`tvm_lowprec.quant.float8`), then ``(x - zero_point) *
    scale`` in the scale's dtype, as ONNX's reference computes it. Integer types: TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        return _float8_first(cls, super().get_converter(opset))

    @classmethod
    def _blocked(cls, bb, inputs, attr):
        """Blocked dequantization (opset 21): ``(x - zero_point) * scale`` per block, in float32 (the
        scale's dtype), as ONNX's reference computes it; marked for the weight-only rewrite
        (:mod:`tvm_lowprec.quant.dequantized`)."""
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        if _float8_of(x) is not None:
            raise UnsupportedOperatorError("DequantizeLinear with block_size and a float8 input is not supported yet")
        axis, block = int(attr.get("axis", 1)) % len(x.ty.shape), int(attr["block_size"])
        for name, param in (("scale", scale), ("zero point", zp)):
            if param is not None:
                _check_blocked(x, param, axis, block, name)
        return emit_blocked_dequantize(bb, x, scale, zp, axis, block)

    @classmethod
    def _float8(cls, bb, inputs, attr):
        from tvm import te, tirx

        from ..quant.dequantized import ATTR
        from ..quant.float8 import decode

        x = inputs[0]
        fmt = _float8_of(x)
        if fmt is None:
            return None
        ndim, axis = len(x.ty.shape), int(attr.get("axis", 1))
        scale = _per_axis(bb, inputs[1], ndim, axis)
        zp = _per_axis(bb, inputs[2] if len(inputs) > 2 else None, ndim, axis)
        out_dtype = str(inputs[1].ty.dtype)

        def value(t, i):
            return decode(tirx.reinterpret("uint8", _broadcast_at(t, i)), fmt)

        def compute(x, scale, *zp):
            def element(*i):
                v = value(x, i) - value(zp[0], i) if zp else value(x, i)
                return (v * _broadcast_at(scale, i).astype("float32")).astype(out_dtype)

            return te.compute(x.shape, element, name="dequantize_float8")

        # marked, so that the weight-only rewrite can keep a constant float8 weight narrow
        attrs = {ATTR: {"kind": "float8", "format": fmt.name, "axis": axis % ndim if ndim else 0}}
        return bb.emit_te(compute, x, scale, *([zp] if zp is not None else []), primfunc_attrs=attrs,
                          primfunc_name_hint="dequantize_float8")


class Celu(_tvm_onnx.OnnxOpConverter):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (ONNX Celu-12), element-wise Relax ops, so a
    quantized Celu becomes one table (:mod:`tvm_lowprec.quant.lookup_tables`)."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        alpha = relax.const(float(attr.get("alpha", 1.0)), dtype)
        zero, one = relax.const(0.0, dtype), relax.const(1.0, dtype)
        negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)), one))
        return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(zero, negative))


class Swish(_tvm_onnx.OnnxOpConverter):
    """``x * sigmoid(alpha * x)`` (ONNX Swish-24)."""

    @classmethod
    def _impl_v24(cls, bb, inputs, attr, params):
        x = inputs[0]
        alpha = relax.const(float(attr.get("alpha", 1.0)), str(x.ty.dtype))
        return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(alpha, x)))


def _rms_axes(x, axis: int) -> list[int]:
    ndim = len(x.ty.shape)
    return list(range(axis % ndim, ndim))


class SimplifiedLayerNormalization(_tvm_onnx.OnnxOpConverter):
    """ONNX Runtime's RMS norm (contrib, the ONNX domain): ``x / sqrt(mean(x^2, axis..-1) + epsilon) * scale``
    (``relax.op.nn.rms_norm``), as ORT GenAI's builder writes every decoder norm. The optional second output
    (the inverse standard deviation) is not produced."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, scale = inputs[0], inputs[1]
        axes = _rms_axes(x, int(attr.get("axis", -1)))
        out = relax.op.nn.rms_norm(x, scale, axes=axes, epsilon=float(attr.get("epsilon", 1e-5)))
        return relax.Tuple([out, relax.const(0.0, str(x.ty.dtype))])


class SkipSimplifiedLayerNormalization(_tvm_onnx.OnnxOpConverter):
    """ONNX Runtime's ``com.microsoft.SkipSimplifiedLayerNormalization``: ``s = input + skip (+ bias)``, the
    RMS norm of ``s`` over the last axis times ``gamma``; outputs (output, mean, inv_std_var,
    input_skip_bias_sum), of which the first and the last (the residual ORT GenAI's builder passes on) are
    produced."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        bias = inputs[3] if len(inputs) > 3 else None
        total = bb.normalize(relax.op.add(x, skip))
        if bias is not None:
            total = bb.normalize(relax.op.add(total, bias))
        out = relax.op.nn.rms_norm(total, gamma, axes=[-1], epsilon=float(attr.get("epsilon", 1e-5)))
        unused = relax.const(0.0, str(x.ty.dtype))
        return relax.Tuple([out, unused, unused, total])


def _last_slice(bb, x, begin: int, end: int):
    return bb.normalize(relax.op.strided_slice(x, axes=[len(x.ty.shape) - 1], begin=[begin], end=[end]))


def _rotate(bb, xh, cos, sin, rotary: int, interleaved: int):
    """Rotary embedding of ``xh`` (heads on the second-to-last axis, the head last) by ``cos``/``sin``
    (broadcast over the heads, ``rotary / 2`` wide): pairs ``(x1, x2)`` of the first ``rotary`` values,
    halves or neighbours, become ``(x1 cos - x2 sin, x2 cos + x1 sin)``; the rest of the head is kept."""
    heads_shape = [_dim(d) for d in xh.ty.shape]  # a symbolic length where the call's tokens are
    head, half = int(heads_shape[-1]), rotary // 2
    rotated = _last_slice(bb, xh, 0, rotary) if rotary < head else xh
    if interleaved:
        pairs = bb.normalize(relax.op.reshape(rotated, (*heads_shape[:-1], half, 2)))
        x1 = bb.normalize(relax.op.reshape(_last_slice(bb, pairs, 0, 1), (*heads_shape[:-1], half)))
        x2 = bb.normalize(relax.op.reshape(_last_slice(bb, pairs, 1, 2), (*heads_shape[:-1], half)))
    else:
        x1, x2 = _last_slice(bb, rotated, 0, half), _last_slice(bb, rotated, half, rotary)
    first = relax.op.subtract(relax.op.multiply(x1, cos), relax.op.multiply(x2, sin))
    second = relax.op.add(relax.op.multiply(x2, cos), relax.op.multiply(x1, sin))
    if interleaved:
        both = relax.op.concat([relax.op.expand_dims(first, -1), relax.op.expand_dims(second, -1)], axis=-1)
        out = relax.op.reshape(both, (*heads_shape[:-1], rotary))
    else:
        out = relax.op.concat([first, second], axis=-1)
    if rotary < head:
        out = relax.op.concat([out, _last_slice(bb, xh, rotary, head)], axis=-1)
    return bb.normalize(out)


def _dim(d):
    """A dimension of a Relax shape: an int where it is constant, else the TIR expression."""
    return int(d) if isinstance(d, tvm.tirx.IntImm) else d


def _count_tensor(bb, value, dtype="int64"):
    """A constant or symbolic count as a one-element tensor (``[1]``) of ``dtype``."""
    if isinstance(value, int):
        return relax.const(np.array([value], dtype), dtype)
    return bb.normalize(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([value])), dtype))


def _count_scalar(bb, value, dtype="int64"):
    """A symbolic count as a 0-d tensor of ``dtype`` (:func:`_count_tensor` without its axis)."""
    return bb.normalize(relax.op.reshape(_count_tensor(bb, value, dtype), ()))


def _uncast_integer(value):
    """``value`` without a cast of an integer expression to another type (a dimension read by ``Shape`` and
    cast to float: exact below 2**24, so the integer stands for it)."""
    if isinstance(value, tvm.tirx.Cast) and "int" in str(value.value.ty):
        return value.value
    return value


def _gathered_angles(bb, cache, positions, view):
    """``cache[positions]`` (``[.., half]``) reshaped to ``view``, to broadcast over the heads."""
    return bb.normalize(relax.op.reshape(relax.op.take(cache, positions, axis=0), view))


def _integer_scalar(value):
    """An integer-valued scalar of a ``Range``: an int, or an integer TIR expression (a dimension read by
    ``Shape``/``Gather``, possibly cast to float: exact below 2**24, so the integer is used); None where
    it is neither (a float value, a tensor computed at run time)."""
    if isinstance(value, tvm.ir.GenericConst):
        array = value.value.numpy()
        return int(array.item()) if array.size == 1 and float(array.item()).is_integer() else None
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return int(value.value) if float(value.value).is_integer() else None
    value = _uncast_integer(value)  # a dimension cast to float for a float Range
    if tvm.ir.is_prim_expr(value) and "int" in str(value.ty):
        return value.astype("int64")
    return None


class Range(_tvm_onnx.Range):
    """ONNX ``Range`` whose bounds are dimensions (``torch.arange(seq)`` exports as ``Range(0,
    Cast(Gather(Shape(input_ids), 1)), 1)``): the length is the TIR expression ``ceil((limit - start) /
    delta)`` of the dimensions, so ``arange(seq)`` has the shape ``[seq]`` and broadcasts with the
    tensors that have ``seq`` rows. TVM's importer computes the length as a tensor and names it a new
    variable (``range_len_0``), unrelated to ``seq``: every product of the positions with a ``[.., seq,
    ..]`` tensor lost its shape. Constant bounds, or a step that is not a positive integer, go to TVM's
    converter."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        values = [_tvm_onnx.get_constant(x, params) for x in inputs]
        start, limit, delta = (_integer_scalar(v) for v in values)
        symbolic = any(tvm.ir.is_prim_expr(v) and not isinstance(v, tvm.tirx.IntImm) for v in (start, limit))
        if not symbolic or not isinstance(delta, int) or delta <= 0 or start is None or limit is None:
            return super()._impl_v12(bb, inputs, attr, params)
        dtype = str(values[0].ty.dtype) if isinstance(values[0], relax.Expr) else str(values[0].ty)
        count = tvm.tirx.floordiv(tvm.tirx.const(0, "int64") + limit - start + (delta - 1), delta)
        analyzer = Analyzer()
        for var in tvm.tirx.analysis.undefined_vars(count):  # dimensions: never negative
            analyzer.update(var, ConstIntBound(0, ConstIntBound.POS_INF))
        count = analyzer.simplify(count)
        if not analyzer.can_prove(count >= 0):
            count = tvm.tirx.max(count, tvm.tirx.const(0, "int64"))
        positions = relax.op.arange(0, count, 1, "int64")
        if delta != 1:
            positions = relax.op.multiply(positions, relax.const(delta, "int64"))
        if not (isinstance(start, int) and start == 0):
            offset = start if isinstance(start, int) else _count_scalar(bb, start)
            positions = relax.op.add(positions, relax.const(offset, "int64") if isinstance(offset, int) else offset)
        return bb.normalize(relax.op.astype(positions, dtype))


class RotaryEmbedding(_tvm_onnx.OnnxOpConverter):
    """ONNX Runtime's ``com.microsoft.RotaryEmbedding``: rotary position embedding of ``input`` (3-D
    ``[batch, seq, num_heads * head]`` with the ``num_heads`` attribute, or 4-D ``[batch, num_heads, seq,
    head]``), the angles' cosines and sines gathered from ``cos_cache`` / ``sin_cache`` (``[max_seq,
    rotary_dim / 2]``) at ``position_ids`` (``[batch, seq]``, or one start position ``[1]``): per pair
    ``(x1, x2)`` of the first ``rotary_embedding_dim`` (default: the whole head) values of a head,
    ``(x1 cos - x2 sin, x2 cos + x1 sin)``, the pairs being the two halves of that range, or neighbours where
    ``interleaved``; the rest of the head unchanged. Static shapes (``from_onnx`` fixes them)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, positions, cos_cache, sin_cache = inputs[:4]
        shape = [int(d) for d in x.ty.shape]
        if len(shape) == 3:
            heads = int(attr.get("num_heads", 0))
            if heads <= 0:
                raise UnsupportedOperatorError("RotaryEmbedding on a 3-D input needs its num_heads attribute")
            batch, seq, hidden = shape
            heads_shape, seq_axis = (batch, seq, heads, hidden // heads), 1
        elif len(shape) == 4:
            batch, heads, seq, _head = shape
            heads_shape, seq_axis = tuple(shape), 2
        else:
            raise UnsupportedOperatorError(f"RotaryEmbedding on a {len(shape)}-D input (3-D or 4-D are defined)")
        head = heads_shape[-1]
        rotary = int(attr.get("rotary_embedding_dim", 0)) or head
        half = rotary // 2
        if int(positions.ty.shape[0]) == 1 and len(positions.ty.shape) == 1:  # one start position
            steps = relax.op.arange(0, seq, 1, str(positions.ty.dtype))
            positions = bb.normalize(relax.op.add(relax.op.expand_dims(steps, 0), positions))
        lead = int(positions.ty.shape[0])
        view = (lead, seq, 1, half) if seq_axis == 1 else (lead, 1, seq, half)
        cos, sin = (_gathered_angles(bb, cache, positions, view) for cache in (cos_cache, sin_cache))
        xh = bb.normalize(relax.op.reshape(x, heads_shape))
        out = _rotate(bb, xh, cos, sin, rotary, int(attr.get("interleaved", 0)))
        return relax.op.reshape(out, shape)


# A GroupQueryAttention attribute of ours (set by tvm_lowprec.llm.cache_in_place, never by exporters):
# past_key/past_value are the whole cache of the maximum length, this call's keys and values are written
# into it at positions seqlens_k + 1 - seq ... (in place: relax.call_tir_inplace), and the outputs
# present_key/present_value are the cache itself (ORT's shared past/present buffer).
CACHE_IN_PLACE = "lowprec_cache_in_place"


def _cache_write(bb, cache, rows, start):
    """``cache`` [batch, kv_heads, length, head] with ``rows`` [batch, kv_heads, seq, head] written at
    ``start`` [batch] (int64), in place (:mod:`tvm_lowprec.kernels.kv_cache`)."""
    from ..kernels.kv_cache import OP, cache_write_kernel

    batch, heads, length, head = (int(d) for d in cache.ty.shape)
    seq, dtype = _dim(rows.ty.shape[2]), str(cache.ty.dtype)
    seq = seq if isinstance(seq, int) else None  # rows known at run time: the kernel's own variable
    kernel = bb.add_func(cache_write_kernel(batch, heads, length, seq, head, dtype),
                         f"{OP}_{dtype}_{batch}x{heads}x{length}x{head}_rows{seq or 'S'}")
    return bb.emit(relax.call_tir_inplace(kernel, [cache, rows, start], [0], relax.TensorType(cache.ty.shape, dtype)))


class GroupQueryAttention(_tvm_onnx.OnnxOpConverter):
    """ONNX Runtime's ``com.microsoft.GroupQueryAttention`` with separate past and present key/value
    tensors (what ORT GenAI's builder writes for CPU; the sequence and past lengths constant or symbolic):
    ``query`` ``[batch, seq, num_heads * head]`` (or Q, K and V packed in it when ``key`` is absent),
    ``key``/``value`` ``[batch, seq, kv_num_heads * head]``, ``past_key``/``past_value`` ``[batch,
    kv_num_heads, past, head]``, ``seqlens_k`` ``[batch]`` (total length - 1 per sequence),
    ``total_sequence_length``, and with ``do_rotary`` the ``cos_cache``/``sin_cache`` (positions from
    ``position_ids``, else ``seqlens_k + 1 - seq + i``). Outputs: the attention ``[batch, seq, num_heads *
    head]`` and ``present_key``/``present_value`` = the past with this step's (rotated) keys and values
    appended. Query ``i`` of a sequence sees the keys up to its own position (and, with
    ``local_window_size``, no further back than that window); ``softcap`` bounds the scores with
    ``softcap * tanh(score / softcap)``; each key/value head serves ``num_heads / kv_num_heads`` query
    heads; ``scale`` defaults to ``1 / sqrt(head)``. The past must hold exactly the steps before (``seqlens_k
    + 1 - seq`` of them, as separate past and present tensors have it); a shared past/present buffer of the
    maximum length is not this form. Declined (a named error): ``attention_bias``, ``head_sink``,
    ``smooth_softmax``."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        import numpy as np

        def arg(i):
            return inputs[i] if len(inputs) > i else None

        query, key, value, past_key, past_value, seqlens = (arg(i) for i in range(6))
        cos_cache, sin_cache, position_ids, bias = arg(7), arg(8), arg(9), arg(10)
        if bias is not None or arg(11) is not None or int(attr.get("smooth_softmax", 0)):
            raise UnsupportedOperatorError("GroupQueryAttention with attention_bias, head_sink or smooth_softmax "
                                           "has no converter")
        if "num_heads" not in attr or "kv_num_heads" not in attr:
            raise UnsupportedOperatorError("GroupQueryAttention needs its num_heads and kv_num_heads attributes")
        heads, kv_heads = int(attr["num_heads"]), int(attr["kv_num_heads"])
        batch, width = int(query.ty.shape[0]), int(query.ty.shape[2])
        seq = _dim(query.ty.shape[1])  # symbolic where the graph keeps the call's tokens so
        if key is None:  # Q, K and V packed along the last axis
            head = width // (heads + 2 * kv_heads)
            q = _last_slice(bb, query, 0, heads * head)
            key = _last_slice(bb, query, heads * head, (heads + kv_heads) * head)
            value = _last_slice(bb, query, (heads + kv_heads) * head, width)
        else:
            head, q = width // heads, query
        past = _dim(past_key.ty.shape[2]) if past_key is not None else 0
        f32 = str(query.ty.dtype)
        q = bb.normalize(relax.op.reshape(q, (batch, seq, heads, head)))
        k = bb.normalize(relax.op.reshape(key, (batch, seq, kv_heads, head)))
        v = bb.normalize(relax.op.reshape(value, (batch, seq, kv_heads, head)))
        # each query's position: seqlens_k + 1 - seq + i (the steps before it, then its place in this call)
        steps = relax.op.reshape(relax.op.arange(0, seq, 1, "int64"), (1, seq))
        start = bb.normalize(relax.op.subtract(relax.op.astype(seqlens, "int64"), _count_tensor(bb, seq - 1)))
        positions = bb.normalize(relax.op.add(relax.op.reshape(start, (batch, 1)), steps))  # [batch, seq]
        if int(attr.get("do_rotary", 0)):
            rotary = 2 * int(cos_cache.ty.shape[-1])
            at = positions if position_ids is None else bb.normalize(relax.op.astype(position_ids, "int64"))
            view = (int(at.ty.shape[0]), seq, 1, rotary // 2)
            cos, sin = (_gathered_angles(bb, c, at, view) for c in (cos_cache, sin_cache))
            interleaved = int(attr.get("rotary_interleaved", 0))
            q, k = _rotate(bb, q, cos, sin, rotary, interleaved), _rotate(bb, k, cos, sin, rotary, interleaved)
        k = bb.normalize(relax.op.permute_dims(k, [0, 2, 1, 3]))  # [batch, kv_heads, seq, head]
        v = bb.normalize(relax.op.permute_dims(v, [0, 2, 1, 3]))
        if int(attr.get(CACHE_IN_PLACE, 0)):  # the past is the whole cache: this call's rows written into it
            if past_key is None:
                raise UnsupportedOperatorError("GroupQueryAttention with its cache in place needs past_key/past_value")
            present_k, present_v = (_cache_write(bb, cache, rows, start) for cache, rows in ((past_key, k), (past_value, v)))
            total = past
        else:
            present_k = bb.normalize(relax.op.concat([past_key, k], axis=2)) if past_key is not None else k
            present_v = bb.normalize(relax.op.concat([past_value, v], axis=2)) if past_key is not None else v
            total = past + seq
        group = heads // kv_heads
        # query head h reads key/value head h // group: the queries as [batch, kv_heads, group, seq, head]
        # against the keys as [batch, kv_heads, 1, total, head] (broadcast by the matmul, not copied)
        qt = bb.normalize(relax.op.reshape(relax.op.permute_dims(q, [0, 2, 1, 3]), (batch, kv_heads, group, seq, head)))
        keys = bb.normalize(relax.op.reshape(present_k, (batch, kv_heads, 1, total, head)))
        values = bb.normalize(relax.op.reshape(present_v, (batch, kv_heads, 1, total, head)))
        scale = float(attr.get("scale", 0.0)) or 1.0 / float(np.sqrt(head))
        if isinstance(seq, int) and seq == 1:  # one query per head (a decode step): a product summed over head reads the keys once,
            # where the matmul would first copy the whole cache transposed
            dots = relax.op.sum(relax.op.multiply(qt, keys), axis=[-1])  # [batch, kv_heads, group, total]
            scores = relax.op.multiply(relax.op.reshape(dots, (batch, kv_heads, group, 1, total)),
                                       relax.const(np.float32(scale), f32))
        else:
            scores = relax.op.multiply(relax.op.matmul(qt, relax.op.permute_dims(keys, [0, 1, 2, 4, 3])),
                                       relax.const(np.float32(scale), f32))
        softcap = float(attr.get("softcap", 0.0))
        if softcap > 0:
            cap = relax.const(np.float32(softcap), f32)
            scores = relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap)
        key_at = relax.op.reshape(relax.op.arange(0, total, 1, "int64"), (1, 1, 1, 1, total))
        query_at = bb.normalize(relax.op.reshape(positions, (batch, 1, 1, seq, 1)))
        window = int(attr.get("local_window_size", -1))
        if window > 0:  # 0 <= query - key < window, as one unsigned compare (LLVM rejected the and of two masks)
            distance = relax.op.astype(relax.op.subtract(query_at, key_at), "uint64")
            visible = relax.op.less(distance, relax.const(window, "uint64"))
        else:
            visible = relax.op.less_equal(key_at, query_at)
        lowest = relax.const(np.float32(np.finfo(np.float32).min), f32)
        probs = relax.op.nn.softmax(relax.op.where(visible, scores, lowest), axis=-1)
        out = relax.op.reshape(relax.op.matmul(probs, values), (batch, heads, seq, head))
        out = relax.op.reshape(relax.op.permute_dims(out, [0, 2, 1, 3]), (batch, seq, heads * head))
        return relax.Tuple([out, present_k, present_v])


EXTRA_CONVERTERS = {"ConvInteger": ConvInteger, "Clip": Clip, "Pad": Pad, "QuantizeLinear": QuantizeLinear,
                    "DequantizeLinear": DequantizeLinear, "Celu": Celu, "Swish": Swish, "Range": Range,
                    "SimplifiedLayerNormalization": SimplifiedLayerNormalization,
                    "SkipSimplifiedLayerNormalization": SkipSimplifiedLayerNormalization,
                    "RotaryEmbedding": RotaryEmbedding, "GroupQueryAttention": GroupQueryAttention}
# Element-wise operators whose operands broadcast (ONNX's multidirectional broadcasting)
BROADCASTING = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater", "Less",
                "GreaterOrEqual", "LessOrEqual", "Where", "Max", "Min")


def _is_compound(dim) -> bool:
    return not isinstance(dim, (tvm.tirx.IntImm, tvm.tirx.Var))


def unify_broadcast_dims(bb, inputs: list) -> list:
    """``inputs`` of a broadcasting operator with each pair of symbolic dimensions Relax cannot prove
    equal made one: the operand whose dimension differs is ``match_cast`` to the other's (an
    expression of the dimensions, such as ``past_sequence_length + sequence_length``, over a bare
    input dimension such as ``total_sequence_length``), a check at run time. Without it the result's
    shape is unknown (a causal mask from the keys' length and-ed with the ``attention_mask``'s), and
    every operator after it loses its shape. Dimensions of 1 and constant ones are left alone: they
    broadcast, or TVM names the mismatch."""
    shapes = [list(x.ty.shape) if isinstance(x, relax.Expr) and isinstance(getattr(x, "ty", None), relax.TensorType)
              and x.ty.shape is not None else None for x in inputs]
    rank = max((len(sh) for sh in shapes if sh is not None), default=0)
    if rank == 0 or sum(sh is not None for sh in shapes) < 2:
        return inputs
    analyzer = Analyzer()
    new = [list(sh) if sh is not None else None for sh in shapes]
    for axis in range(1, rank + 1):  # right-aligned
        dims = [(i, sh[-axis]) for i, sh in enumerate(shapes) if sh is not None and len(sh) >= axis
                and not (isinstance(sh[-axis], tvm.tirx.IntImm) and int(sh[-axis]) == 1)]
        if len(dims) < 2 or any(isinstance(d, tvm.tirx.IntImm) for _, d in dims):
            continue
        target = next((d for _, d in dims if _is_compound(d)), dims[0][1])
        for i, d in dims:
            if not analyzer.can_prove_equal(d, target):
                new[i][len(new[i]) - axis] = target
    out = list(inputs)
    for i, (old, shape) in enumerate(zip(shapes, new)):
        if old is not None and any(not a.same_as(b) for a, b in zip(old, shape)):
            out[i] = bb.match_cast(inputs[i], relax.TensorType(shape, inputs[i].ty.dtype))
    return out


def _scalar_tensor(bb, value):
    """A symbolic scalar operand (a TIR expression of the dimensions) as a 0-d tensor
    of its dtype. Left a scalar, it reaches a fused kernel as a scalar parameter beside the shape
    variable it is an expression of, and TVM's ``FuseTIR`` stops at the variable defined twice
    (``renew_defs.cc``: ``VarRemapGet(source) == nullptr``): ``arange(seq) + past_length``."""
    if not tvm.ir.is_prim_expr(value) or isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return None
    inner = _uncast_integer(value)
    if "int" not in str(inner.ty):
        return None
    return _count_scalar(bb, inner.astype("int64"), str(value.ty))


def _unifying(base):
    """``base`` (a converter class) with its symbolic scalar operands as tensors where a tensor is among
    them (:func:`_scalar_tensor`) and its operands' dimensions unified (:func:`unify_broadcast_dims`)."""

    class Unifying(base):
        @classmethod
        def get_converter(cls, opset):
            convert = base.get_converter(opset)

            def run(bb, inputs, attr, params):
                inputs = list(inputs)
                if any(isinstance(x, relax.Expr) and isinstance(getattr(x, "ty", None), relax.TensorType) for x in inputs):
                    tensors = [_scalar_tensor(bb, x) if tvm.ir.is_prim_expr(x) else None for x in inputs]
                    inputs = [x if t is None else t for x, t in zip(inputs, tensors)]
                return convert(bb, unify_broadcast_dims(bb, inputs), attr, params)

            return run

    Unifying.__name__ = base.__name__
    return Unifying


# the converters above for operators ONNX Runtime defines in its own domain (TVM's importer keys its
# table by operator name alone; from_onnx's check accepts these names in this domain too)
CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_CONVERTERS = frozenset({"SkipSimplifiedLayerNormalization", "RotaryEmbedding", "GroupQueryAttention"})


@contextlib.contextmanager
def extra_converters():
    """TVM's ONNX importer, with :data:`EXTRA_CONVERTERS` added, inside this block only."""
    original = _tvm_onnx._get_convert_map

    def extended():
        table = dict(original())
        table.update(EXTRA_CONVERTERS)
        table.update({name: _unifying(table[name]) for name in BROADCASTING if name in table})
        return table

    _tvm_onnx._get_convert_map = extended
    try:
        yield
    finally:
        _tvm_onnx._get_convert_map = original
