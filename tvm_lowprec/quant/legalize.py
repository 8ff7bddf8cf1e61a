"""How ``relax.quantize`` to an integer type is lowered: TVM's formula, ``clip(round(x / s) + z)``, with
NaN sent to the type's lowest code, as ONNX Runtime's QuantizeLinear sends it.

NaN has no quantized value, and the formula alone lets LLVM's ``minnum``/``maxnum`` pick a clamp bound
(a NaN became 255). Exported transformers make NaN on purpose: the attention mask ``(1 - mask) *
finfo.min``, quantized by ONNX Runtime, dequantizes ``finfo.min`` to ``-inf`` and multiplies it by 0
where the mask is 1; ONNX Runtime's QuantizeLinear then gives the lowest code there (0 for uint8, -128
for int8, whatever the zero point: MLAS's clamp; measured on ORT 1.32 for several zero points and
lengths), which in the mask graph is its zero point 0, and the masked add leaves the scores alone. The
same code here: a Div of 0 by 0 in EfficientViT's linear attention (a denominator quantized to 0, its
numerator at the zero point) is NaN before a uint8 quantize of zero point 119, which ONNX Runtime
writes as 0, and so must we (sending it to the zero point put 48 values 119 steps off and the model's
output 9 steps off). ``+inf``/``-inf`` clamp to the ends of the range, as before.

Used as ``LegalizeOps(customize_legalize_map=LEGALIZE)`` by :mod:`tvm_lowprec.pipeline`; quantization
to a float type (FP8) keeps TVM's own legalization.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, tirx

from .patterns import dtype_of, static_shape


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
    the test names the input twice, which doubles what an inlined chain computes. The arithmetic is
    :func:`~tvm_lowprec.kernels.qgemm.quantize_linear`'s (scalar parameters: clamped before one
    conversion, :func:`~tvm_lowprec.kernels.qgemm.target_round_to_int`)."""
    from ..kernels.qgemm import quantize_linear, target_round_to_int

    out_dtype = str(call.attrs.out_dtype)
    if "int" not in out_dtype:  # float8: TVM's legalization
        return tvm.ir.Op.get("relax.quantize").get_attr("FLegalize")(bb, call)
    axis = int(call.attrs.axis)
    lo, hi = tirx.min_value(out_dtype), tirx.max_value(out_dtype)
    round_to_int = target_round_to_int()
    scale, zero_point = _as_scalar(call.args[1]), _as_scalar(call.args[2])

    def compute(data, scale, zero_point):
        def element(*indices):
            x = data(*indices)  # a load also of a 0-d tensor (``data[()]`` is a slice)
            if isinstance(scale, tirx.FloatImm) and isinstance(zero_point, tirx.IntImm):
                q = quantize_linear(x, scale.value, int(zero_point.value), int(lo.value), int(hi.value), out_dtype,
                                    round_to_int)
            else:  # per-channel (or tensor) parameters: TVM's formula
                s = _parameter(scale, indices, axis if axis >= 0 else axis + len(indices))
                z = _parameter(zero_point, indices, axis if axis >= 0 else axis + len(indices)).astype("float32")
                q = tirx.max(tirx.min(tirx.round(x / s) + z, hi.astype("float32")), lo.astype("float32"))
                q = q.astype(out_dtype)
            return tirx.Select(_is_nan(x), tirx.const(int(lo.value), out_dtype), q) if nan_test else q

        return te.compute(data.shape, element, name="quantized")

    return bb.call_te(compute, call.args[0], scale, zero_point, primfunc_name_hint="quantize")


SEPARABLE_TAPS = 25  # the smallest window taken as two 1-D passes


def legalize_max_pool2d(bb, call):
    """Max pooling on a CPU row as two 1-D passes (:mod:`~tvm_lowprec.kernels.pool`, its own schedule
    rule) from :data:`SEPARABLE_TAPS` taps: SPPF's 5x5 pools of 1x40x40x16 codes, three calls, 13.9 ->
    6.6 us on a Zen 4, one thread. The passes write the padded input and the row maxima, which a 3x3
    window does not repay: ResNet's 3x3 stride-2 pool of 112x112x64 took 39.5 us so against 10.9 us
    as TVM's one window (:mod:`~tvm_lowprec.schedule.window`). TVM's legalization also on a GPU, in
    ceil mode and for other layouts."""
    from ..kernels.pool import OP, separable_max_pool

    a = call.attrs
    target = tvm.target.Target.current(allow_none=True)
    tvm_default = tvm.ir.Op.get("relax.nn.max_pool2d").get_attr("FLegalize")
    if (target is None or target.kind.name != "llvm" or a.ceil_mode or a.layout != a.out_layout
            or str(a.layout) not in ("NHWC", "NCHW") or math.prod(int(v) for v in a.pool_size) < SEPARABLE_TAPS):
        return tvm_default(bb, call)
    sizes = [[int(v) for v in attr] for attr in (a.pool_size, a.strides, a.padding, a.dilation)]
    return bb.call_te(lambda x: separable_max_pool(x, *sizes, str(a.layout)), call.args[0],
                      primfunc_name_hint="max_pool2d", primfunc_attrs={"lowprec.op": OP, "op_pattern": 8})


def legalize_resize2d(bb, call):
    """A bilinear resize of static float32 NCHW/NHWC data on a CPU row: two 1-D passes over tables of
    source indices and weights (:mod:`~tvm_lowprec.kernels.resize`, its own schedule rule); TVM's
    legalization for other methods, modes, shapes and devices."""
    from ..kernels.resize import MODES, OP, axis_tables, separable_linear_resize

    a = call.attrs
    tvm_default = tvm.ir.Op.get("relax.image.resize2d").get_attr("FLegalize")
    target = tvm.target.Target.current(allow_none=True)
    in_shape, out_shape, layout = static_shape(call.args[0]), static_shape(call), str(a.layout)
    if (target is None or target.kind.name != "llvm" or str(a.method) != "linear" or layout not in ("NCHW", "NHWC")
            or str(a.coordinate_transformation_mode) not in MODES or in_shape is None or out_shape is None
            or dtype_of(call.args[0]) != "float32" or dtype_of(call) != "float32"):
        return tvm_default(bb, call)
    h, w = layout.index("H"), layout.index("W")
    mode = str(a.coordinate_transformation_mode)
    if mode == "align_corners" and (out_shape[h] == 1 or out_shape[w] == 1):
        return tvm_default(bb, call)
    tables = [*axis_tables(in_shape[h], out_shape[h], mode), *axis_tables(in_shape[w], out_shape[w], mode)]
    return bb.call_te(lambda x, *t: separable_linear_resize(x, *t, layout), call.args[0],
                      *(relax.const(t) for t in tables), primfunc_name_hint="resize2d",
                      primfunc_attrs={"lowprec.op": OP, "lowprec.layout": layout, "op_pattern": 8})


def legalize_cumsum(bb, call):
    """``relax.cumsum`` of a static shape: :mod:`~tvm_lowprec.kernels.scan` over ``[outer, length, inner]``
    (TVM 0.27 legalizes it for no device the VM runs); a symbolic shape, or a GPU row, is left as it is
    (and named at build)."""
    from ..kernels.scan import OP, cumsum_kernel

    shape, a = static_shape(call.args[0]), call.attrs
    target = tvm.target.Target.current(allow_none=True)
    if shape is None or target is None or target.kind.name != "llvm":  # the kernel's loop is CPU host code
        return call
    axis = int(a.axis) % len(shape) if a.axis is not None else 0
    if a.axis is None:  # over the flattened data
        shape, axis = (math.prod(shape),), 0
    view = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
    in_dtype = dtype_of(call.args[0])
    out_dtype = str(a.dtype) if a.dtype is not None and str(a.dtype) else in_dtype
    kernel = bb.add_func(cumsum_kernel(*view, in_dtype, out_dtype, bool(a.exclusive)),
                         f"{OP}_{in_dtype}_{'x'.join(map(str, view))}")
    data = bb.emit(relax.op.reshape(call.args[0], view))
    out = bb.emit(relax.call_tir(kernel, [data], relax.TensorType(view, out_dtype)))
    return relax.op.reshape(out, static_shape(call))


def legalize_reshape(bb, call):
    """A reshape with a dimension known only at run time stays ``R.reshape``: a view of its input (TVM's
    VM reshapes in place, no copy). Legalized, it is a copy kernel that TVM's RewriteDataflowReshape
    turns back into a view only where it can prove the kernel a reshape, which it cannot once a length is
    an expression (a decoder's ``past + seq``, a sliced row count) or passed as a scalar: a plain
    export's decode step at 128 cached tokens copied its KV cache twice more per layer (1 ms of 28 for
    Qwen2.5-0.5B's shape, Zen 3). With static shapes TVM's kernel stays, fused with its neighbours."""
    if static_shape(call.args[0]) is None or static_shape(call) is None:
        return call
    return tvm.ir.Op.get("relax.reshape").get_attr("FLegalize")(bb, call)


LEGALIZE = {"relax.quantize": legalize_quantize, "relax.nn.max_pool2d": legalize_max_pool2d,
            "relax.image.resize2d": legalize_resize2d, "relax.cumsum": legalize_cumsum,
            "relax.reshape": legalize_reshape}
