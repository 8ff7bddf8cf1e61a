"""Pass: a float function of one 8-bit tensor becomes a 256-entry table lookup.

``quantize(f(dequantize(x)))`` where ``f`` is any element-wise chain (Sigmoid, SiLU written as
``x * Sigmoid(x)``, GELU written with Erf, Tanh, with quantize/dequantize pairs in between) whose only
non-constant input is the 8-bit tensor ``x`` (the longest such chain: walking back, the chain stops at
the last 8-bit value from which it is still a function of one tensor) has at most 256 distinct results: this pass computes them
once at compile time, in numpy with the kernels' float32 semantics (:mod:`~tvm_lowprec.quant.table_eval`;
the 1108 chains of 20 zoo models give the same tables as TVM's compiled operators, which compute
those the evaluator does not know), and replaces the chain with ``take(table, x)``. The output is the same as the float chain's, element for element, for
every input value (the table *is* the chain, evaluated on all 256 inputs), and the transcendental
functions leave the run-time graph.

On a CPU row with a vector byte lookup (:attr:`~tvm_lowprec.hwspec.TargetSpec.lookup_intrin`:
``vpermi2b``, ``vpshufb``, Neon ``tbl``) the table becomes a lookup kernel of its own
(:mod:`tvm_lowprec.kernels.lookup`) over the flattened tensor, and every chain of at least the
instruction's ``min_ops`` operators is replaced (decomposed hard-swish ``x * clip(x + 3, 0, 6) / 6``
with a quantize/dequantize pair after each op has 12; ``vpermi2b`` takes even a lone requantization);
chains with an expensive operator (:data:`COSTLY`) always are. Elsewhere (GPU rows) only those are,
as ``take(table, x)``. Every parameter on the chain must be a scalar
constant (per-tensor); per-channel parameters make the function depend on the position, and the chain
stays as it is (a PRelu slope of one element is LeakyRelu's, one per channel is declined). Reshapes and
transposes on the chain (an exporter's Reshape after GELU, a transpose the layout pass left before an
activation after a convolution) move to after the table, onto the 8-bit codes (:data:`MOVES`). All tables of a module are computed together.

Runs after :mod:`~tvm_lowprec.quant.fold_qdq` and before legalization.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.ir.prim.expr import FloatImm, IntImm

from ..native_build import build_executable
from ..kernels.lookup import build_lookup
from . import table_eval
from .legalize import LEGALIZE
from .patterns import bindings as function_bindings, dtype_of, is_scalar_constant, static_shape

# transcendental (or otherwise costly) unary functions: a chain with one of them is always a table
_TRANSCENDENTAL = ("sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt", "nn.gelu", "nn.gelu_tanh", "nn.silu",
                   "nn.softplus", "nn.selu", "power", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan",
                   "asinh", "acosh", "atanh")
ELEMENTWISE = frozenset(
    f"relax.{name}"
    for name in ("quantize", "dequantize", "nn.relu", "nn.leakyrelu", "nn.prelu", "clip", "astype", "negative", "abs",
                 "sign", "square", "add", "subtract", "multiply", "divide", "maximum", "minimum", "round", "floor",
                 "ceil", "trunc", "greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "where",
                 "logical_not", "logical_and", "logical_or", *_TRANSCENDENTAL)
)
COSTLY = frozenset(f"relax.{name}" for name in _TRANSCENDENTAL)
# Movements on the chain. The table commutes with them: it runs on the leaf, and the movements run
# after it, on the 8-bit codes. Those that keep the elements in row-major order (an exporter's Reshape
# between GELU and the next Gemm, which ORT's quantize_static leaves unquantized) need only the final
# shape; a transpose (one that the layout pass left before an activation it does not know, after a
# convolution) is replayed. Two chain values meet in an operator only where the same transposes
# made both (x * sigmoid(x) with x transposed once), else the chain is declined.
SHAPE_ONLY = frozenset(f"relax.{name}" for name in ("reshape", "expand_dims", "squeeze", "flatten"))
TRANSPOSE = "relax.permute_dims"
MOVES = SHAPE_ONLY | {TRANSPOSE}
EIGHT_BIT = ("uint8", "int8")
# A chain is cut at the first 8-bit value past CUT_OPS operators (the value becomes its leaf, and the
# part above it a table of its own: the composition of two tables is the chain, exactly), and declined
# past MAX_OPS operators without an 8-bit value to cut at. The walk back recurses once per operator, so
# these bound its depth whatever the graph's length (3000 Q/DQ'd element-wise ops make a few dozen tables).
CUT_OPS, MAX_OPS = 48, 160


@dataclass
class _Chain:
    quantize: relax.Call  # the chain's final quantize (the binding to replace)
    leaf: relax.Var  # the one 8-bit input
    body: relax.Expr  # the chain rebuilt over a [256] parameter of the leaf's dtype
    ops: int  # element-wise operators folded (its quantizes and dequantizes included)
    shape: tuple | None = None  # the final quantize's shape, where movements on the chain change the leaf's
    transposes: tuple = ()  # (input shape, axes) of each transpose from the leaf to the quantize, in order


class _ChainBuilder:
    """Walks back from a quantize through element-wise bindings; rebuilds the chain over ``param``."""

    def __init__(self, bindings, params):
        self.bindings, self.params = bindings, params
        self.leaf, self.costly, self.ops, self.memo = None, False, 0, {}
        # a source expression -> the transposes between the leaf and it (a tuple, () for the leaf and
        # what reshapes alone made from it); constants have none (None: they meet any value)
        self.views = {}

    def rebuild(self, expr):
        if isinstance(expr, (FloatImm, IntImm)):
            return expr  # a scalar operand written as a literal (clip's bounds)
        if is_scalar_constant(expr):
            return relax.const(np.asarray(expr.value.numpy()).reshape(()))
        if isinstance(expr, relax.Var):  # a DAG: a value read twice is rebuilt (and counted) once
            if expr not in self.memo:
                self.memo[expr] = self._rebuild_var(expr)
                is_leaf = self.leaf is not None and self.leaf.same_as(expr)
                self.views[expr] = () if is_leaf else self.views.get(self.bindings.get(expr))
            return self.memo[expr]
        return self._rebuild_call(expr)

    def _rebuild_var(self, expr):
        value = self.bindings.get(expr)
        if isinstance(value, relax.Var):
            return self.rebuild(value)
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and (value.op.name in ELEMENTWISE or value.op.name in MOVES)):
            return self._leaf(expr)
        if static_shape(expr) is None or dtype_of(expr) not in EIGHT_BIT:
            return self.rebuild(value)
        if self.ops >= CUT_OPS:
            return self._leaf(expr)
        # an 8-bit value computed element-wise: the chain goes on through it where it can, else starts
        # here (a sigmoid after a requantizing concatenation: a table of the code the concatenation wrote)
        saved = (self.leaf, self.costly, self.ops, dict(self.memo))
        try:
            return self.rebuild(value)
        except _Declined:
            self.leaf, self.costly, self.ops, self.memo = saved
            return self._leaf(expr)

    def _rebuild_call(self, expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in MOVES:
            return self._rebuild_move(expr)
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ELEMENTWISE):
            raise _Declined
        self._check_no_broadcast(expr)
        self.costly |= expr.op.name in COSTLY
        self.ops += 1
        if self.ops > MAX_OPS:
            raise _Declined
        if expr.op.name == "relax.nn.prelu":  # one slope for every channel: leakyrelu's select(x > 0, x, x * a)
            x, slope = self.rebuild(expr.args[0]), self.rebuild(expr.args[1])
            if not isinstance(slope, tvm.ir.expr.Constant):
                raise _Declined  # a slope computed from the input: not PRelu as exporters write it
            self.views[expr] = self.views.get(expr.args[0])
            return relax.op.nn.leakyrelu(x, float(slope.value.numpy()))
        # operands other than vars first: a per-channel constant declines before the walk goes on up
        order = sorted(range(len(expr.args)), key=lambda i: isinstance(expr.args[i], relax.Var))
        rebuilt = {i: self.rebuild(expr.args[i]) for i in order}
        args = [rebuilt[i] for i in range(len(expr.args))]
        views = {self.views.get(a) for a in expr.args} - {None}
        if len(views) > 1:
            raise _Declined  # two values of the chain in different element orders
        self.views[expr] = views.pop() if views else None
        if expr.op.name in ("relax.quantize", "relax.dequantize"):  # scalar parameters: any axis is fine
            op = relax.op.quantize if expr.op.name == "relax.quantize" else relax.op.dequantize
            return op(args[0], args[1], args[2], -1, str(expr.attrs.out_dtype))
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)

    def _rebuild_move(self, expr):
        """A movement: the identity on the [256] values; a transpose is recorded in the view."""
        x = self.rebuild(expr.args[0])
        view = self.views.get(expr.args[0])
        if expr.op.name == TRANSPOSE and view is not None:
            shape = static_shape(expr.args[0])
            if shape is None:
                raise _Declined
            axes = expr.attrs.axes
            axes = tuple(range(len(shape)))[::-1] if axes is None else tuple(int(a) for a in axes)
            view = (*view, (shape, axes))
        self.views[expr] = view
        return x

    @staticmethod
    def _check_no_broadcast(expr):
        """Each tensor operand of an element-wise op has the op's element count: with reshapes on the
        chain, two of its values meet element for element only so (no operand broadcast along an axis);
        a per-channel constant operand (a PRelu slope, a per-axis scale) is declined by ``rebuild``."""
        out = static_shape(expr)
        if out is None:
            raise _Declined
        for arg in expr.args:
            if isinstance(arg, relax.Var) and isinstance(arg.ty, relax.TensorType):
                shape = static_shape(arg)
                if shape is None or (int(np.prod(shape)) != int(np.prod(out)) and int(np.prod(shape)) != 1):
                    raise _Declined

    def _leaf(self, var):
        if static_shape(var) is None or dtype_of(var) not in EIGHT_BIT:
            raise _Declined
        if self.leaf is not None and not self.leaf.same_as(var):
            raise _Declined  # a function of two tensors (a residual add): no table
        self.leaf = var
        return self.params[dtype_of(var)]


class _Declined(Exception):
    pass


def find_chains(func, min_ops: int | None = None) -> tuple[list[_Chain], dict]:
    """The replaceable chains of ``func`` and the [256] parameters they are rebuilt over: those with
    a :data:`COSTLY` operator, and with ``min_ops`` given, every chain of at least that many ops."""
    bindings = {b.var: b.value for b in function_bindings(func)}
    params = {dt: relax.Var(f"table_{dt}", relax.TensorType((256,), dt)) for dt in EIGHT_BIT}
    growing = _feeding_growth(bindings)
    chains = []
    for var, value in bindings.items():
        if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.quantize"))):
            continue
        if dtype_of(value) not in EIGHT_BIT:
            continue
        builder = _ChainBuilder(bindings, params)
        try:
            body = builder.rebuild(value)
        except _Declined:
            continue
        wanted = builder.costly or (min_ops is not None and (builder.ops >= min_ops or var in growing))
        if wanted and builder.leaf is not None:
            chains.append(_Chain(value, builder.leaf, body, builder.ops, static_shape(var), builder.views.get(value) or ()))
    return chains, params


def _feeding_growth(bindings) -> set:
    """The vars read only by movement operators that, alone or through further movements, make more
    elements than they read (the requantization :mod:`~tvm_lowprec.quant.fold_qdq` moves before an
    upsampling): a lookup kernel of their own, whatever their length, or fusion would compute them
    once per output element."""
    from .fold_qdq import MOVEMENT_OPS, grows

    moves = {f"relax.{name}" for name in MOVEMENT_OPS}
    readers: dict = {}
    for var, value in bindings.items():
        for arg in getattr(value, "args", ()):
            if isinstance(arg, relax.Var):
                readers.setdefault(arg, []).append(var)

    def feeds(start) -> bool:
        """Every reader of ``start`` a movement, and each of them makes more elements than ``start``
        has, itself or through its own readers (a worklist over the readers)."""
        todo = [start]
        while todo:
            users = readers.get(todo.pop(), [])
            if not users:
                return False
            for user in users:
                call = bindings[user]
                if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in moves):
                    return False
                if not grows(start, call):
                    todo.append(user)
        return True

    return {var for var in bindings if feeds(var)}


def _table_inputs(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype)


# the tables are computed by a generic x86-64/AArch64 LLVM target, whatever the row: IEEE float32 math
# (no FMA contraction, no fast math), the same bits on every host. Without LLVM's optimizations
# (opt-level 0): 256 values per chain need no fast code, and LLVM's -O3 on a few hundred chains took
# most of the pass (YOLO11n: 185 chains 5.2 -> 1.8 s; the tables of YOLO11n, EfficientNet-B0 and
# ConvNeXt-T bit-identical at -O0, -O1 and -O3, as IEEE semantics without fast math promise)
TABLE_TARGET = {"kind": "llvm", "opt-level": 0}


def evaluate_tables(chains, params) -> list[np.ndarray]:
    """Every chain's table (index = input - dtype's min): in numpy (:mod:`~tvm_lowprec.quant.table_eval`),
    and those with an operator it does not know from one function compiled for the host."""
    tables = table_eval.evaluate(chains, params, {dt: _table_inputs(dt) for dt in EIGHT_BIT})
    rest = [i for i, table in enumerate(tables) if table is None]
    for i, table in zip(rest, compiled_tables([chains[i] for i in rest], params) if rest else ()):
        tables[i] = table
    return tables


def compiled_tables(chains, params) -> list[np.ndarray]:
    """The chains' tables from one function compiled by TVM for the host."""
    bb = relax.BlockBuilder()
    with bb.function("tables", [params["uint8"], params["int8"]]):
        with bb.dataflow():
            outs = [bb.emit(chain.body) for chain in chains]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    # our quantize (NaN -> the lowest code, quant/legalize.py), as the kernels the table replaces have;
    # one kernel per chain (fused: a few hundred chains compile in a third of the time they take unfused)
    target = tvm.target.Target(TABLE_TARGET)
    tables = tvm.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(), relax.get_pipeline("default"),
    ])(bb.get())
    _, runnable = build_executable(tables, target)  # LLVM's back end in a child (native_build)
    vm = relax.VirtualMachine(runnable, tvm.cpu())
    result = vm["tables"](*(tvm.runtime.tensor(_table_inputs(dt)) for dt in EIGHT_BIT))
    return [result[i].numpy() for i in range(len(chains))]


@relax.expr_functor.mutator
class _Replacer(relax.PyExprMutator):
    def __init__(self, mod, chains, tables, intrin=None):
        super().__init__(mod)
        self.pending = list(zip(chains, tables))
        self.intrin = intrin
        self.replaced = 0

    def visit_call_(self, call):
        for chain, table in self.pending:
            if call.same_as(chain.quantize):
                self.replaced += 1
                x = self.visit_expr(chain.leaf)
                table = np.roll(table, -128) if dtype_of(chain.leaf) == "int8" else table  # index = the bits as uint8
                if self.intrin is not None:
                    return self._lookup_kernel(x, chain, table)
                if dtype_of(chain.leaf) == "int8":
                    x = relax.op.astype(x, "uint8")
                y = relax.op.take(relax.const(table), x, axis=0, mode="clip")  # in range by construction
                return _moved(y, static_shape(chain.leaf), chain)
        return super().visit_call_(call)

    def _lookup_kernel(self, x, chain, table):
        shape, in_dtype, out_dtype = static_shape(chain.leaf), dtype_of(chain.leaf), str(table.dtype)
        n = int(np.prod(shape))
        name = f"lookup_{in_dtype[0]}8_{out_dtype[0]}8_{n}"
        func = build_lookup(n, in_dtype, out_dtype, self.intrin, chain.ops, name)
        gvar = self.builder_.add_func(func, name)
        flat = relax.op.reshape(x, (n,)) if len(shape) != 1 else x
        y = relax.call_tir(gvar, [flat, relax.const(self.intrin.pack(table))], relax.TensorType((n,), out_dtype))
        return _moved(y, (n,), chain)


def _moved(y, shape, chain):
    """The looked-up codes ``y`` (of ``shape``, the leaf's elements in its order) moved as the chain
    moved them: its transposes replayed, then the final quantize's shape."""
    for in_shape, axes in chain.transposes:
        if tuple(shape) != tuple(in_shape):
            y = relax.op.reshape(y, in_shape)
        y = relax.op.permute_dims(y, axes)
        shape = tuple(in_shape[a] for a in axes)
    out = chain.shape or shape
    return y if tuple(out) == tuple(shape) else relax.op.reshape(y, out)


def lookup_tables_module(mod, spec=None):
    """Apply the pass to every Relax function of ``mod``; ``spec``: the target row, whose byte lookup
    (if any) runs the tables."""
    intrin = getattr(spec, "lookup_intrin", None)
    mod = relax.transform.DeadCodeElimination()(mod)  # readers counted among live bindings only
    replaced = False
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        chains, params = find_chains(func, intrin.min_ops if intrin is not None else None)
        if not chains:
            continue
        replacer = _Replacer(mod, chains, evaluate_tables(chains, params), intrin)
        replacer.builder_.update_func(gvar, replacer.visit_expr(func))
        mod, replaced = replacer.builder_.get(), True
    return _without_dead_lookups(mod) if replaced else mod


def _without_dead_lookups(mod):
    """Dead bindings removed, and the lookup kernels no binding calls any more: a chain inside a longer
    one (SiLU's quantized sigmoid) is replaced too, then left unused by the longer chain's table."""
    mod = relax.transform.DeadCodeElimination()(mod)
    used = {g.name_hint for func in mod.functions.values() if isinstance(func, relax.Function)
            for g in relax.analysis.all_global_vars(func)}
    for gvar, func in list(mod.functions.items()):
        is_lookup = isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and func.attrs.get("lowprec.op", None) == "lookup"
        if is_lookup and gvar.name_hint not in used:
            del mod[gvar]
    return mod
