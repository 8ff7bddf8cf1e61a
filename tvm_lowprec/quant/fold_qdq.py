"""Pass: keep data movement in the integer domain.

``quantize(op(dequantize(x, s, z)), s, z)`` with the same per-tensor constant parameters and dtype
becomes ``op(x)`` for operators that only move or select values (reshape, transpose, squeeze,
expand_dims, flatten, max pooling: they commute with the monotone dequantize), and
``quantize(dequantize(x, s, z), s, z)`` becomes ``x``. A ``split`` of a dequantized tensor whose
outputs are quantized back with the same parameters (a YOLO C2f block's ``Split``, each output with its
Q/DQ pair) splits the codes: ``quantize(split(dequantize(x))[i])`` becomes ``split(x)[i]``, the integer
split emitted once for all its outputs (a float split left for other uses is removed as dead code).
Exact: for |x - z| <= 255,
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
        self._splits = {}  # the float split call -> its integer twin's var

    def _split_item(self, call, lookup):
        """``split(x)[i]`` for ``quantize(split(dequantize(x))[i])`` with matching parameters, else None."""
        item = call.args[0]
        if isinstance(item, relax.Var):
            item = lookup(item)
        if not isinstance(item, relax.TupleGetItem):
            return None
        split = call_of(item.tuple_value, "split", lookup)
        dq = call_of(split.args[0], "dequantize", lookup) if split is not None else None
        if dq is None or not _same_params(call, dq, lookup):
            return None
        key = item.tuple_value
        twin = next((v for k, v in self._splits.items() if k.same_as(key)), None)
        if twin is None:
            twin = self.builder_.emit(relax.Call(split.op, [dq.args[0], *split.args[1:]], split.attrs))
            self._splits[key] = twin
        self.folded += 1
        return self.builder_.emit(relax.TupleGetItem(twin, item.index))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(tvm.ir.Op.get("relax.quantize")):
            return call
        lookup = self.lookup_binding
        dq = call_of(call.args[0], "dequantize", lookup)
        if dq is not None and _same_params(call, dq, lookup):
            self.folded += 1
            return dq.args[0]
        item = self._split_item(call, lookup)
        if item is not None:
            return item
        move = first_call(call.args[0], MOVEMENT_OPS, lookup)
        dq = call_of(move.args[0], "dequantize", lookup) if move is not None else None
        if dq is None or not _same_params(call, dq, lookup):
            return call
        self.folded += 1
        return self.builder_.emit(relax.Call(move.op, [dq.args[0], *move.args[1:]], move.attrs))


def fold_qdq_module(mod):
    """Apply the fold to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Folder(mod))
