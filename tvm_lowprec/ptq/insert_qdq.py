"""Pass: FP32 layers -> QDQ layers, the form that :func:`tvm_lowprec.compile` turns into integer kernels.

For each planned layer: ``core(x, W)`` becomes ``core(dequantize(quantize(x)), dequantize(W_q))`` with
``W_q`` the weights quantized here, at compile time (a second activation operand gets a run-time
quantize/dequantize pair instead), and the layer's output (after its bias and
activation) becomes ``dequantize(quantize(out))``, and so does a SiLU after it that the plan quantizes
(:attr:`LayerPlan.activation`). Exactly ONNX's QDQ form, so the integer rewrite
(:mod:`tvm_lowprec.quant.qdq_to_integer`) recognises it; the float bias stays float (the rewrite folds
it into the int32 accumulator).

Blocked (per-group) and 4-bit matmul weights are written with
:func:`tvm_lowprec.quant.dequantized.emit_blocked_dequantize` instead (Relax's dequantize has no
blocked scales), which the weight-only rewrite (:mod:`tvm_lowprec.quant.weight_only`) recognises.
A weight-only plan (``x`` and ``output`` None) leaves the activations float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from ..quant.dequantized import emit_bf16_widen, emit_blocked_dequantize
from .layers import Layer


@dataclass(frozen=True)
class TensorQuant:
    """Scale(s) and zero point(s) of one tensor; ``axis`` for per-channel values."""

    scale: np.ndarray  # float32, () or [C]
    zero_point: np.ndarray  # dtype, same shape
    dtype: str
    axis: int = -1
    limits: tuple[int, int] | None = None  # the integer range used, if narrower than dtype's (7-bit weights)

    def quantize(self, values: np.ndarray) -> np.ndarray:
        info = np.iinfo(self.dtype)
        lo, hi = self.limits or (info.min, info.max)
        shape = [1] * values.ndim
        if self.scale.ndim:
            shape[self.axis] = -1
        s, z = self.scale.reshape(shape), self.zero_point.astype(np.int32).reshape(shape)
        return np.clip(np.rint(values.astype(np.float32) / s) + z, lo, hi).astype(self.dtype)

    def consts(self):
        return relax.const(self.scale.astype(np.float32)), relax.const(self.zero_point.astype(self.dtype))

    def dequantized(self, builder, operand):
        """A second activation operand, quantized and dequantized at run time."""
        return builder.emit(_qdq(builder, operand, self))


@dataclass(frozen=True)
class ConstWeight:
    """Constant weights quantized here (``values`` in ``quant.dtype``), dequantized by Relax's dequantize."""

    values: np.ndarray
    quant: TensorQuant

    def dequantized(self, builder, operand):
        scale, zp = self.quant.consts()
        return builder.emit(relax.op.dequantize(relax.const(self.values), scale, zp, self.quant.axis, "float32"))


@dataclass(frozen=True)
class BlockedWeight:
    """Matmul weights [K, N] with one scale (and zero point) per ``block`` rows of K and column:
    ``values`` in an 8-bit carrier (int8 for int4, uint8 for uint4), ``scale`` float32 and
    ``zero_point`` (carrier dtype; None for symmetric int4, whose zero point is 0) [ceil(K / block), N]."""

    values: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    block: int

    def dequantized(self, builder, operand):
        zp = None if self.zero_point is None else relax.const(self.zero_point)
        return emit_blocked_dequantize(builder, relax.const(self.values), relax.const(self.scale.astype(np.float32)),
                                       zp, 0, self.block)


@dataclass(frozen=True)
class Bf16Weight:
    """Weights rounded to bfloat16 (``QuantSpec("bfloat16")``): ``bits`` their bf16 bits (uint16, the
    weight's shape). A matmul's are written as a marked widening (:func:`emit_bf16_widen`), which the
    weight-only rewrite runs on the bf16 GEMM where the target has one; a conv2d's as the float32
    constant of the same values (float32 math on the rounded weights, on every row)."""

    bits: np.ndarray
    conv: bool = False

    def dequantized(self, builder, operand):
        if self.conv:
            from ..kernels.bf16_gemm import bf16_to_float32

            return relax.const(bf16_to_float32(self.bits))
        return emit_bf16_widen(builder, relax.const(self.bits))


@dataclass(frozen=True)
class LayerPlan:
    """What to write for one layer: ``x``/``output`` None for float activations (weight-only);
    ``weight`` any of :class:`TensorQuant` (a run-time second operand), :class:`ConstWeight`,
    :class:`BlockedWeight`. ``scheme``: a label for the accuracy report."""

    layer: Layer
    x: TensorQuant | None
    weight: TensorQuant | ConstWeight | BlockedWeight | Bf16Weight
    output: TensorQuant | None
    scheme: str = ""
    note: str = ""  # an adjustment quantize made (weight scales widened so the bias fits int32)
    activation: TensorQuant | None = None  # the SiLU after the output (Layer.activation), where quantized


def _qdq(builder, expr, q: TensorQuant):
    scale, zp = q.consts()
    quantized = builder.emit(relax.op.quantize(expr, scale, zp, q.axis, q.dtype))
    return relax.op.dequantize(quantized, scale, zp, q.axis, "float32")


@relax.expr_functor.mutator
class _Inserter(relax.PyExprMutator):
    def __init__(self, mod, plans: list[LayerPlan]):
        super().__init__(mod)
        self.plans = plans

    def visit_call_(self, call):
        original = call
        call = super().visit_call_(call)
        for plan in self.plans:
            if original.same_as(plan.layer.core):
                x = call.args[0] if plan.x is None else self.builder_.emit(_qdq(self.builder_, call.args[0], plan.x))
                wd = plan.weight.dequantized(self.builder_, call.args[1])
                call = relax.Call(call.op, [x, wd], call.attrs, call.ty_args)
            if original.same_as(plan.layer.output_call) and plan.output is not None:
                call = _qdq(self.builder_, self.builder_.emit(call), plan.output)
            if plan.activation is not None and original.same_as(plan.layer.activation_call):
                call = _qdq(self.builder_, self.builder_.emit(call), plan.activation)
        return call


def insert_qdq(mod, plans: list[LayerPlan]):
    """``mod`` (a :func:`~.layers.prepare`-d module) with the planned layers in QDQ form, dataflow restored."""
    inserter = _Inserter(mod, plans)
    gvar = mod.get_global_var("main")
    inserter.builder_.update_func(gvar, inserter.visit_expr(mod["main"]))
    return relax.transform.ConvertToDataflow()(inserter.builder_.get())
