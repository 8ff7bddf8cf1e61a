"""Pass: an add, a subtract or a multiply of two 8-bit quantized tensors runs on their codes, in int32 fixed point.

``quantize(dequantize(a) + dequantize(b))`` (a residual add, the FPN's adds), ``quantize(dequantize(a) -
dequantize(b))`` (a detector head's box decoding: the add with ``-Mb``) and
``quantize(dequantize(a) * dequantize(b))`` (a squeeze-excite gate, broadcast per channel), and
``quantize(dequantize(x) + v)`` with ``v`` a float32 constant or the dequantize of one (a bias per
channel after a quantized GEMM: :func:`bias_form`), with
per-tensor scales ``sa, sb, sy`` and zero points ``za, zb, zy``, are::

    add:       y = zy + round(Ma (a - za) + Mb (b - zb)),   Ma = sa / sy, Mb = sb / sy
    subtract:  y = zy + round(Ma (a - za) - Mb (b - zb))
    multiply:  y = zy + round(M (a - za)(b - zb)),          M = sa sb / sy

clamped to the output's range, in int32 (:class:`IntegerForm`): ``(A a + B b + C) >> F`` for the add,
``Ma`` and ``Mb`` as integers over ``2^F``; for the multiply ``p = clip((a - za)(b - zb), -P, P)``
(``P``: where the output saturates anyway) times ``M`` as a 2-part integer over ``2^(F+15)``,
``Q = Qh 2^15 + Ql``: ``(p Qh + (p Ql >> 15) + C) >> F``, which is ``floor(p Q / 2^15)`` exactly and
keeps every product inside int32 with ``M`` to about 2^-38 (a single int32 multiplier, at most 15
bits for a 16-bit ``p``, was off by up to 0.004 of a step at squeeze-excite scales). ``C`` holds the
zero points and the rounding's half; ``F`` is the largest that keeps every intermediate of every pair
of codes inside int32. No float is
computed: the kernel reads two 8-bit tensors and writes one (TVM fuses the int32 arithmetic into one
element-wise loop, with the operands' producers such as a resize).

Every pair of codes (65536) is checked at compile time against the graph as ONNX defines it
(float32 dequantize, add or multiply, ``rint(x / sy)``): the form is used only if it gives the same
code for every pair except where the exact value lies within :data:`TIE_BAND` of a rounding tie
(there float32's own rounding decides, and the two differ by one step); otherwise the float graph
stays (:func:`integer_form` returns the form with the count of such pairs; ``docs/numerics.md``
has the counts on the reference models).

Runs after :mod:`~tvm_lowprec.quant.lookup_tables` (a chain with one varying input is a table
there) and before :mod:`~tvm_lowprec.quant.float_gemm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..errors import LowPrecError
from .patterns import call_of, constant, dtype_of, mutate_relax_functions, qparams, static_shape
from .requant import qrange

EIGHT_BIT = ("uint8", "int8")
OPS = {"relax.add": "add", "relax.subtract": "subtract", "relax.multiply": "multiply"}
TIE_BAND = 2.0**-12  # a pair may differ from the float graph (by one step) only this close to a tie
_INT32 = 2**31 - 1
_MAX_SHIFT = 30
LINEAR = {"add": 1, "subtract": -1}  # the sign of b's term: a subtraction is an add with -Mb
LOW_BITS = 15  # the multiply's multiplier: high part times 2^15 plus a low part below 2^15


@dataclass(frozen=True)
class IntegerForm:
    """``y = clamp((A a + B b + C) >> shift)`` (add) or ``clamp((p A + (p B >> 15) + C) >> shift)``
    with ``p = clip((a - za)(b - zb), -P, P)`` (multiply: ``A``, ``B`` the high and low parts of the
    multiplier); ``ties``: the pairs of codes on which it differs from the float graph (by one step,
    each within :data:`TIE_BAND` of a tie)."""

    kind: str
    a: int
    b: int
    c: int
    shift: int
    clip: int | None  # multiply: |p| bound beyond which the output saturates (None: no clip needed)
    za: int
    zb: int
    qmin: int
    qmax: int
    ties: int = 0


def _codes(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1, dtype=np.int64)


def _float_graph(kind, a, b, sa, za, sb, zb, sy, zy, qmin, qmax) -> np.ndarray:
    """The ONNX definition in float32: dequantize both, add or multiply, quantize (rint, half to even)."""
    fa = (a - za).astype(np.float32) * np.float32(sa)
    fb = (b - zb).astype(np.float32) * np.float32(sb)
    f = fa + fb if kind == "add" else fa - fb if kind == "subtract" else fa * fb
    return np.clip(np.rint(f / np.float32(sy)) + zy, qmin, qmax).astype(np.int64)


def _exact(kind, a, b, sa, za, sb, zb, sy, zy) -> np.ndarray:
    """The value before rounding, in float64 (from the float32 parameters)."""
    sa, sb, sy = (float(np.float32(s)) for s in (sa, sb, sy))
    if kind in LINEAR:
        return (sa * (a - za) + LINEAR[kind] * sb * (b - zb)) / sy + zy
    return sa * sb * (a - za) * (b - zb) / sy + zy


def _integer(form: IntegerForm, a, b) -> np.ndarray:
    """The form evaluated in int64 (every intermediate inside int32 by construction)."""
    if form.kind in LINEAR:
        acc = form.a * a + form.b * b + form.c
    else:
        p = (a - form.za) * (b - form.zb)
        if form.clip is not None:
            p = np.clip(p, -form.clip, form.clip)
        low = p * form.b
        assert np.abs(low).max() <= _INT32
        acc = p * form.a + (low >> LOW_BITS) + form.c
    assert np.abs(acc).max() <= _INT32
    return np.clip(acc >> form.shift, form.qmin, form.qmax)


def _largest_shift(bound) -> int | None:
    """The largest shift F <= 30 whose ``bound(F)`` (the largest |intermediate|) stays inside int32."""
    for shift in range(_MAX_SHIFT, 0, -1):
        if bound(shift) <= _INT32:
            return shift
    return None


def integer_form(kind, a_dtype, sa, za, b_dtype, sb, zb, out_dtype, sy, zy) -> IntegerForm | None:
    """The fixed-point form of ``kind`` ("add", "subtract" or "multiply") for these parameters, checked on every
    pair of codes; None where int32 cannot hold it or it differs from the float graph away from ties."""
    qmin, qmax = qrange(out_dtype)
    lo_a, hi_a = np.iinfo(a_dtype).min, np.iinfo(a_dtype).max
    lo_b, hi_b = np.iinfo(b_dtype).min, np.iinfo(b_dtype).max
    sa, sb, sy = (float(np.float32(s)) for s in (sa, sb, sy))
    if not all(math.isfinite(s) and s > 0 for s in (sa, sb, sy)):
        return None
    if kind in LINEAR:
        ma, mb = sa / sy, LINEAR[kind] * sb / sy

        def make(shift):
            a_, b_ = round(ma * 2**shift), round(mb * 2**shift)
            c = zy * 2**shift - a_ * za - b_ * zb + 2 ** (shift - 1)
            return IntegerForm(kind, a_, b_, c, shift, None, za, zb, qmin, qmax)

        def bound(shift):
            f = make(shift)
            return max(abs(f.a * x + f.b * y + f.c) for x in (lo_a, hi_a) for y in (lo_b, hi_b))
    else:
        m = sa * sb / sy
        span = max(abs(x - za) for x in (lo_a, hi_a)) * max(abs(y - zb) for y in (lo_b, hi_b))
        limit = math.ceil((qmax - qmin + 2) / m) + 1  # |m p| beyond the range: saturated either way
        clip = limit if limit < span else None

        def make(shift):
            high, low = divmod(round(m * 2 ** (shift + LOW_BITS)), 2**LOW_BITS)
            c = zy * 2**shift + 2 ** (shift - 1)
            return IntegerForm(kind, high, low, c, shift, clip, za, zb, qmin, qmax)

        def bound(shift):
            f = make(shift)
            p = clip if clip is not None else span
            return max(p * f.a + p + abs(f.c), p * 2**LOW_BITS)
    shift = _largest_shift(bound)
    if shift is None:
        return None
    form = make(shift)
    if form.a == 0 or (kind in LINEAR and form.b == 0):  # a multiplier below 2^-F: not worth a kernel
        return None
    a, b = np.meshgrid(_codes(a_dtype), _codes(b_dtype), indexing="ij")
    ties = _ties(_integer(form, a, b), _float_graph(kind, a, b, sa, za, sb, zb, sy, zy, qmin, qmax),
                 lambda: _exact(kind, a, b, sa, za, sb, zb, sy, zy))
    return None if ties is None else IntegerForm(**{**form.__dict__, "ties": ties})


def _ties(got, want, exact) -> int | None:
    """How many codes ``got`` differs from the float graph's ``want`` on, where each differs by one step
    and its exact value (``exact()``, the same shape) lies within :data:`TIE_BAND` of a tie; None where
    one does not."""
    differ = got != want
    if not differ.any():
        return 0
    value = exact()[differ]
    if np.abs(got - want)[differ].max() > 1 or not np.all(np.abs(value - np.floor(value) - 0.5) <= TIE_BAND):
        return None
    return int(differ.sum())


@dataclass(frozen=True)
class BiasForm:
    """``y = clamp((A x + C) >> shift)`` for ``quantize(dequantize(x) + v)`` with ``v`` a float32
    constant tensor (a bias per channel after a quantized GEMM): ``C`` an int32 tensor of ``v``'s shape
    holding ``v / sy``, the zero points and the rounding's half; ``ties`` as :class:`IntegerForm`'s."""

    a: int
    c: np.ndarray
    shift: int
    qmin: int
    qmax: int
    ties: int = 0


def bias_form(x_dtype, sx, zx, v, out_dtype, sy, zy) -> BiasForm | None:
    """The fixed-point form of ``quantize(dequantize(x) + v)`` (per-tensor parameters, ``v`` any float32
    constant), checked on every code against every distinct value of ``v`` as :func:`integer_form`
    checks a pair; None where int32 cannot hold it or it differs away from ties."""
    qmin, qmax = qrange(out_dtype)
    sx, sy = (float(np.float32(s)) for s in (sx, sy))
    v = np.asarray(v, np.float32)
    if not (math.isfinite(sx) and math.isfinite(sy) and sx > 0 and sy > 0) or not np.all(np.isfinite(v)) or v.size == 0:
        return None
    values, index = np.unique(v, return_inverse=True)
    codes = _codes(x_dtype)
    lo, hi = int(codes.min()), int(codes.max())
    m, offsets = sx / sy, values.astype(np.float64) / sy

    def make(shift):
        a = round(m * 2**shift)
        c = np.round(offsets * 2**shift).astype(np.int64) + zy * 2**shift - a * zx + 2 ** (shift - 1)
        return a, c

    def bound(shift):
        a, c = make(shift)
        return max(abs(a * lo) + int(np.abs(c).max()), abs(a * hi) + int(np.abs(c).max()))

    shift = _largest_shift(bound)
    if shift is None:
        return None
    a, c = make(shift)
    if a == 0:
        return None
    x, k = np.meshgrid(codes, np.arange(len(values)), indexing="ij")
    fx = (x - zx).astype(np.float32) * np.float32(sx)
    want = np.clip(np.rint((fx + values[k]) / np.float32(sy)) + zy, qmin, qmax).astype(np.int64)
    ties = _ties(np.clip((a * x + c[k]) >> shift, qmin, qmax), want,
                 lambda: (sx * (x - zx) + values[k].astype(np.float64)) / sy + zy)
    if ties is None:
        return None
    return BiasForm(a, c[index].reshape(v.shape).astype(np.int32), shift, qmin, qmax, ties)


def bias_expr(form: BiasForm, x, out_dtype: str):
    """The Relax expression of ``form`` on the codes ``x`` (``C`` broadcast as the graph's add)."""
    acc = relax.op.add(relax.op.multiply(relax.op.astype(x, "int32"), _int32(form.a)), relax.const(form.c, "int32"))
    return _shifted(acc, form, out_dtype)


def _shifted(acc, form, out_dtype: str):
    """``clamp(acc >> form.shift)`` in ``out_dtype``: the end of every form's expression."""
    y = relax.op.right_shift(acc, _int32(form.shift))
    y = relax.op.minimum(relax.op.maximum(y, _int32(form.qmin)), _int32(form.qmax))
    return relax.op.astype(y, out_dtype)


def _int32(value: int):
    return relax.const(np.int32(value), "int32")


def integer_expr(form: IntegerForm, a, b, out_dtype: str):
    """The Relax expression of ``form`` on the codes ``a`` and ``b`` (broadcast as the graph's op)."""
    a32, b32 = relax.op.astype(a, "int32"), relax.op.astype(b, "int32")
    if form.kind in LINEAR:
        acc = relax.op.add(relax.op.add(relax.op.multiply(a32, _int32(form.a)), relax.op.multiply(b32, _int32(form.b))),
                           _int32(form.c))
    else:
        p = relax.op.multiply(relax.op.subtract(a32, _int32(form.za)), relax.op.subtract(b32, _int32(form.zb)))
        if form.clip is not None:
            p = relax.op.minimum(relax.op.maximum(p, _int32(-form.clip)), _int32(form.clip))
        low = relax.op.right_shift(relax.op.multiply(p, _int32(form.b)), _int32(LOW_BITS))
        acc = relax.op.add(relax.op.add(relax.op.multiply(p, _int32(form.a)), low), _int32(form.c))
    return _shifted(acc, form, out_dtype)


def _dequantized_constant(expr, dq, lookup) -> np.ndarray | None:
    """A float32 constant operand: a constant, or the dequantize of one (ONNX Runtime quantizes an Add's
    constant bias too), in float32 as DequantizeLinear computes it."""
    if dq is None:
        return constant(expr, lookup)
    q = constant(dq.args[0], lookup)
    p = qparams(dq, lookup, "constant operand dequantize") if q is not None else None
    if p is None:
        return None
    scale, zero = p.scale, p.zero_point.astype(np.float32)
    if not p.per_tensor:  # along the dequantize's axis
        along = [-1 if i == p.axis % q.ndim else 1 for i in range(q.ndim)]
        scale, zero = scale.reshape(along), zero.reshape(along)
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def _scalar(values):
    return np.asarray(values).reshape(())


@relax.expr_functor.mutator
class _IntegerBinary(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.forms: list[IntegerForm] = []
        self.error = None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        try:
            return self._rewrite(call)
        except LowPrecError as err:  # raised unwrapped by mutate_relax_functions
            self.error = self.error or err
            return call

    def _rewrite(self, call):
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.quantize") or dtype_of(call) not in EIGHT_BIT:
            return call
        lookup = self.lookup_binding
        core = next((c for c in (call_of(call.args[0], name.split(".")[1], lookup) for name in OPS) if c is not None), None)
        if core is None or static_shape(core) is None:
            return call
        dqs = [call_of(x, "dequantize", lookup) for x in core.args]
        if OPS[core.op.name] in LINEAR:
            rewritten = self._with_constant(call, core, dqs)
            if rewritten is not None:
                return rewritten
        if any(dq is None or dtype_of(dq.args[0]) not in EIGHT_BIT or constant(dq.args[0], lookup) is not None
               for dq in dqs):  # two runtime tensors: a constant operand is a float op of one tensor
            return call
        params = [qparams(dq, lookup, "binary operand dequantize") for dq in dqs]
        out = qparams(call, lookup, "binary output quantize")
        if any(p is None or not p.per_tensor for p in [*params, out]):
            return call
        (pa, pb), (da, db) = params, dqs
        form = integer_form(OPS[core.op.name], dtype_of(da.args[0]), _scalar(pa.scale), int(_scalar(pa.zero_point)),
                            dtype_of(db.args[0]), _scalar(pb.scale), int(_scalar(pb.zero_point)), dtype_of(call),
                            _scalar(out.scale), int(_scalar(out.zero_point)))
        if form is None:
            return call
        self.forms.append(form)
        return integer_expr(form, da.args[0], db.args[0], dtype_of(call))

    def _with_constant(self, call, core, dqs):
        """``quantize(dequantize(x) + v)``, ``quantize(v + dequantize(x))`` or ``quantize(dequantize(x) - v)``
        with ``v`` a float32 constant: :func:`bias_form`, or None."""
        lookup = self.lookup_binding
        kind = OPS[core.op.name]
        for i in ((0, 1) if kind == "add" else (0,)):
            dq, other = dqs[i], core.args[1 - i]
            v = _dequantized_constant(other, dqs[1 - i], lookup)
            if dq is None or v is None or v.dtype != np.float32 or dtype_of(dq.args[0]) not in EIGHT_BIT \
                    or constant(dq.args[0], lookup) is not None:
                continue
            p, out = qparams(dq, lookup, "bias operand dequantize"), qparams(call, lookup, "bias output quantize")
            if p is None or out is None or not p.per_tensor or not out.per_tensor:
                return None
            form = bias_form(dtype_of(dq.args[0]), _scalar(p.scale), int(_scalar(p.zero_point)),
                             v if kind == "add" else -v, dtype_of(call), _scalar(out.scale), int(_scalar(out.zero_point)))
            if form is None:
                return None
            return bias_expr(form, dq.args[0], dtype_of(call))
        return None


def integer_binary_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _IntegerBinary(mod))
