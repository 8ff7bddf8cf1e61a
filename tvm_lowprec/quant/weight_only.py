"""Pass: ``matmul(x_float, dequantize(W_const))``  ==>  one weight-only kernel that keeps ``W`` narrow.

Runs first in phase 1 of :mod:`tvm_lowprec.pipeline`, on the module :func:`tvm_lowprec.from_onnx`
(or :func:`tvm_lowprec.quantize`) produces, before FoldConstant would turn the dequantized weights
into a float32 constant. A weight is taken when it is one of the marked dequantize kernels of
:mod:`.dequantized` applied to constants (blocked int4 weights from ``MatMulNBits`` or a blocked
QDQ model, float8 weights, bf16 weights of a PTQ ``bfloat16`` layer) and the other operand is a
float activation. Each kind of weight has its emitter in :func:`emitters` (one file each); an
emitter returns ``None`` when it does not take the weight (its shape, its values or the target), and
the matmul then stays as it was: float, correct.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
from tvm import relax

from ..errors import LowPrecError
from .dequantized import dequantized_constant
from .patterns import mutate_relax_functions

ACTIVATIONS = ("float", "int8")


@dataclass(frozen=True)
class WeightOnlyConfig:
    """How weight-only layers (int4 weights of ``MatMulNBits`` or blocked QDQ, float8 weights) run.

    activations : {"float", "int8"}
        ``"float"`` (default; what ONNX defines): activations stay float32 and the weights are
        widened to float in registers. ``"int8"``: each row of activations is quantized on the fly,
        one symmetric int8 scale per K block (``max|x| / 127``), as ONNX Runtime's ``MatMulNBits``
        with ``accuracy_level=4`` does, and the block's integer dot products run on the row's
        integer instruction; faster, and about 0.3 % off the float result (see docs/numerics.md).
    """

    activations: str = "float"

    def __post_init__(self):
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"WeightOnlyConfig.activations must be one of {ACTIVATIONS}, not {self.activations!r}")


@functools.cache
def emitters() -> dict:
    """Weight kind (:class:`~.dequantized.DequantizedConst`'s ``kind``) -> its emitter (imported on first use)."""
    from .weight_bf16 import emit_bfloat16
    from .weight_fp8 import emit_float8
    from .weight_int4 import emit_int4

    return {"blocked": emit_int4, "float8": emit_float8, "bfloat16": emit_bfloat16}


def _float_activation(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "float32"


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, spec, config: WeightOnlyConfig):
        super().__init__(mod)
        self.mod, self.spec, self.config, self.rewritten = mod, spec, config, 0
        self.error = None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if self.error is not None or not call.op.same_as(tvm.ir.Op.get("relax.matmul")):
            return call
        x, w = call.args
        dq = dequantized_constant(w, self.lookup_binding, self.mod)
        if dq is None or not _float_activation(x):
            return call
        emitter = emitters().get(dq.kind)
        try:
            new = emitter(self.builder_, x, dq, self.spec, self.config) if emitter is not None else None
        except LowPrecError as err:
            self.error = err
            return call
        if new is None:
            return call
        self.rewritten += 1
        return new


def weight_only_module(mod, spec, config: WeightOnlyConfig | None = None):
    """Apply the rewrite to every Relax function of ``mod`` (plain Python: errors keep their type)."""
    return mutate_relax_functions(mod, _Rewriter(mod, spec, config or WeightOnlyConfig()))
