"""How ``relax.quantize`` to an integer type is lowered: TVM's formula, ``clip(round(x / s) + z)``, with
NaN sent to the zero point.

NaN has no quantized value, and the formula alone lets LLVM's ``minnum``/``maxnum`` pick a clamp bound
(a NaN became 255). Exported transformers make NaN on purpose: the attention mask ``(1 - mask) *
finfo.min``, quantized by ONNX Runtime, dequantizes ``finfo.min`` to ``-inf`` and multiplies it by 0
where the mask is 1; ONNX Runtime's QuantizeLinear then gives 0 there (the zero point of that tensor)
and the masked add leaves the scores alone. Mapping NaN to the zero point, i.e. to real zero, gives the
same result. ``+inf``/``-inf`` clamp to the ends of the range, as before.

**No division where it can be proven unneeded.** A vector division is slow: ``vdivps zmm`` issues
once per 10 cycles or so on Intel cores (16 lanes), which bounded an image's quantize (1x3x320x320,
72 us, a third of the copy bandwidth on a 2-core Xeon). With a scalar constant scale ``s`` on a CPU
target, ``x / s`` is computed as ``q0 = x * r`` with ``r = RN(1/s)``, then one correction,
``q = fma(fma(-q0, s, x), r, q0)`` (Markstein's: the residual is exact in float32 and ``q`` is
``x / s`` correctly rounded, or an adjacent float when ``x / s`` lies within a tiny fraction of an
ulp of a midpoint between two floats). ``round(q)`` can then differ from ``round(x / s)`` only for
``x / s`` within an ulp of a rounding boundary ``k + 1/2``; :func:`division_free_reciprocal` checks,
when the kernel is built, every boundary that reaches the output range (each ``x`` within
:data:`CHECK_ULPS` ulps of ``s (k + 1/2)``) against the true division, and keeps the division for a
scale where one differs. ``|q0| >= 2**22`` (infinities included) takes ``q0``: it clamps either way.
So the codes are those of the division, for every input.

Used as ``LegalizeOps(customize_legalize_map=LEGALIZE)`` by :mod:`tvm_lowprec.pipeline`; quantization
to a float type (FP8) keeps TVM's own legalization.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import te, tirx

CHECK_ULPS = 8  # the inputs checked on each side of a rounding boundary
_EXACT_BITS = 16  # output types up to this width (their boundaries are checked one by one)
_LARGE = 2.0**22  # beyond it, the quotient clamps whatever its last bit


def _parameter(value, indices, axis):
    """A scale or zero point at ``indices``: a scalar, a tensor of ones' shape, or one per ``axis``."""
    if isinstance(value, (tirx.IntImm, tirx.FloatImm)):
        return value
    if all(isinstance(d, tirx.IntImm) and d.value == 1 for d in value.shape):
        return value[(0,) * len(value.shape)]
    return value[indices[axis]]


def _as_scalar(expr):
    """A scalar constant argument as an immediate (so the kernel needs no tensor for it)."""
    if isinstance(expr, tvm.ir.expr.Constant) and isinstance(expr.value, tvm.runtime.Tensor):
        value = expr.value.numpy()
        if value.ndim == 0:
            return tirx.const(value.item(), str(value.dtype))
    return expr


def _is_nan(x):
    """``isnan(x)`` for float32 as integer arithmetic on its bits (exponent all ones, mantissa not
    zero), in a Select: TVM's vectorizer scalarizes ``tirx.isnan`` and ``if_then_else`` in a vector
    loop (a DFL softmax's quantize ran 131 scalar divisions: 0.33 -> 0.07 ms on 1x4x4x8000)."""
    bits = tirx.reinterpret("int32", x) & tirx.const(0x7FFFFFFF, "int32")
    return bits > tirx.const(0x7F800000, "int32")


def _fma32(a, b, c):
    """``RN32(a * b + c)`` of float32 arrays, exactly: the product is exact in float64, the sum
    exact as a float64 pair (TwoSum), rounded once to float32 (a float64 sum on a float32 midpoint
    is moved off it by the pair's low part)."""
    p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    hi = p + c64
    virtual = hi - p
    lo = (p - (hi - virtual)) + (c64 - virtual)
    out = hi.astype(np.float32)
    up, down = np.nextafter(out, np.float32(np.inf)), np.nextafter(out, np.float32(-np.inf))
    above = (out.astype(np.float64) + up.astype(np.float64)) / 2 == hi  # hi halfway to the next float
    below = (out.astype(np.float64) + down.astype(np.float64)) / 2 == hi
    out = np.where(above & (lo > 0), up, out)
    return np.where(below & (lo < 0), down, out)


def _quotient(x, s, r):
    """The division-free ``x / s`` of the kernels, in numpy."""
    with np.errstate(over="ignore", invalid="ignore"):
        q0 = x * r
        q = _fma32(_fma32(-q0, np.full_like(x, s), x), np.full_like(x, r), q0)
    return np.where(np.abs(q0) < _LARGE, q, q0)


@functools.lru_cache(maxsize=4096)
def division_free_reciprocal(scale: float, zero_point: int, lo: int, hi: int) -> float | None:
    """``RN(1/scale)`` where the corrected product rounds as the division does at every boundary that
    reaches codes ``lo..hi`` with ``zero_point`` (see the module's docstring), else None."""
    s = np.float32(scale)
    if not (np.isfinite(s) and s >= np.finfo(np.float32).tiny):
        return None
    r = np.float32(1) / s
    if not (np.isfinite(r) and r >= np.finfo(np.float32).tiny):
        return None
    k = np.arange(lo - zero_point - 2, hi - zero_point + 2, dtype=np.float64) + 0.5
    centre = (k * np.float64(s)).astype(np.float32).view(np.int32)
    steps = np.arange(-CHECK_ULPS, CHECK_ULPS + 1, dtype=np.int32)
    x = (centre[:, None] + np.where(centre[:, None] < 0, -steps, steps)).reshape(-1).view(np.float32)
    with np.errstate(over="ignore"):
        want = np.round(x / s)
    return float(r) if np.array_equal(np.round(_quotient(x, s, r)), want) else None


def _divide(x, s, z, out_dtype: str):
    """``x / s``: the corrected product where :func:`division_free_reciprocal` proves it (a scalar
    constant scale and zero point, an integer type of at most 16 bits, a CPU target), else division."""
    target = tvm.target.Target.current(allow_none=True)
    info = np.iinfo(out_dtype)
    if not (isinstance(s, tirx.FloatImm) and isinstance(z, tirx.IntImm) and info.bits <= _EXACT_BITS
            and target is not None and target.kind.name == "llvm"):
        return x / s
    r = division_free_reciprocal(float(s.value), int(z.value), int(info.min), int(info.max))
    if r is None:
        return x / s
    f32 = "float32"
    q0 = x * tirx.const(r, f32)
    residual = tirx.call_llvm_pure_intrin(f32, "llvm.fma", -q0, tirx.const(float(s.value), f32), x)
    q = tirx.call_llvm_pure_intrin(f32, "llvm.fma", residual, tirx.const(r, f32), q0)
    return tirx.Select(tirx.abs(q0) < tirx.const(_LARGE, f32), q, q0)


def legalize_quantize(bb, call, nan_test: bool = True):
    """``nan_test=False`` where the input cannot be NaN (:mod:`~tvm_lowprec.quant.finite_quantize`):
    the test names the input twice, which doubles what an inlined chain computes."""
    out_dtype = str(call.attrs.out_dtype)
    if "int" not in out_dtype:  # float8: TVM's legalization
        return tvm.ir.Op.get("relax.quantize").get_attr("FLegalize")(bb, call)
    axis = int(call.attrs.axis)
    lo, hi = tirx.min_value(out_dtype), tirx.max_value(out_dtype)

    def compute(data, scale, zero_point):
        def element(*indices):
            s = _parameter(scale, indices, axis if axis >= 0 else axis + len(indices))
            z = _parameter(zero_point, indices, axis if axis >= 0 else axis + len(indices)).astype("float32")
            x = data[indices]
            quotient = _divide(x, s, _parameter(zero_point, indices, axis if axis >= 0 else axis + len(indices)), out_dtype)
            q = tirx.max(tirx.min(tirx.round(quotient) + z, hi.astype("float32")), lo.astype("float32"))
            return (tirx.Select(_is_nan(x), z, q) if nan_test else q).astype(out_dtype)

        return te.compute(data.shape, element, name="quantized")

    return bb.call_te(compute, call.args[0], _as_scalar(call.args[1]), _as_scalar(call.args[2]),
                      primfunc_name_hint="quantize")


LEGALIZE = {"relax.quantize": legalize_quantize}
