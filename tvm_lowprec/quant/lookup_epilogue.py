"""Pass: a table lookup that reads an integer GEMM's output runs inside the GEMM.

A convolution followed by SiLU (or any chain of one 8-bit tensor that
:mod:`~tvm_lowprec.quant.lookup_tables` folded into a 256-entry table) is ``y = qgemm(...)``, then
``lookup(reshape(y))``: a kernel of its own that reads the GEMM's output back from memory. Where
``y`` has no other reader (through reshapes and aliases, each read once), the GEMM's output is 2-D
(``[M, N]``, no batch) and the table maps its 8-bit dtype to itself, the two become one kernel (:func:`with_lookup`): the GEMM's PrimFunc with the
packed table as a parameter before the output, and its output replaced by the looked-up values in
place. The scheduled GEMM runs the lookup on each parallel task's rows right after its epilogue wrote
them, while they are in cache (:mod:`tvm_lowprec.schedule.lookup_epilogue`); the unscheduled
function runs it after the GEMM (a trailing block, ``lookup_epilogue``), so it is a whole kernel by
itself. The kernel keeps ``lowprec.op = "qgemm"`` (its GOPS are the GEMM's) and says what it folded
in ``lowprec.folded``; the codes are those of the two kernels apart, bit for bit.

Runs after :mod:`~tvm_lowprec.quant.lookup_tables`, on the rows with a vector byte lookup.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..kernels.lookup import OP as LOOKUP, lookup_in_place
from .patterns import bindings, dtype_of, static_shape, use_counts

BLOCK = "lookup_epilogue"  # the trailing block of the unscheduled function
GEMM_NAME = "lowprec.lookup_gemm"  # the GEMM's own name, which its schedule (and tuning records) know it by
EIGHT_BIT = ("uint8", "int8")
# element movements between the GEMM and the lookup, read once each. Not transposes: moved after
# the lookup, a detector head's NHWC -> NCHW transposes fused with the concatenation that follows them
# into one gather-like kernel (19.6 us on a Zen 4; the byte transposes, lookups and copy it replaced: 12)
MOVES = ("reshape",)


def attrs_of(func) -> dict:
    return dict(func.attrs) if func.attrs is not None else {}


def root_items(func) -> list:
    """The statements of a PrimFunc's root block, in order."""
    body = func.body.block.body
    return list(body) if isinstance(body, tirx.SeqStmt) else [body]


def with_root_body(func, items, params, attrs):
    """``func`` with its root block's body made of ``items``, and ``params`` and ``attrs``."""
    realize, root = func.body, func.body.block
    body = items[0] if len(items) == 1 else tirx.SeqStmt(items)
    block = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init, root.alloc_buffers,
                   root.match_buffers, root.annotations)
    return tirx.PrimFunc(params, SBlockRealize(realize.iter_values, realize.predicate, block),
                         func.ret_type).with_attrs(attrs)


def with_lookup(gemm, intrin, folded: int, name: str):
    """The qgemm PrimFunc ``gemm`` with ``out = table[out]`` after it: params ``(..., table, out)``."""
    out = gemm.params[-1]
    table = tirx.decl_buffer((intrin.table_bytes,), str(out.dtype), "lookup_table")
    n = math.prod(int(extent) for extent in out.shape)
    lookup = SBlockRealize([], True, SBlock([], [], [], BLOCK, lookup_in_place(out, table, intrin, 0, n)))
    attrs = attrs_of(gemm)
    attrs.update({"global_symbol": name, GEMM_NAME: str(attrs.get("global_symbol", name)),
                  "lowprec.lookup": intrin.name, "lowprec.folded": int(folded)})
    return with_root_body(gemm, [*root_items(gemm), lookup], [*gemm.params[:-1], table, out], attrs)


def _prim_func(mod, call):
    """The PrimFunc a ``call_tir`` calls, or None."""
    if not (isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_tir"))):
        return None
    func = mod[call.args[0]] if call.args[0] in mod.get_global_vars() else None
    return func if isinstance(func, tirx.PrimFunc) else None


def _op(func) -> str | None:
    return attrs_of(func).get("lowprec.op", None) if func is not None else None


@relax.expr_functor.mutator
class _Fuser(relax.PyExprMutator):
    def __init__(self, mod, intrin):
        super().__init__(mod)
        self.mod_, self.intrin = mod, intrin
        self.fused = 0
        # the lookup's binding var -> (the qgemm call, its PrimFunc, the lookup's PrimFunc, the table, the
        # GEMM's output shape, the movements from it to the lookup's input)
        self.plans: dict = {}

    def plan(self, func):
        """Find the lookups to fuse in ``func``: the lookup's input, through reshapes each read once,
        is a qgemm's output read once."""
        bound = {b.var: b.value for b in bindings(func)}
        uses = use_counts(func)
        moves = [tvm.ir.Op.get(f"relax.{name}") for name in MOVES]
        for var, value in bound.items():
            lookup = _prim_func(self.mod_, value)
            if _op(lookup) != LOOKUP:
                continue
            flat, table = value.args[1].fields
            src, path = flat, []
            while isinstance(src, relax.Var) and uses.get(src, 0) == 1:
                value = bound.get(src)
                if isinstance(value, relax.Var):  # an alias binding
                    src = value
                    continue
                if not (isinstance(value, relax.Call) and any(value.op.same_as(m) for m in moves)):
                    break
                path.append(value)
                src = value.args[0]
            gemm_call = bound.get(src) if isinstance(src, relax.Var) and uses.get(src, 0) == 1 else None
            gemm = _prim_func(self.mod_, gemm_call)
            if _op(gemm) != "qgemm" or int(attrs_of(gemm).get("lowprec.batch", 0)) or "lowprec.lookup" in attrs_of(gemm):
                continue
            shape, dtype = static_shape(src), dtype_of(src)
            if (shape is None or len(shape) != 2 or dtype not in EIGHT_BIT or dtype_of(var) != dtype
                    or str(attrs_of(lookup)["lowprec.intrin"]) != f"lowprec_lookup_{self.intrin.name}"):
                continue  # the table is packed for the lookup kernel's instruction
            self.plans[var] = (gemm_call, gemm, lookup, table, shape, path[::-1])

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            return super().visit_var_binding_(binding)
        gemm_call, gemm, lookup, table, shape, path = plan
        name = f"{gemm_call.args[0].name_hint}_lookup"
        fused = with_lookup(gemm, self.intrin, int(attrs_of(lookup)["lowprec.folded"]), name)
        gvar = self.builder_.add_func(fused, name)
        args = [self.visit_expr(a) for a in gemm_call.args[1].fields] + [table]
        y = self.builder_.emit(relax.call_tir(gvar, args, relax.TensorType(shape, dtype_of(binding.var))))
        for move in path:  # the lookup is element-wise: the movements after the GEMM, replayed after it
            y = self.builder_.emit(relax.Call(move.op, [y, *[self.visit_expr(a) for a in move.args[1:]]], move.attrs))
        flat = relax.op.reshape(y, static_shape(binding.var))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(flat)))
        self.fused += 1


def lookup_epilogue_module(mod, spec=None):
    """Apply the pass to every Relax function of ``mod`` on a row with a vector byte lookup."""
    intrin = getattr(spec, "lookup_intrin", None)
    if intrin is None:
        return mod
    fuser = _Fuser(mod, intrin)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            fuser.plans = {}
            fuser.plan(func)
            if fuser.plans:
                fuser.builder_.update_func(gvar, fuser.visit_expr(func))
    if not fuser.fused:
        return mod
    mod = relax.transform.DeadCodeElimination()(fuser.builder_.get())
    used = {g.name_hint for func in mod.functions.values() if isinstance(func, relax.Function)
            for g in relax.analysis.all_global_vars(func)}
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc) and _op(func) in (LOOKUP, "qgemm") and gvar.name_hint not in used:
            del mod[gvar]
    return mod
