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
from .zero_points import gemm_corrections


@dataclass(frozen=True)
class QGemmMatch:
    x: relax.Expr  # runtime 8-bit activation [..., K]
    x_zero_point: int
    acc_scale: np.ndarray  # float32 [N]: scale of one accumulator unit (sx * sw)
    weight: ConstWeight
    bias_int: np.ndarray | None  # int32 [N] in accumulator units
    epilogue: Epilogue
    mult: np.ndarray | None  # float32 [N] requantization multiplier


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


def _widened(expr, lookup):
    """``astype(x, int32) [- astype(zp, int32)]`` -> (x, zero point array) or None."""
    zp = np.zeros((), np.int64)
    sub = call_of(expr, "subtract", lookup)
    if sub is not None:
        zp_expr = sub.args[1]
        cast = call_of(zp_expr, "astype", lookup)
        expand = call_of(cast.args[0] if cast is not None else zp_expr, "expand_dims", lookup)
        base = expand.args[0] if expand is not None else (cast.args[0] if cast is not None else zp_expr)
        zp = constant(base, lookup)
        if zp is None:
            return None
        expr = sub.args[0]
    cast = call_of(expr, "astype", lookup)
    if cast is None or dtype_of(cast.args[0]) not in ("uint8", "int8"):
        return None
    return cast.args[0], np.asarray(zp, np.int64)


def match_matmul_integer(call, lookup, mode: str) -> QGemmMatch | None:
    if not call.op.same_as(tvm.ir.Op.get("relax.matmul")) or dtype_of(call) != "int32":
        return None
    a, b = _widened(call.args[0], lookup), _widened(call.args[1], lookup)
    if a is None or b is None or a[1].size != 1:
        return None  # a per-row activation zero point stays on the generic path
    w = constant(b[0], lookup)
    if w is None or w.ndim != 2:
        return None
    n = w.shape[1]
    zw = b[1].reshape(-1)
    if zw.size not in (1, n):
        return None
    weight = ConstWeight(w, np.ones((), np.float32), zw if zw.size > 1 else zw.reshape(()))
    return QGemmMatch(a[0], int(a[1].reshape(())), np.ones(n, np.float32), weight, None, Epilogue("int32"), None)


MATCHERS = (match_requantized_matmul, match_matmul_integer)


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
    problem = QGemmProblem(m, n, k, dtype_of(match.x), match.epilogue, row_term=row_term)
    layout = GemmLayout.choose(problem, spec)
    corr = gemm_corrections(match.weight.values, match.x_zero_point, match.weight.zero_point, layout.a_offset, match.bias_int)
    name = f"qgemm_{problem.a_dtype[0]}8_{m}x{n}x{k}_{problem.epilogue.kind}"
    gvar = builder.add_func(build_qgemm(problem, layout, name).with_attr("op_pattern", 8), name)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, match.mult)
    x2 = match.x if len(xshape) == 2 else builder.emit(relax.op.reshape(match.x, (m, k)))
    args = [x2, relax.const(pack_weights(corr.b_signed, layout))] + [relax.const(p) for p in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((m, n), problem.epilogue.out_dtype)))
    if len(xshape) != 2:
        y = builder.emit(relax.op.reshape(y, (*xshape[:-1], n)))
    return y


# ---------------------------------------------------------------------------------------------
# Step 3. The pass


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, spec: TargetSpec, mode: str):
        super().__init__(mod)
        self.spec, self.mode, self.rewritten = spec, mode, 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        for matcher in MATCHERS:
            match = matcher(call, self.lookup_binding, self.mode)
            if match is None:
                continue
            new = emit_qgemm(self.builder_, match, self.spec)
            if new is not None:
                self.rewritten += 1
                return new
        return call


def qdq_to_integer(spec: TargetSpec, requant_mode: str = "float"):
    """The pass. ``requant_mode``: ``"float"`` (ONNX rounding, default) or ``"fixed_point"``."""

    @tvm.ir.transform.module_pass(opt_level=0, name="lowprec.QDQToInteger")
    def _pass(mod, _ctx):
        rewriter = _Rewriter(mod, spec, requant_mode)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return _pass
