"""Pass: grouped-query attention reads its key/value cache once, not once per query head.

A decoder with fewer key/value heads ``G`` than query heads ``H = G * R`` (Qwen2, Llama 3, Mistral)
is exported with the cache repeated to ``H`` heads before each attention product (transformers'
``repeat_kv``)::

    rep = reshape(broadcast_to(expand_dims(kv, 2), [b, G, R, T, d]), [b, H, T, d])
    scores = matmul(q, permute_dims(rep, [0, 1, 3, 2]))       # q: [b, H, s, d]
    out = matmul(p, rep)                                       # p: [b, H, s, T]

The repeated cache is ``R`` copies of every key and value, written and read again at every step: at
a decode step the attention is nothing but reading the cache, so this is ``R`` times the memory it
needs (Qwen2.5-0.5B: ``R = 7``). Query head ``g * R + r`` reads key/value head ``g``, and the query
heads of a group are consecutive, so the same products are those of the ``R * s`` rows of each
group against the group's own cache::

    scores = reshape(matmul(reshape(q, [b, G, R * s, d]), permute_dims(kv, [0, 1, 3, 2])), [b, H, s, T])
    out = reshape(matmul(reshape(p, [b, G, R * s, T]), kv), [b, H, s, d])

Every reshape here keeps the element order (a view where a length is symbolic:
:func:`~tvm_lowprec.quant.legalize.legalize_reshape`). Each output element is the same dot product in
the same order, so the result is unchanged. Float matmuls only: a quantized attention keeps its
Q/DQ pattern for :mod:`~tvm_lowprec.quant.qdq_to_integer`.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.sym import Analyzer

from .patterns import call_of, mutate_relax_functions

_LAST_TWO_SWAPPED = (0, 1, 3, 2)


def _dims(expr):
    shape = getattr(expr.ty, "shape", None)
    return list(shape) if shape is not None else None


def _same(a, b) -> bool:
    return Analyzer().can_prove_equal(a, b)


def _repeated_heads(expr, lookup):
    """``(kv, groups, repeats)`` where ``expr`` is ``kv`` ([b, G, T, d]) with each head repeated
    ``repeats`` times in place (``reshape(broadcast_to(expand_dims(kv, 2)))``), else None."""
    reshape = call_of(expr, "reshape", lookup)
    if reshape is None:
        return None
    broadcast = call_of(reshape.args[0], "broadcast_to", lookup)
    expand = call_of(broadcast.args[0], "expand_dims", lookup) if broadcast is not None else None
    if expand is None or [int(a) for a in expand.attrs.axis] != [2]:
        return None
    kv = expand.args[0]
    kv_dims, wide, out = _dims(kv), _dims(broadcast), _dims(reshape)
    if kv_dims is None or wide is None or out is None or len(kv_dims) != 4 or len(wide) != 5 or len(out) != 4:
        return None
    if not isinstance(wide[2], tvm.tirx.IntImm) or not isinstance(wide[1], tvm.tirx.IntImm):
        return None
    groups, repeats = int(wide[1]), int(wide[2])
    if repeats < 2 or not all(_same(wide[i], kv_dims[j]) for i, j in ((0, 0), (1, 1), (3, 2), (4, 3))):
        return None
    if not (_same(out[0], kv_dims[0]) and _same(out[1], groups * repeats) and _same(out[2], kv_dims[2])
            and _same(out[3], kv_dims[3])):
        return None
    return kv, groups, repeats


@relax.expr_functor.mutator
class _GroupedAttention(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
            return call
        a, x = call.args
        transposed = call_of(x, "permute_dims", self.lookup_binding)
        if transposed is not None:
            axes = transposed.attrs.axes
            if axes is None or tuple(int(v) for v in axes) != _LAST_TWO_SWAPPED:
                return call
            x = transposed.args[0]
        found = _repeated_heads(x, self.lookup_binding)
        a_dims, out_dims = _dims(a), _dims(call)
        if found is None or a_dims is None or out_dims is None or len(a_dims) != 4 or len(out_dims) != 4:
            return call
        kv, groups, repeats = found
        if not _same(a_dims[1], groups * repeats) or "float" not in str(a.ty.dtype):
            return call
        rows = self.builder_.emit(relax.op.reshape(a, [a_dims[0], groups, repeats * a_dims[2], a_dims[3]]))
        other = self.builder_.emit(relax.op.permute_dims(kv, list(_LAST_TWO_SWAPPED))) if transposed is not None else kv
        out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
        product = self.builder_.emit(relax.op.matmul(rows, other, out_dtype=out_dtype if out_dtype not in ("", "void") else None))
        return relax.op.reshape(product, out_dims)


def grouped_attention_module(mod):
    """Apply the pass to every Relax function of ``mod`` (the repeated cache's bindings dropped)."""
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mod, _GroupedAttention(mod)))
