"""Walks over a kernel's statement nest, with an explicit stack (no Python recursion).

TVM 0.27's Python API has no statement mutator for ``tirx`` (``stmt_functor`` is gone), and the TIR
passes of this library each need one: :mod:`tvm_lowprec.stack_allocations` rewrites allocations,
:mod:`tvm_lowprec.parallel_grain` loops, :mod:`tvm_lowprec.schedule.column_tail` a loop of a
schedule's nest. :func:`map_nest` is the one rebuild they share.

The statements that nest others are sequences, loops (``For``, ``While``), attributes, branches and
blocks (``SBlockRealize``: scheduled functions before lowering). Anything else is a leaf.
"""

from __future__ import annotations

from typing import Callable, Optional

from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize


def _seq(stmt) -> list:
    return list(stmt)


def _body(stmt) -> list:
    return [stmt.body]


def _branches(stmt) -> list:
    return [stmt.then_case] if stmt.else_case is None else [stmt.then_case, stmt.else_case]


def _block_body(stmt) -> list:
    return [stmt.block.body]


# by exact type (a dictionary lookup: ``isinstance`` on TVM's node classes goes through ``abc`` and was
# most of a walk's time); the statement classes are final
_CHILDREN = {tirx.SeqStmt: _seq, tirx.For: _body, tirx.While: _body, tirx.AttrStmt: _body,
             tirx.IfThenElse: _branches, SBlockRealize: _block_body}


def _children(stmt) -> list:
    get = _CHILDREN.get(type(stmt))
    return get(stmt) if get is not None else []


def _rebuild(stmt, kids: list):
    """``stmt`` with its nested statements replaced by ``kids`` (in :func:`_children`'s order)."""
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt(kids)
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, kids[0], stmt.thread_binding,
                        stmt.annotations)
    if isinstance(stmt, tirx.While):
        return tirx.While(stmt.condition, kids[0])
    if isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, kids[0])
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, kids[0], kids[1] if len(kids) > 1 else None)
    block = stmt.block
    block = SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, kids[0], block.init,
                   block.alloc_buffers, block.match_buffers, block.annotations)
    return SBlockRealize(stmt.iter_values, stmt.predicate, block)


def map_nest(stmt, rewrite: Callable[[object], Optional[object]]):
    """``stmt`` with every statement for which ``rewrite`` returns a statement replaced by it (that
    one is not searched further); where it returns None, the statement is kept and its nested
    statements are searched. Unchanged parts keep their identity (``same_as``)."""
    # pre-order: a node is either replaced or expanded; post-order: its children are reassembled
    out: list = []
    stack: list = [(stmt, None)]
    while stack:
        node, kids = stack.pop()
        if kids is not None:  # all its children are on ``out``
            new = [out.pop() for _ in range(kids)][::-1]
            old = _children(node)
            out.append(node if all(a.same_as(b) for a, b in zip(new, old)) else _rebuild(node, new))
            continue
        replaced = rewrite(node)
        if replaced is not None:
            out.append(replaced)
            continue
        children = _children(node)
        stack.append((node, len(children)))
        stack.extend((child, None) for child in reversed(children))
    return out[0]
