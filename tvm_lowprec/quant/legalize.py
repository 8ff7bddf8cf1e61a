"""How ``relax.quantize`` to an integer type is lowered: TVM's formula, ``clip(round(x / s) + z)``, with
NaN sent to the zero point.

NaN has no quantized value, and the formula alone lets LLVM's ``minnum``/``maxnum`` pick a clamp bound
(a NaN became 255). Exported transformers make NaN on purpose: the attention mask ``(1 - mask) *
finfo.min``, quantized by ONNX Runtime, dequantizes ``finfo.min`` to ``-inf`` and multiplies it by 0
where the mask is 1; ONNX Runtime's QuantizeLinear then gives 0 there (the zero point of that tensor)
and the masked add leaves the scores alone. Mapping NaN to the zero point, i.e. to real zero, gives the
same result. ``+inf``/``-inf`` clamp to the ends of the range, as before.

Used as ``LegalizeOps(customize_legalize_map=LEGALIZE)`` by :mod:`tvm_lowprec.pipeline`; quantization
to a float type (FP8) keeps TVM's own legalization.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx


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
            q = tirx.max(tirx.min(tirx.round(x / s) + z, hi.astype("float32")), lo.astype("float32"))
            return (tirx.Select(_is_nan(x), z, q) if nan_test else q).astype(out_dtype)

        return te.compute(data.shape, element, name="quantized")

    return bb.call_te(compute, call.args[0], _as_scalar(call.args[1]), _as_scalar(call.args[2]),
                      primfunc_name_hint="quantize")


LEGALIZE = {"relax.quantize": legalize_quantize}
