"""The reads of a fused chain of copies made affine again, where they are.

Inlining a chain of reshapes and transposes composes their index maps: a YOLO head's NHWC codes
``[400, 80]`` read back as NCHW ``[1, 80, 400]`` through four reshapes and a transpose become, per
element, ``lv[(p % 400 // 20 * 1600 + p % 20 * 80 + (p // 400 + c) % 80) % 32000 // 80, ...]``, which
is ``lv[p, c]`` on the block's domain; TVM's simplifier does not see it, and the vectorized loop
divides every lane's position back into indices (the head's dequantize-and-concatenate: 89 us for
44 100 values, Zen 4, one thread, alone).

:func:`affine_loads` evaluates each such index (one with a division or a remainder) on every point
of its block's domain (numpy, at most :data:`MAX_POINTS` points) and, where every index of a load
is exactly ``c0 + sum(c_k * v_k)`` over that whole domain, writes that form instead; the block's
read regions are derived again from its new body. Anything else is left as it is.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import tirx
from tvm.ir.expr import Call
from tvm.ir.expr import TensorLoad as _Load  # what tirx.BufferLoad makes in TVM 0.27
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir.analysis import get_sblock_read_write_region
from tvm.tirx import expr as E

from ..kernel_cost import param_buffers
from ..tir_nest import map_nest
from .blocks import subexpressions
from .byte_transpose import evaluate_index

MAX_POINTS = 1 << 21  # a domain larger than this is left alone (the evaluation's memory and time)

_BINARY = (E.Add, E.Sub, E.Mul, E.Div, E.Mod, E.FloorDiv, E.FloorMod, E.Min, E.Max, E.EQ, E.NE, E.LT, E.LE,
           E.GT, E.GE, E.And, E.Or, E.LShift, E.RShift, E.BitwiseAnd, E.BitwiseOr, E.BitwiseXor)


def _children(expr) -> list:
    if isinstance(expr, _BINARY):
        return [expr.a, expr.b]
    if isinstance(expr, (E.Cast, E.Not)):
        return [expr.value if isinstance(expr, E.Cast) else expr.a]
    if isinstance(expr, E.Select):
        return [expr.condition, expr.true_value, expr.false_value]
    if isinstance(expr, Call):
        return list(expr.args)
    if isinstance(expr, _Load):
        return list(expr.indices)
    return []


def _rebuild(expr, kids: list):
    if isinstance(expr, _BINARY):
        return type(expr)(kids[0], kids[1])
    if isinstance(expr, E.Cast):
        return E.Cast(expr.ty, kids[0])
    if isinstance(expr, E.Not):
        return E.Not(kids[0])
    if isinstance(expr, E.Select):
        return E.Select(kids[0], kids[1], kids[2])
    if isinstance(expr, Call):
        return Call(expr.op, kids, expr.attrs, expr.ty_args, None, expr.ty)
    return tirx.BufferLoad(expr.source, kids)


_SELECT = tvm.ir.Op.get("prim.if_then_else")


def _branch_bounds(cond, bounds: dict):
    """The bounds (var -> [lo, hi)) of ``if_then_else(cond, then, else)``'s two branches, where
    ``cond`` compares a variable with a constant (a concatenation's ``c <= v``); else ``bounds``."""
    a, b = getattr(cond, "a", None), getattr(cond, "b", None)
    kinds = {E.LE: (0, 1), E.LT: (1, 1), E.GE: (1, 0), E.GT: (0, 0)}  # as `c OP v`: (cut offset, v above)
    if type(cond) not in kinds:
        return bounds, bounds
    if isinstance(a, E.IntImm) and isinstance(b, E.Var):
        var, c = b, int(a.value)
        offset, above = kinds[type(cond)]
    elif isinstance(b, E.IntImm) and isinstance(a, E.Var):  # `v OP c` is `c OP' v`
        var, c = a, int(b.value)
        offset, above = {E.LE: (1, 0), E.LT: (0, 0), E.GE: (0, 1), E.GT: (1, 1)}[type(cond)]
    else:
        return bounds, bounds
    cut = c + offset
    if var not in bounds:
        return bounds, bounds
    lo, hi = bounds[var]
    upper, lower = dict(bounds), dict(bounds)
    upper[var], lower[var] = (max(lo, cut), hi), (lo, min(hi, cut))
    return (upper, lower) if above else (lower, upper)


def map_loads(expr, rewrite, bounds: dict):
    """``expr`` with every load replaced by ``rewrite(load, bounds)`` (its indices rewritten first), or
    kept where that returns None; ``bounds``: var -> [lo, hi), narrowed under the branches of an
    ``if_then_else`` on a variable (a concatenation's pieces). An explicit stack, post-order."""
    out: list = []
    stack: list = [(expr, None, bounds)]
    while stack:
        node, count, where = stack.pop()
        if count is None:
            kids = _children(node)
            stack.append((node, len(kids), where))
            if isinstance(node, Call) and isinstance(node.op, tvm.ir.Op) and node.op.same_as(_SELECT):
                then, other = _branch_bounds(kids[0], where)
                scopes = [where, then, other]
            else:
                scopes = [where] * len(kids)
            stack.extend((kid, None, scope) for kid, scope in reversed(list(zip(kids, scopes))))
            continue
        kids = [out.pop() for _ in range(count)][::-1]
        if count and not all(a.same_as(b) for a, b in zip(kids, _children(node))):
            node = _rebuild(node, kids)
        if isinstance(node, _Load):
            replaced = rewrite(node, where)
            node = node if replaced is None else replaced
        out.append(node)
    return out[0]


def _divides(expr) -> bool:
    return any(isinstance(node, (E.FloorDiv, E.FloorMod, E.Div, E.Mod)) for node in subexpressions(expr))


def _affine(index, axes, grid):
    """``index`` as ``c0 + sum(c_k * v_k)`` if it is exactly that at every point of ``grid`` (var ->
    its values, each along its own axis), else None."""
    values = evaluate_index(index, grid)
    if values is None:
        return None
    shape = tuple(grid[v].size for v in axes)
    if 0 in shape:
        return None
    values = np.broadcast_to(values, shape)
    origin = (0,) * len(axes)
    coefs = []
    for k in range(len(axes)):
        step = tuple(1 if j == k else 0 for j in range(len(axes)))
        coefs.append(int(values[step]) - int(values[origin]) if shape[k] > 1 else 0)
    c0 = int(values[origin]) - sum(c * int(np.ravel(grid[v])[0]) for c, v in zip(coefs, axes))
    fitted = np.full(shape, c0, dtype=np.int64)
    for var, c in zip(axes, coefs):
        if c:
            fitted = fitted + c * grid[var]
    if not np.array_equal(fitted, values):
        return None
    dtype = str(index.ty)
    result = tirx.const(c0, dtype)
    for var, c in zip(axes, coefs):
        if c:
            result = result + (var if c == 1 else var * tirx.const(c, dtype))
    return result


def _block_loads(block):
    """``block`` with its loads' indices made affine where they are (None: nothing changed)."""
    axes = [iv.var for iv in block.iter_vars]
    if not axes or not isinstance(block.body, tirx.BufferStore):
        return None
    extents = [iv.dom.extent for iv in block.iter_vars]
    if not all(isinstance(e, E.IntImm) and isinstance(iv.dom.min, E.IntImm) and iv.dom.min.value == 0
               for e, iv in zip(extents, block.iter_vars)):
        return None
    if math.prod(int(e.value) for e in extents) > MAX_POINTS:
        return None
    shape = {iv.var: int(e.value) for iv, e in zip(block.iter_vars, extents)}
    changed = []

    def rewrite(load, bounds):
        if not any(_divides(i) for i in load.indices):
            return None
        grid = {}
        for k, var in enumerate(axes):
            view = [1] * len(axes)
            lo, hi = bounds.get(var, (0, shape[var]))
            view[k] = max(hi - lo, 0)
            grid[var] = np.arange(lo, hi, dtype=np.int64).reshape(view)
        new = [_affine(i, axes, grid) if _divides(i) else i for i in load.indices]
        if any(i is None for i in new):
            return None
        changed.append(load)
        return tirx.BufferLoad(load.source, new)

    store = block.body
    value = map_loads(store.value, rewrite, {var: (0, shape[var]) for var in axes})
    if not changed:
        return None
    return tirx.BufferStore(store.buffer, value, store.indices)


def affine_loads(func):
    """``func`` with every block's loads made affine where they are on its domain (see the module);
    the same object where nothing changed."""
    buffers = {buffer: buffer for buffer in param_buffers(func)}  # TVM 0.27: a buffer is its own variable

    def rewrite(stmt):
        if not isinstance(stmt, SBlockRealize) or stmt.block.name_hint == "root":
            if isinstance(stmt, SBlockRealize):
                for buffer in stmt.block.alloc_buffers:
                    buffers[buffer] = buffer
            return None
        body = _block_loads(stmt.block)
        if body is None:
            return stmt
        block = stmt.block
        probe = SBlock(block.iter_vars, [], [], block.name_hint, body, block.init, block.alloc_buffers,
                       block.match_buffers, block.annotations)
        reads, _ = get_sblock_read_write_region(probe, buffers)
        block = SBlock(block.iter_vars, reads, block.writes, block.name_hint, body, block.init,
                       block.alloc_buffers, block.match_buffers, block.annotations)
        return SBlockRealize(stmt.iter_values, stmt.predicate, block)

    body = map_nest(func.body, rewrite)
    return func if body.same_as(func.body) else func.with_body(body)
