"""Pass: an element-wise chain after a concatenation runs on each piece.

``f(concat([a, b, ...]))``, for ``f`` an element-wise operator whose other operands are scalar
constants (a quantize or dequantize with per-tensor parameters, a sigmoid, a clip), becomes
``concat([f(a), f(b), ...])``: the same operator on the same values, element for element, so the
result is identical. Applied down the chain, a YOLO head's class scores
``quantize(sigmoid(dequantize(concat(levels))))``, whose levels were requantized into the
concatenation's scale (:mod:`~tvm_lowprec.quant.fold_qdq`), become one chain per level, each a
function of that level's codes alone: one table lookup each
(:mod:`~tvm_lowprec.quant.lookup_tables`), and the concatenation a copy of codes. Left where it is,
the chain starts at the concatenation's codes, and every level pays a lookup for its requantization
and the concatenated tensor another for the chain.

Only where the concatenation is read by that operator alone (otherwise both would be computed), and
its pieces are data (not constants and shapes alone: an anchor grid's pieces are left to
FoldConstant). Where no table replaces a piece's chain, fusion puts the chains back into the
concatenation's kernel, which then computes what it computed before.

Runs after :mod:`~tvm_lowprec.quant.row_ops` and before :mod:`~tvm_lowprec.quant.lookup_tables`.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.prim.expr import FloatImm, IntImm

from .lookup_tables import ELEMENTWISE
from .patterns import call_of, is_scalar_constant, reads_an_input, use_counts


def _is_scalar(expr) -> bool:
    """A literal operand (clip's bounds) or a one-element constant."""
    return isinstance(expr, (FloatImm, IntImm)) or is_scalar_constant(expr)


@relax.expr_functor.mutator
class _Pusher(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.readers: dict = {}  # of the function being visited

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in ELEMENTWISE):
            return call
        data = [i for i, arg in enumerate(call.args) if not _is_scalar(arg)]
        if len(data) != 1:
            return call
        source = call.args[data[0]]
        if not isinstance(source, relax.Var) or self.readers.get(source, 0) != 1:
            return call
        cat = call_of(source, "concat", self.lookup_binding)
        if cat is None:
            return call
        fields = cat.args[0]
        if isinstance(fields, relax.Var):
            fields = self.lookup_binding(fields)
        if not isinstance(fields, relax.Tuple) or not all(reads_an_input(f, self.lookup_binding) for f in fields.fields):
            return call
        pieces = []
        for field in fields.fields:
            args = list(call.args)
            args[data[0]] = field
            pieces.append(self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args)))
        return relax.op.concat(pieces, int(cat.attrs.axis))


def through_concat_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    pusher = _Pusher(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            pusher.readers = use_counts(func)
            pusher.builder_.update_func(gvar, pusher.visit_expr(func))
    return pusher.builder_.get()
