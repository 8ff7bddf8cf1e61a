"""Pass: a float function of one 8-bit tensor becomes a 256-entry table lookup.

``quantize(f(dequantize(x)))`` where ``f`` is any element-wise chain (Sigmoid, SiLU written as
``x * Sigmoid(x)``, GELU written with Erf, Tanh, with quantize/dequantize pairs in between) whose only
non-constant input is the 8-bit tensor ``x`` has at most 256 distinct results: this pass computes them
once at compile time, with TVM's own float operators (no fast-math approximation), and replaces the
chain with ``take(table, x)``. The output is the same as the float chain's, element for element, for
every input value (the table *is* the chain, evaluated on all 256 inputs), and the transcendental
functions leave the run-time graph.

Only chains with an expensive operator (:data:`COSTLY`) are replaced: a plain requantization or a
clamp is cheaper as vector arithmetic than as a gather. Every parameter on the chain must be a scalar
constant (per-tensor); per-channel parameters make the function depend on the position, and the chain
stays as it is. All tables of a module are computed in one compiled function.

Runs after :mod:`~tvm_lowprec.quant.fold_qdq` and before legalization.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .patterns import bindings as function_bindings, dtype_of, static_shape

ELEMENTWISE = frozenset(
    f"relax.{name}"
    for name in ("quantize", "dequantize", "nn.relu", "clip", "sigmoid", "tanh", "exp", "log", "erf", "sqrt",
                 "rsqrt", "astype", "negative", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.softplus", "abs",
                 "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "round", "floor", "ceil")
)
COSTLY = frozenset(
    f"relax.{name}"
    for name in ("sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt", "nn.gelu", "nn.gelu_tanh", "nn.silu",
                 "nn.softplus", "power")
)
EIGHT_BIT = ("uint8", "int8")


@dataclass
class _Chain:
    quantize: relax.Call  # the chain's final quantize (the binding to replace)
    leaf: relax.Var  # the one 8-bit input
    body: relax.Expr  # the chain rebuilt over a [256] parameter of the leaf's dtype


def _is_scalar_constant(expr) -> bool:
    shape = static_shape(expr) if isinstance(expr, tvm.ir.expr.Constant) else None
    return shape is not None and int(np.prod(shape)) == 1


class _ChainBuilder:
    """Walks back from a quantize through element-wise bindings; rebuilds the chain over ``param``."""

    def __init__(self, bindings, params):
        self.bindings, self.params = bindings, params
        self.leaf, self.costly = None, False

    def rebuild(self, expr):
        if _is_scalar_constant(expr):
            return relax.const(np.asarray(expr.value.numpy()).reshape(()))
        if isinstance(expr, relax.Var):
            value = self.bindings.get(expr)
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ELEMENTWISE:
                return self.rebuild(value)
            if isinstance(value, relax.Var):
                return self.rebuild(value)
            return self._leaf(expr)
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ELEMENTWISE):
            raise _Declined
        self.costly |= expr.op.name in COSTLY
        args = [self.rebuild(a) for a in expr.args]
        if expr.op.name in ("relax.quantize", "relax.dequantize"):  # scalar parameters: any axis is fine
            op = relax.op.quantize if expr.op.name == "relax.quantize" else relax.op.dequantize
            return op(args[0], args[1], args[2], -1, str(expr.attrs.out_dtype))
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)

    def _leaf(self, var):
        if static_shape(var) is None or dtype_of(var) not in EIGHT_BIT:
            raise _Declined
        if self.leaf is not None and not self.leaf.same_as(var):
            raise _Declined  # a function of two tensors (a residual add): no table
        self.leaf = var
        return self.params[dtype_of(var)]


class _Declined(Exception):
    pass


def find_chains(func) -> tuple[list[_Chain], dict]:
    """The replaceable chains of ``func`` and the [256] parameters they are rebuilt over."""
    bindings = {b.var: b.value for b in function_bindings(func)}
    params = {dt: relax.Var(f"table_{dt}", relax.TensorType((256,), dt)) for dt in EIGHT_BIT}
    chains = []
    for value in bindings.values():
        if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.quantize"))):
            continue
        if dtype_of(value) not in EIGHT_BIT:
            continue
        builder = _ChainBuilder(bindings, params)
        try:
            body = builder.rebuild(value)
        except _Declined:
            continue
        if builder.costly and builder.leaf is not None:
            chains.append(_Chain(value, builder.leaf, body))
    return chains, params


def _table_inputs(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype)


def evaluate_tables(chains, params) -> list[np.ndarray]:
    """All chains' tables from one function compiled for the host (index = input - dtype's min)."""
    bb = relax.BlockBuilder()
    with bb.function("tables", [params["uint8"], params["int8"]]):
        with bb.dataflow():
            outs = [bb.emit(chain.body) for chain in chains]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    exe = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    result = vm["tables"](*(tvm.runtime.tensor(_table_inputs(dt)) for dt in EIGHT_BIT))
    return [result[i].numpy() for i in range(len(chains))]


@relax.expr_functor.mutator
class _Replacer(relax.PyExprMutator):
    def __init__(self, mod, chains, tables):
        super().__init__(mod)
        self.pending = list(zip(chains, tables))
        self.replaced = 0

    def visit_call_(self, call):
        for chain, table in self.pending:
            if call.same_as(chain.quantize):
                self.replaced += 1
                x = self.visit_expr(chain.leaf)
                if dtype_of(chain.leaf) == "int8":  # index by the same bits read as uint8
                    x, table = relax.op.astype(x, "uint8"), np.roll(table, -128)
                return relax.op.take(relax.const(table), x, axis=0, mode="clip")  # in range by construction
        return super().visit_call_(call)


def lookup_tables_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        chains, params = find_chains(func)
        if not chains:
            continue
        replacer = _Replacer(mod, chains, evaluate_tables(chains, params))
        replacer.builder_.update_func(gvar, replacer.visit_expr(func))
        mod = replacer.builder_.get()
    return mod
