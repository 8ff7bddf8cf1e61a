"""Pass: dequantize -> matmul [-> add bias] [-> relu/clip] -> quantize  ==>  one integer GEMM kernel.

Runs on the QDQ Relax module that :func:`tvm_lowprec.from_onnx` (or a quantizer) produces, before
legalization. Each match becomes ``call_tir`` to a :func:`~tvm_lowprec.kernels.build_qgemm` PrimFunc with
the weights quantized and packed at compile time, bias and zero points folded into one int32 vector,
and requantization (plus the activation, as clamp bounds) in the kernel's epilogue. ``MatMulInteger``
(an int32 matmul of widened, zero-point-shifted 8-bit operands) becomes the same kernel with an int32
epilogue. Anything that does not match stays as it is (float semantics, still correct).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..errors import LowPrecError
from ..kernels.qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, epilogue_params, pack_weights
from ..targets import TargetSpec
from .patterns import (
    ConstWeight,
    QParams,
    call_of,
    constant,
    dequantized_activation,
    dequantized_weight,
    dtype_of,
    qparams,
    static_shape,
)
from .requant import qrange
from .zero_points import gemm_corrections, signed_weights, zero_point_coefficient


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


# ---------------------------------------------------------------------------------------------
# Step 1. Matchers: quantize(...) chains and MatMulInteger chains -> QGemmMatch


def _bound(value) -> float | None:
    if isinstance(value, relax.PrimValue):
        value = value.value
    if hasattr(value, "value"):
        return float(value.value)
    return None


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


def _bias(expr, lookup, acc_scale):
    """A constant bias ([N] float, or dequantize of int32) in accumulator units."""
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


def _matmul_operands(expr, lookup):
    """(matmul call, bias expr or None) for ``matmul`` or ``add(matmul, bias)`` in either order."""
    add = call_of(expr, "add", lookup)
    if add is not None:
        for mm_side, bias_side in ((0, 1), (1, 0)):
            mm = call_of(add.args[mm_side], "matmul", lookup)
            if mm is not None:
                return mm, add.args[bias_side]
        return None, None
    return call_of(expr, "matmul", lookup), None


def match_requantized_matmul(call, lookup, mode: str) -> QGemmMatch | None:
    if not call.op.same_as(tvm.ir.Op.get("relax.quantize")):
        return None
    out_dtype = str(call.attrs.out_dtype)
    out = qparams(call, lookup, "output quantize")
    if out is None or not out.per_tensor or out_dtype not in ("uint8", "int8"):
        return None
    inner, lo, hi = _activation_bounds(call.args[0], lookup)
    mm, bias_expr = _matmul_operands(inner, lookup)
    if mm is None:
        return None
    x = dequantized_activation(mm.args[0], lookup)
    w = dequantized_weight(mm.args[1], lookup)
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
    for _ in range(4):
        value = constant(expr, lookup)
        if value is not None:
            return value
        for name in ("astype", "expand_dims", "reshape"):
            call = call_of(expr, name, lookup)
            if call is not None:
                expr = call.args[0]
                break
        else:
            return None
    return None


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


def match_matmul_integer(call, lookup, mode: str) -> QGemmMatch | None:
    if not call.op.same_as(tvm.ir.Op.get("relax.matmul")) or dtype_of(call) != "int32":
        return None
    a, b = _widened(call.args[0], lookup), _widened(call.args[1], lookup)
    if a is None or b is None or b[1] is None:
        return None
    if a[1] is not None and a[1].size != 1:
        return None  # a per-row activation zero point stays on the generic path
    if a[2] is not None and not _scalar_like(a[2]):
        return None
    w = constant(b[0], lookup)
    if w is None or w.ndim != 2:
        return None
    n = w.shape[1]
    zw = b[1].reshape(-1)
    if zw.size not in (1, n):
        return None
    weight = ConstWeight(w, np.ones((), np.float32), zw if zw.size > 1 else zw.reshape(()))
    za = 0 if a[1] is None else int(a[1].reshape(()))
    return QGemmMatch(a[0], za, np.ones(n, np.float32), weight, None, Epilogue("int32"), None, a[2])


@dataclass(frozen=True)
class RuntimeQMatmul:
    """``quantize(matmul(dequantize(x), dequantize(w)))`` with runtime operands or parameters.

    Emitted as an exact int32 matmul of zero-point-shifted operands and a float64 requantization:
    the same numbers as the constant-weight kernel, on TVM's generic (untensorized) matmul.
    """

    x: relax.Expr
    w: relax.Expr
    x_q: relax.Call  # the dequantize calls and the quantize call, for their parameters
    w_q: relax.Call
    out_q: relax.Call


def match_runtime_qmatmul(call, lookup, mode: str):
    if not call.op.same_as(tvm.ir.Op.get("relax.quantize")) or str(call.attrs.out_dtype) not in ("uint8", "int8"):
        return None
    mm = call_of(call.args[0], "matmul", lookup)
    if mm is None:
        return None
    dx, dw = call_of(mm.args[0], "dequantize", lookup), call_of(mm.args[1], "dequantize", lookup)
    if dx is None or dw is None:
        return None
    if any(dtype_of(d.args[0]) not in ("uint8", "int8") for d in (dx, dw)):
        return None
    if not all(_scalar_like(e) for e in (dx.args[1], dx.args[2], call.args[1], call.args[2])):
        return None  # per-axis activation or output parameters: not a matmul requantization
    if not (_scalar_like(dw.args[1]) and _scalar_like(dw.args[2])):
        return None
    return RuntimeQMatmul(dx.args[0], dw.args[0], dx, dw, call)


def _scalar_like(expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and int(np.prod(shape)) == 1


MATCHERS = (match_requantized_matmul, match_matmul_integer, match_runtime_qmatmul)


# ---------------------------------------------------------------------------------------------
# Step 2. Emit: QGemmMatch -> reshape + call_tir(qgemm) + reshape


def emit_qgemm(builder, match: QGemmMatch, spec: TargetSpec) -> relax.Expr | None:
    xshape = static_shape(match.x)
    if xshape is None or len(xshape) < 2:
        return None  # dynamic shapes stay on the generic path
    k, n = match.weight.values.shape
    if xshape[-1] != k:
        return None
    m = int(np.prod(xshape[:-1]))
    row_term = bool(np.any(np.asarray(match.weight.zero_point) - (128 if match.weight.values.dtype == np.uint8 else 0)))
    runtime_za = match.x_zero_point_expr is not None
    problem = QGemmProblem(m, n, k, dtype_of(match.x), match.epilogue, row_term=row_term, runtime_a_zero_point=runtime_za)
    layout = GemmLayout.choose(problem, spec, signed_weights(match.weight.values)[0])
    corr = gemm_corrections(match.weight.values, match.x_zero_point, match.weight.zero_point, layout.a_offset, match.bias_int)
    zcoef = zero_point_coefficient(match.weight.values, match.weight.zero_point) if runtime_za else None
    name = f"qgemm_{problem.a_dtype[0]}8_{m}x{n}x{k}_{problem.epilogue.kind}{'_dynzp' if runtime_za else ''}"
    gvar = builder.add_func(build_qgemm(problem, layout, name).with_attr("op_pattern", 8), name)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, match.mult, zcoef=zcoef)
    x2 = match.x if len(xshape) == 2 else builder.emit(relax.op.reshape(match.x, (m, k)))
    args = [x2]
    if runtime_za:
        args.append(builder.emit(relax.op.reshape(relax.op.astype(match.x_zero_point_expr, "int32"), (1,))))
    args += [relax.const(pack_weights(corr.b_signed, layout))] + [relax.const(p) for p in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((m, n), problem.epilogue.out_dtype)))
    if len(xshape) != 2:
        y = builder.emit(relax.op.reshape(y, (*xshape[:-1], n)))
    return y


def _as_scalar(builder, expr, dtype):
    return builder.emit(relax.op.astype(relax.op.reshape(expr, ()), dtype))


def emit_runtime_qmatmul(builder, match: RuntimeQMatmul, spec: TargetSpec):
    def shifted(data, zp):
        return builder.emit(relax.op.subtract(relax.op.astype(data, "int32"), _as_scalar(builder, zp, "int32")))

    acc = builder.emit(
        relax.op.matmul(shifted(match.x, match.x_q.args[2]), shifted(match.w, match.w_q.args[2]), out_dtype="int32")
    )
    sx, sw, sy = (relax.op.reshape(q.args[1], ()) for q in (match.x_q, match.w_q, match.out_q))
    # the multiplier in the scales' own dtype (as onnx.reference computes it), the product in float64
    mult = builder.emit(relax.op.astype(relax.op.divide(relax.op.multiply(sx, sw), sy), "float64"))
    zy = _as_scalar(builder, match.out_q.args[2], "float64")
    y = relax.op.add(relax.op.round(relax.op.multiply(relax.op.astype(acc, "float64"), mult)), zy)
    out_dtype = str(match.out_q.attrs.out_dtype)
    lo, hi = qrange(out_dtype)
    return builder.emit(relax.op.astype(relax.op.clip(y, lo, hi), out_dtype))


def emit(builder, match, spec: TargetSpec):
    emitter = emit_runtime_qmatmul if isinstance(match, RuntimeQMatmul) else emit_qgemm
    return emitter(builder, match, spec)


# ---------------------------------------------------------------------------------------------
# Step 3. The pass


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, spec: TargetSpec, mode: str):
        super().__init__(mod)
        self.spec, self.mode, self.rewritten = spec, mode, 0
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
        for matcher in MATCHERS:
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
    rewriter = _Rewriter(mod, spec, requant_mode)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
            if rewriter.error is not None:
                raise rewriter.error
    return rewriter.builder_.get()


def qdq_to_integer(spec: TargetSpec, requant_mode: str = "float"):
    """The rewrite as a TVM pass. ``requant_mode``: ``"float"`` (ONNX rounding, default) or ``"fixed_point"``."""

    @tvm.ir.transform.module_pass(opt_level=0, name="lowprec.QDQToInteger")
    def _pass(mod, _ctx):
        return rewrite_module(mod, spec, requant_mode)

    return _pass
