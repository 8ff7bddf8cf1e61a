"""Looking up blocks that a PrimFunc may or may not have."""

from __future__ import annotations

import tvm
from tvm.s_tir.schedule import ScheduleError


def find_block(sch, name: str):
    """The block called ``name``, or None when the function has none (an optional step)."""
    try:
        return sch.get_sblock(name)
    except ScheduleError:
        return None


def root_children(sch) -> tuple[object, list]:
    """(the root block or None, the blocks directly under it): te-made functions have a root block,
    TVMScript ones may not (then no blocks)."""
    root = find_block(sch, "root")
    return root, (list(sch.get_child_blocks(root)) if root is not None else [])


def epilogue_under(sch, name: str, loop, lanes: int) -> None:
    """The elementwise epilogue block ``name`` moved under ``loop`` (the row tile, or a panel) and its
    innermost loop vectorized, split to ``lanes`` first where it is a longer multiple of them (the
    float GEMMs: float8, float32, bf16)."""
    epi = sch.get_sblock(name)
    sch.reverse_compute_at(epi, loop, preserve_unit_loops=True)
    inner = sch.get_loops(epi)[-1]
    extent = sch.get(inner).extent
    if hasattr(extent, "value") and int(extent.value) > lanes and int(extent.value) % lanes == 0:
        _, inner = sch.split(inner, [None, lanes])
    sch.vectorize(inner)


_OPERANDS = ("a", "b", "value", "condition", "true_value", "false_value")  # a TIR node's sub-expressions


def subexpressions(expr):
    """Every node of the TIR expression ``expr`` (a store's value), parents first; TVM 0.27 keeps no
    Python TIR visitor."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        for name in _OPERANDS:
            child = getattr(node, name, None)
            if isinstance(child, tvm.ir.expr.Expr):
                stack.append(child)
        for name in ("args", "indices"):
            stack.extend(c for c in getattr(node, name, ()) if isinstance(c, tvm.ir.expr.Expr))
