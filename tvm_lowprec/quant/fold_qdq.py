"""Pass: keep data movement in the integer domain.

``quantize(op(dequantize(x, s, z)), s, z)`` with the same per-tensor constant parameters and dtype
becomes ``op(x)`` for operators that only move or select values (reshape, transpose, squeeze,
expand_dims, flatten, max pooling: they commute with the monotone dequantize), and
``quantize(dequantize(x, s, z), s, z)`` becomes ``x``. Exact: for |x - z| <= 255,
``rint(float32(float32((x - z) * s) / s)) == x - z``.

Runs after :mod:`~tvm_lowprec.quant.qdq_to_integer` and before legalization. Pairs with different
parameters (a requantization) are left for a later pass.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .patterns import call_of, constant, dtype_of, first_call, mutate_relax_functions

MOVEMENT_OPS = ("reshape", "permute_dims", "squeeze", "expand_dims", "flatten", "nn.max_pool2d")


def _same_params(q, dq, lookup) -> bool:
    values = [constant(e, lookup) for e in (q.args[1], q.args[2], dq.args[1], dq.args[2])]
    if any(v is None or np.asarray(v).size != 1 for v in values):
        return False
    qs, qz, ds, dz = (np.asarray(v).reshape(()) for v in values)
    return qs == ds and int(qz) == int(dz) and str(q.attrs.out_dtype) == dtype_of(dq.args[0])


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(tvm.ir.Op.get("relax.quantize")):
            return call
        lookup = self.lookup_binding
        dq = call_of(call.args[0], "dequantize", lookup)
        if dq is not None and _same_params(call, dq, lookup):
            self.folded += 1
            return dq.args[0]
        move = first_call(call.args[0], MOVEMENT_OPS, lookup)
        dq = call_of(move.args[0], "dequantize", lookup) if move is not None else None
        if dq is None or not _same_params(call, dq, lookup):
            return call
        self.folded += 1
        return self.builder_.emit(relax.Call(move.op, [dq.args[0], *move.args[1:]], move.attrs))


def fold_qdq_module(mod):
    """Apply the fold to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Folder(mod))
