"""16-bit activations (int16/uint16 Q/DQ) times constant 8-bit weights -> the int16 x int8 GEMM.

Part of the :mod:`~tvm_lowprec.quant.qdq_to_integer` rewrite (one of its ``MATCHERS``): it matches
``quantize([relu/clip](core(dequantize(x: int16|uint16), dequantize(W)) [+ bias]))`` where ``core`` is a
matmul (MatMul, Gemm) or a one-group conv2d, ``W`` a constant int8 (or uint8) weight with scales per
tensor or per output channel, the activation's and output's parameters per-tensor constants, and the
output quantized to 8 or 16 bits. It emits :func:`~tvm_lowprec.kernels.qgemm16.build_qgemm16` with
the accumulation :func:`~tvm_lowprec.kernels.qgemm16.plan_accumulation` proves exact for these
weights, the zero points and bias folded, requantization in the epilogue (float mode, as ONNX
rounds). Declines (the layer stays float, exact) on rows without an int16 recipe
(``TargetSpec.int16`` is None: the Arm and GPU rows), for depthwise convolutions, runtime or blocked
weights, and anything the 8-bit matchers already take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..errors import LowPrecError
from ..kernels.qgemm import Epilogue, pack_weights
from ..kernels.qgemm16 import A_DTYPES, QGemm16Problem, build_qgemm16, choose_layout, plan_accumulation, qgemm16_params
from .patterns import ConstWeight, ConvGeometry, call_of, dtype_of, qparams, static_shape

OUT_DTYPES = ("uint8", "int8", "uint16", "int16")


@dataclass(frozen=True)
class Int16LinearMatch:
    x: relax.Expr  # runtime int16/uint16 activation [..., K] (NCHW for a convolution)
    x_zero_point: int
    weight: ConstWeight  # [K, N] 8-bit, scales and zero points per tensor or per column
    bias_int: np.ndarray | None  # int64 [N] in accumulator units
    epilogue: Epilogue
    mult: np.ndarray  # float32 [N]: sx * sw / sy
    conv: ConvGeometry | None = None
    x_zero_point_expr = None  # (class constant) a constant zero point only: what _gemm_input reads

    def emit(self, builder, spec):
        return emit_qgemm16(builder, self, spec)


def _int16_activation(expr, lookup):
    """``dequantize(x)`` of a runtime 16-bit tensor with per-tensor constant parameters -> (x, QParams)."""
    dq = call_of(expr, "dequantize", lookup)
    if dq is None or dtype_of(dq.args[0]) not in A_DTYPES:
        return None
    p = qparams(dq, lookup, "activation dequantize")
    return None if p is None or not p.per_tensor else (dq.args[0], p)


def match_int16_linear(call, lookup, mode: str) -> Int16LinearMatch | None:
    from . import qdq_to_integer as q  # the 8-bit matcher's helpers (it imports this module lazily)

    if not call.op.same_as(tvm.ir.Op.get("relax.quantize")) or str(call.attrs.out_dtype) not in OUT_DTYPES:
        return None
    out = qparams(call, lookup, "output quantize")
    if out is None or not out.per_tensor:
        return None
    inner, lo, hi = q._activation_bounds(call.args[0], lookup)
    core, bias_expr = q._linear_operands(inner, lookup)
    if core is None:
        return None
    x = _int16_activation(core.args[0], lookup)
    if x is None:
        return None
    w, geometry = q._const_weight(core, lookup)
    if w is None or (geometry is not None and geometry.groups > 1):
        return None  # runtime or blocked weights, grouped or depthwise convolutions: the float path
    (data, xp), n = x, w.values.shape[1]
    acc_scale = np.broadcast_to(np.float32(xp.scale) * w.scale.astype(np.float32), (n,)).astype(np.float32)
    bias = None
    if bias_expr is not None:
        bias = q._bias(bias_expr, lookup, acc_scale)
        if bias is None:
            return None
    # float mode whatever ``mode`` says: a fixed-point product of a wide (int64) total needs > 64 bits
    epilogue = q._requant_epilogue(out, str(call.attrs.out_dtype), lo, hi, "float")
    mult = (acc_scale / np.float32(out.scale)).astype(np.float32)
    return Int16LinearMatch(data, int(xp.zero_point), w, bias, epilogue, mult, geometry)


def emit_qgemm16(builder, match: Int16LinearMatch, spec) -> relax.Expr | None:
    from .qdq_to_integer import _gemm_input

    recipe = spec.int16
    if recipe is None:
        return None  # the row has no int16 recipe (Arm, GPU rows): the layer stays float
    k, n = match.weight.values.shape
    a_dtype = dtype_of(match.x)
    try:
        plan = plan_accumulation(match.weight.values, match.x_zero_point, match.weight.zero_point, a_dtype,
                                 match.bias_int, recipe.intrin.kstep)
    except ValueError as err:
        raise LowPrecError(f"int16 x int8 {'convolution' if match.conv else 'matmul'} with K={k}, N={n}: {err}") from err
    x2, out_lead, perm = _gemm_input(builder, match)
    if x2 is None or static_shape(x2)[-1] != k:
        return None
    m = static_shape(x2)[0]
    problem = QGemm16Problem(m, n, k, a_dtype, match.epilogue, plan.chunk, plan.acc, plan.rowcoef is not None)
    layout = choose_layout(problem, recipe)
    kind = "qconv2d16" if match.conv is not None else "qgemm16"
    name = f"{kind}_{a_dtype}_{m}x{n}x{k}_{plan.acc}"
    gvar = builder.add_func(build_qgemm16(problem, layout, name).with_attr("op_pattern", 8), name)
    params = qgemm16_params(problem, layout, plan, match.mult)
    # (relax.const makes an int64 array int32 unless told its dtype)
    args = [x2, relax.const(pack_weights(plan.b_signed, layout))] + [relax.const(p, str(p.dtype)) for p in params]
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((m, n), match.epilogue.out_dtype)))
    if out_lead is not None:
        y = builder.emit(relax.op.reshape(y, (*out_lead, n)))
    if perm is not None:
        y = builder.emit(relax.op.permute_dims(y, perm))
    return y
