"""Schedule rule for reductions over axes that are not the innermost: a softmax over the bins of a
YOLO-style DFL head (``1x4x4x8000``, axis 1), a global average pool over H and W of an NHWC tensor.

TVM's dlight row rule parallelises whatever axes lie outside the reduction, recomputes the reduced
values once per output row (4x over for the DFL softmax) and leaves the reductions scalar. Here the
innermost axis, which the reductions carry along, is the vector axis; every block is computed for one
vector of it at a time::

    for outer in parallel(output axes but the reduced and the innermost, innermost // V):
      for block in producers:                # row maxima, exponentials, sums, ...
        for <block's other axes>:           # the reduced ones included
          for lane in vectorize(V): ...      # contiguous along the innermost axis
      for reduced axes: for lane in vectorize(V): out[...] = ...

Declines a function whose reductions run along the innermost axis of what they read (a row
reduction, a GEMM's A operand) or that has none.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule

from .blocks import root_children, subexpressions
from .window import contiguous_in_last_spatial_axis, schedule_window

_VECTORS = (16, 8)  # float32 lanes per iteration: two ymm registers, else one
_MIN_PARALLEL = 1 << 12
# A long column walk (a group norm over 1599 frames of an NWC tensor) reads one 64-byte line per row and
# vector: the hardware prefetchers follow short strides poorly. From this many reduced elements per
# output, each parallel iteration takes a strip of up to _STRIP vectors (contiguous bytes per row).
_LONG_WALK = 256
_STRIP = (4, 2)


def strip_of(walk: int, inner: int, lanes: int) -> int:
    """Vectors per parallel iteration for ``walk`` reduced elements per output and an innermost axis of
    ``inner``: a strip of :data:`_STRIP` vectors on a long walk where it divides and leaves two
    iterations, else one."""
    return next((k for k in _STRIP if walk >= _LONG_WALK and inner % (k * lanes) == 0 and inner // (k * lanes) >= 2), 1)


def _vars(expr) -> list:
    from tvm.tirx.analysis import undefined_vars

    return list(undefined_vars(expr))


def _reduced_axes(block, rank: int) -> set[int] | None:
    """Axes of the rank-``rank`` buffers ``block`` reads that its reduction variables index; None when a
    reduction variable indexes the innermost axis (not this rule's kind) or a buffer of another rank."""
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == 2]
    axes = set()
    for region in block.reads:
        hits = {i for i, r in enumerate(region.region) if any(v.same_as(x) for v in _vars(r.min) for x in reduce)}
        if not hits:
            continue
        if len(region.region) != rank or rank - 1 in hits:
            return None
        axes |= hits
    return axes or None


def _static(sch, loops) -> bool:
    return all(hasattr(sch.get(l).extent, "value") for l in loops)


class StridedReductionRule:
    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        return schedule_strided(func)


def schedule_strided(func):
    """The loop nest above for ``func`` (also the 8-bit softmax along an axis that is not the last,
    :mod:`~tvm_lowprec.schedule.rows`), or None where it does not apply."""
    sch = Schedule(func)
    root, blocks = root_children(sch)
    if not blocks:
        return None
    out = blocks[-1]
    stmt = sch.get(out)
    if any(iv.iter_type != 0 for iv in stmt.iter_vars):  # the reduction writes the output itself
        return _reduction_last(sch, blocks)
    if len(blocks) < 2:
        return None
    loops = sch.get_loops(out)
    rank = len(stmt.iter_vars)
    if len(loops) != rank or not _static(sch, loops):
        return None
    reducers = [b for b in blocks[:-1] if any(iv.iter_type == 2 for iv in sch.get(b).iter_vars)]
    if not reducers:
        return None
    reduced = set()
    for block in reducers:
        axes = _reduced_axes(sch.get(block), rank)
        if axes is None:
            return None
        reduced |= axes
    inner = int(sch.get(loops[-1]).extent.value)
    lanes = next((v for v in _VECTORS if inner % v == 0), None)
    if lanes is None:
        return None
    # Step 1. the output: other axes, the vector axis's outer part (parallel), reduced axes, vector
    others = [l for i, l in enumerate(loops[:-1]) if i not in reduced]
    across = [l for i, l in enumerate(loops[:-1]) if i in reduced]
    walk = 1
    for l in across:
        walk *= int(sch.get(l).extent.value)
    strip = strip_of(walk, inner, lanes)
    vec_outer, vec = sch.split(loops[-1], [None, strip * lanes])
    sch.reorder(*others, vec_outer, *across, vec)
    outer = sch.fuse(*others, vec_outer) if others else vec_outer
    # Step 2. element-wise producers with one reader inlined (a softmax's subtraction and division);
    # every other producer computed for that vector, its own vector axis innermost
    blocks = _inline_single_use(sch, blocks)
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_at(block, outer)
    except tvm.s_tir.schedule.ScheduleError:
        return None
    for block in blocks[:-1]:
        if _gathers(sch.get(block)):  # a table lookup: LLVM's loop vectorizer emits vgatherdps, TVM's
            continue                  # scalarizes it (the DFL head's 8-bit softmax: 45 -> 39 us on Zen 5)
        if not _vectorize_along_written_last_axis(sch, block, outer, lanes, strip):
            return None
    if strip > 1:
        _, vec = sch.split(vec, [strip, lanes])
    sch.vectorize(vec)
    total = int(sch.get(outer).extent.value) * lanes * strip
    for l in across:
        total *= int(sch.get(l).extent.value)
    if total >= _MIN_PARALLEL and int(sch.get(outer).extent.value) > 1:
        sch.parallel(outer)
    return sch


def _gathers(block) -> bool:
    """Whether ``block`` reads some buffer at a position that another buffer's value gives (a table)."""
    return any(isinstance(node, tvm.ir.expr.TensorLoad) for region in block.reads for r in region.region
               for node in subexpressions(r.min))


def _reduction_last(sch, blocks):
    """A reduction that writes the output (a sum over axis 0): as a pooling window of any size, its
    producers inlined."""
    try:
        for producer in blocks[:-1]:
            sch.compute_inline(producer)
    except tvm.s_tir.schedule.ScheduleError:
        return None
    stmt = sch.get(blocks[-1])
    if not any(iv.iter_type == 0 for iv in stmt.iter_vars) or not contiguous_in_last_spatial_axis(stmt):
        return None
    return schedule_window(sch, blocks[-1])


def _inline_single_use(sch, blocks):
    """``blocks`` less the element-wise ones inlined into their one reader, except a value per row
    (fewer axes than its reader: inlined, it would be computed once per element of the row, a
    softmax's reciprocal of the row sum)."""
    kept, live = [], list(blocks)
    for block in blocks[:-1]:
        stmt = sch.get(block)
        readers = [b for b in live if any(r.source.same_as(w.source) for r in sch.get(b).reads for w in stmt.writes)]
        per_row = readers and len(stmt.iter_vars) < len(sch.get(readers[0]).iter_vars)
        if len(readers) == 1 and all(iv.iter_type == 0 for iv in stmt.iter_vars) and not per_row:
            try:
                sch.compute_inline(block)
                live.remove(block)
                continue
            except tvm.s_tir.schedule.ScheduleError:
                pass
        kept.append(block)
    return kept + [blocks[-1]]


def _realize(node, block):
    """The SBlockRealize of ``block`` under ``node`` (a loop nest)."""
    if isinstance(node, tvm.s_tir.SBlockRealize):
        return node if node.block.same_as(block) else _realize(node.block.body, block)
    if isinstance(node, tvm.tirx.SeqStmt):
        return next((r for r in (_realize(s, block) for s in node.seq) if r is not None), None)
    body = getattr(node, "body", None)
    return _realize(body, block) if body is not None else None


def _vectorize_along_written_last_axis(sch, block, outer, lanes, strip: int = 1) -> bool:
    """The producer's loop that the last axis of what it writes moves with, moved innermost and
    vectorized (a strip of several vectors: split, its vectors in turn)."""
    stmt = sch.get(block)
    realize = _realize(sch.get(outer), stmt)
    if realize is None or not stmt.writes or not stmt.writes[0].region:
        return False
    last = _vars(stmt.writes[0].region[-1].min)
    which = [i for i, iv in enumerate(stmt.iter_vars) if any(iv.var.same_as(v) for v in last)]
    if len(which) != 1 or stmt.iter_vars[which[0]].iter_type != 0:
        return False
    loops = sch.get_loops(block)
    at = [sch.get(l).same_as(sch.get(outer)) for l in loops]
    if True not in at:
        return False
    mine = loops[at.index(True) + 1:]
    bound = _vars(realize.iter_values[which[0]])
    moving = [l for l in mine if any(sch.get(l).loop_var.same_as(v) for v in bound)]
    if len(moving) != 1 or int(sch.get(moving[0]).extent.value) != lanes * strip:
        return False
    vec = moving[0]
    sch.reorder(*[l for l in mine if not l.same_as(vec)], vec)
    if strip > 1:
        _, vec = sch.split(vec, [strip, lanes])
    sch.vectorize(vec)
    return True
