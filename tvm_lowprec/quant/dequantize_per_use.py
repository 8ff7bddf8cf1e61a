"""Pass: a dequantized tensor read by several operators is dequantized by each of them.

``dequantize`` is cheap arithmetic on one byte; its float32 result is four times the bytes. When two
operators read it (a squeeze-excite block: the global average pool and the gate's multiply; a residual
add beside the next layer) TVM's operator fusion cannot fuse it into either, and writes the whole
float tensor to memory once to read it twice (a text detector's 1x240x240x16: a 4.4 MiB kernel,
0.15-0.19 ms). Here every use gets its own copy of the call, which fusion then puts inside the
consumer's kernel: the consumers read the 8-bit codes. Exact (the same operation on the same values).
A ``mean`` (a squeeze-excite's pool) takes no fused producer in TVM (a legalized mean is "out-elementwise
fusable"): where the pool runs over H and W of an NHWC tensor, :mod:`~tvm_lowprec.quant.integer_mean`
has already made it an integer sum of the codes, which fuses; a pool along the innermost axes keeps a
dequantize kernel of its own.

Runs last among the Relax rewrites, before legalization and fusion.
"""

from __future__ import annotations

import collections

import tvm
from tvm import relax

from .patterns import bindings, mutate_relax_functions


def _shared_dequantizes(mod) -> set[str]:
    """Names of the variables bound to a ``dequantize`` that more than one call reads."""
    dequantize = tvm.ir.Op.get("relax.dequantize")
    shared = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        found = bindings(func)
        bound = {b.var.name for b in found if isinstance(b.value, relax.Call) and b.value.op.same_as(dequantize)}
        uses = collections.Counter(a.name for b in found if isinstance(b.value, relax.Call)
                                   for a in _operands(b.value) if isinstance(a, relax.Var) and a.name in bound)
        shared |= {name for name, count in uses.items() if count > 1}
    return shared


def _operands(call) -> list:
    """A call's arguments, a tuple argument's fields (a concatenation's pieces) one by one."""
    return [f for a in call.args for f in (a.fields if isinstance(a, relax.Tuple) else [a])]


@relax.expr_functor.mutator
class _PerUse(relax.PyExprMutator):
    def __init__(self, mod, shared):
        super().__init__(mod)
        self.shared = shared

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        args = [relax.Tuple([self._copy(f) for f in a.fields]) if isinstance(a, relax.Tuple) else self._copy(a)
                for a in call.args]
        if all(new.same_as(old) for new, old in zip(args, call.args)):
            return call
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def _copy(self, arg):
        """A fresh dequantize for ``arg`` where it is a shared one, else ``arg``."""
        value = self.lookup_binding(arg) if isinstance(arg, relax.Var) and arg.name in self.shared else None
        if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.dequantize"))):
            return arg
        return self.builder_.emit(relax.Call(value.op, value.args, value.attrs, value.ty_args))


def dequantize_per_use_module(mod):
    """Apply the pass to every Relax function of ``mod`` (unchanged where no dequantize is shared)."""
    shared = _shared_dequantizes(mod)
    if not shared:
        return mod
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mod, _PerUse(mod, shared)))
