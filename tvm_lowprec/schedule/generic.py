"""Last-resort CPU schedule rule: every PrimFunc that the other rules decline gets a real schedule
instead of TVM's lowering as written (serial, scalar loops: 13.3 s per inference for mobilevit-v2's
nine linear-attention kernels, ``dequantize * scores -> quantize -> dequantize -> sum``).

Loop nest, one per *anchor* (the last block of the function, then each block that could not be
moved under an anchor's loop)::

    for outer in parallel(anchor's spatial axes, but those below; the vector axis's outer part):
      for block in producers:                # computed for this outer iteration (compute_at)
        for <block's other axes>: for lane in vectorize(V): ...   # along the axis it writes innermost
      for <axes a producer's value does not depend on, e.g. a softmax's bins>:
        for <reduction axes>:
          for lane in vectorize(V): anchor[...] = ...

1. Spatial (injective) producers are inlined into their one reader where that recomputes nothing,
   or recomputes only a cheap expression (a broadcast dequantize).
2. A block that reduces along the contiguous axis of what it reads (a row sum, the mean of a group
   norm's whole tensor) is rfactored into V partial sums computed as vectors, then V scalars summed
   in order (as :mod:`~tvm_lowprec.schedule.rows` does: within float rounding of the sum in order).
3. The anchor's spatial axes that a value it reads does not move with (the bins of a softmax over
   axis 1: its row sums do not depend on the bin) go inside, with the reductions; the other spatial
   axes are fused into the parallel loop (serial below :data:`MIN_PARALLEL` iterations of work),
   the innermost one split into steps first (:func:`_lanes`: the whole axis up to 64 elements, else
   the widest of 64, 32, 16 that divides it, else its widest divisor in 8..64, 2100 anchors in steps
   of 60), else it stays one contiguous loop for LLVM's loop vectorizer.
4. Every producer is computed at the parallel loop, its axis along the innermost axis of what it
   writes moved innermost and vectorized.

Every step that TVM refuses is skipped (each tried on a copy of the schedule), and the result is
built once (``tvm.compile`` of the one function): where that fails, the simplest safe schedule is
used instead, each block's outer spatial loops fused and parallel (:func:`outer_parallel`); where
even that fails to build, the rule declines (the kernel stays ``"none"``). The function records which
one it got in :data:`ATTR` (``"full"`` or ``"outer"``), which the pipeline reports as
``lowprec.schedule = "generic"``.
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from .blocks import root_children, subexpressions

_LOG = logging.getLogger(__name__)
ATTR = "lowprec.generic"  # "full" (this module's nest) or "outer" (the fallback: outer loops parallel only)
MIN_PARALLEL = 1 << 14  # iterations of a nest (its blocks' domains summed) below which it runs serially
_LANES = (16, 8)  # partial results of a reduction along the contiguous axis (rfactor): one zmm of float32
_RAGGED_MIN = 256  # a reduction this long that no full vector divides takes the widest divisor in 9..15
_STEP = 64  # elements per vectorized step: 4 zmm of float32 (16-lane steps made a strided softmax 1.5x slower)
_STEPS = (64, 32, 16)
_ODD_STEPS = range(_STEP, 7, -1)  # otherwise the widest divisor in 8..64 (multiples of 4 first)
_CHEAP = 12  # nodes of an expression that may be recomputed for every element of a broadcast reader


class GenericRule:
    """Accepts any PrimFunc with blocks (``verify``: build the result once to check it), symbolic
    extents included (a loop of unknown extent is parallelized or left, never split by a constant)."""

    symbolic = True

    def __init__(self, verify: bool = True):
        self.verify = verify

    def __repr__(self):
        return "GenericRule()"

    def apply(self, func, spec):
        for kind, make in (("full", schedule_generic), ("outer", outer_parallel)):
            marked = func.with_attr(ATTR, kind)
            try:
                sch = make(marked)
                if sch is not None and (not self.verify or _builds(sch, spec)):
                    return sch
            except Exception as error:  # noqa: BLE001 - a last resort never fails: the next form, or "none"
                _LOG.debug("generic schedule (%s) of %s failed: %s", kind, func.attrs.get("global_symbol", "?")
                           if func.attrs is not None else "?", error)
                continue
        return None


def _builds(sch, spec) -> bool:
    func = sch.mod["main"].with_attr("global_symbol", "lowprec_generic_check")
    try:
        with spec.tvm_target(2) as target:
            tvm.compile(tvm.IRModule({"main": func}), target=target)
    except Exception as error:  # noqa: BLE001
        _LOG.debug("generic schedule does not build: %s", error)
        return False
    return True


# -- helpers ----------------------------------------------------------------------------------------
def _int(expr) -> int | None:
    if isinstance(expr, int):
        return expr
    return int(expr.value) if hasattr(expr, "value") else None


def _vars(expr) -> list:
    from tvm.tirx.analysis import undefined_vars

    return list(undefined_vars(expr))


def _mentions(expr, var) -> bool:
    return any(v.same_as(var) for v in _vars(expr))


def _domain(stmt) -> int | None:
    sizes = [_int(iv.dom.extent) for iv in stmt.iter_vars]
    return None if any(s is None for s in sizes) else math.prod(sizes)


def _try(sch, step):
    """``step(copy)`` on a copy of ``sch``: (the copy, its result) where TVM accepts it, else (sch, None)."""
    trial = sch.copy()
    try:
        return trial, step(trial)
    except (tvm.s_tir.schedule.ScheduleError, tvm.TVMError, ValueError, TypeError, IndexError):
        return sch, None


def _realize(node, block):
    """The SBlockRealize of ``block`` under ``node``."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.s_tir.SBlockRealize):
            if node.block.same_as(block):
                return node
            stack.append(node.block.body)
        elif isinstance(node, tirx.SeqStmt):
            stack.extend(node.seq)
        else:
            stack.extend(c for c in (getattr(node, n, None) for n in ("body", "then_case", "else_case"))
                         if isinstance(c, tirx.Stmt))
    return None


def _bindings(sch, block, loops) -> list | None:
    """For each of ``loops`` (a block's loops, outermost first), the indices of the block's iter vars
    whose bound value mentions its variable; None where the realize cannot be found."""
    stmt = sch.get(block)
    realize = _realize(sch.get(loops[0]), stmt) if loops else None
    if realize is None:
        return None
    return [[i for i, value in enumerate(realize.iter_values) if _mentions(value, sch.get(l).loop_var)] for l in loops]


def _lanes(extent: int | None) -> int | None:
    """The vector step for an axis of ``extent``: the whole axis up to :data:`_STEP` elements, else
    the widest of 64, 32, 16 that divides it, else its widest divisor in 8..64 (a multiple of 4 first:
    2100 anchors in steps of 60), else None (the loop is left whole to LLVM's loop vectorizer)."""
    if extent is None or extent < 2:
        return None
    if extent <= _STEP:
        return extent
    for found in (next((v for v in _STEPS if extent % v == 0), None),
                  next((v for v in _ODD_STEPS if v % 4 == 0 and extent % v == 0), None),
                  next((v for v in _ODD_STEPS if extent % v == 0), None)):
        if found is not None:
            return found
    return None


def _cheap(stmt) -> bool:
    value = getattr(stmt.body, "value", None)
    if value is None:
        return False
    nodes = list(subexpressions(value))
    return len(nodes) <= _CHEAP and not any(isinstance(n, (tirx.Div, tirx.FloorDiv, tirx.Mod, tirx.FloorMod, tvm.ir.expr.Call))
                                            for n in nodes)


def _readers(sch, block, blocks) -> list:
    written = [w.source for w in sch.get(block).writes]
    return [b for b in blocks if not sch.get(b).same_as(sch.get(block))
            and any(r.source.same_as(w) for r in sch.get(b).reads for w in written)]


def _is_reduction(stmt) -> bool:
    return any(iv.iter_type != 0 for iv in stmt.iter_vars)


# -- 1. inlining ---------------------------------------------------------------------------------------
def _inline(sch, blocks) -> list:
    live = list(blocks)
    for block in blocks[:-1]:
        stmt = sch.get(block)
        if _is_reduction(stmt):
            continue
        readers = _readers(sch, block, live)
        if not readers:
            continue  # writes an output only
        mine = _domain(stmt)
        theirs = [_domain(sch.get(r)) for r in readers]
        recomputes = mine is None or any(t is None or t > mine for t in theirs) or len(readers) > 1
        if recomputes and not _cheap(stmt):
            continue
        trial, done = _try(sch, lambda s, b=block: s.compute_inline(b) or True)
        if done:
            sch = trial
            live = [b for b in live if b is not block]
    return sch, live


# -- 2.-4. the nest --------------------------------------------------------------------------------------
def _reads_last_axis(stmt, var) -> bool:
    return any(r.region and _mentions(r.region[-1].min, var) for r in stmt.reads)


def _rfactor(sch, anchor):
    """The anchor's one reduction along the contiguous axis of what it reads, as vectors of partial
    results: (schedule, the rfactor block) or (sch, None)."""
    stmt = sch.get(anchor)
    loops = sch.get_loops(anchor)
    binds = _bindings(sch, anchor, loops)
    reduce = [i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == 2]
    if binds is None or len(reduce) != 1 or not _reads_last_axis(stmt, stmt.iter_vars[reduce[0]].var):
        return sch, None
    loop = next((l for l, b in zip(loops, binds) if b == reduce), None)
    extent = _int(sch.get(loop).extent) if loop is not None else None
    lanes = next((v for v in _LANES if extent is not None and extent > v and extent % v == 0), None)
    if lanes is None and extent is not None and extent >= _RAGGED_MIN:
        # a long axis no vector divides (wav2vec2's 1599 frames: 13 partial sums). Not a split with a
        # predicated last step: compute_at rebuilt its loops from the block's domain without the
        # predicate (TVM 0.27), reading past the row and summing a wrong result
        lanes = next((v for v in range(_LANES[0] - 1, _LANES[-1], -1) if extent % v == 0), None)
    if lanes is None:
        return sch, None
    spatial = sum(1 for iv in stmt.iter_vars if iv.iter_type == 0)

    def step(s):
        _, lane = s.split(loop, [None, lanes])
        return s.rfactor(lane, spatial)

    return _try(sch, step)


def _arrange(sch, anchor, intermediates):
    """The anchor's loops reordered (parallel part outside): (schedule, the fused outer loop or None,
    whether its innermost axis was vectorized)."""
    stmt = sch.get(anchor)
    loops = sch.get_loops(anchor)
    binds = _bindings(sch, anchor, loops)
    if not loops or binds is None or any(len(b) != 1 for b in binds) or len({b[0] for b in binds}) != len(loops):
        return sch, None, False  # not one loop per block axis: left as it is
    axis_of = [b[0] for b in binds]
    ivs = stmt.iter_vars
    extent = [_int(sch.get(l).extent) for l in loops]
    spatial = [k for k, a in enumerate(axis_of) if ivs[a].iter_type == 0]
    reduce = [k for k, a in enumerate(axis_of) if ivs[a].iter_type != 0]
    # axes some value read from an intermediate buffer does not move with: inside
    inner = [k for k in spatial if extent[k] != 1 and any(
        r.source.same_as(buf) and not any(_mentions(x.min, ivs[axis_of[k]].var) for x in r.region)
        for r in stmt.reads for buf in intermediates)]
    last = None
    if stmt.writes and stmt.writes[0].region:
        hits = [k for k in spatial if _mentions(stmt.writes[0].region[-1].min, ivs[axis_of[k]].var)]
        last = hits[0] if len(hits) == 1 else None
    lanes = None
    if last is not None and last not in inner:
        lanes = _lanes(extent[last])
        if lanes is None:  # LLVM's loop vectorizer takes the contiguous loop whole
            inner.append(last)
    outer = [k for k in spatial if k not in inner]

    def step(s):
        order_outer = [loops[k] for k in outer]
        vec = None
        if lanes is not None and last in outer:
            if lanes < extent[last]:
                o, vec = s.split(loops[last], [None, lanes])
                order_outer[outer.index(last)] = o
            else:
                vec = loops[last]
                order_outer.remove(loops[last])
        order_inner = [loops[k] for k in inner] + [loops[k] for k in reduce] + ([vec] if vec is not None else [])
        if order_outer or order_inner:
            s.reorder(*order_outer, *order_inner)
        fused = (s.fuse(*order_outer) if len(order_outer) > 1 else order_outer[0]) if order_outer else None
        return fused, vec

    sch, done = _try(sch, step)
    if done is None:
        return sch, None, False
    fused, vec = done
    vectorized = False
    if vec is not None:
        sch, vectorized = _try(sch, lambda s: s.vectorize(vec) or True)
    return sch, fused, bool(vectorized)


def _vectorize_written_axis(sch, block, outer) -> Schedule:
    """The block's loop (under ``outer``) along the innermost axis of what it writes, moved innermost
    and vectorized (split to a vector step first where it is longer)."""
    stmt = sch.get(block)
    if not stmt.writes or not stmt.writes[0].region:
        return sch
    loops = sch.get_loops(block)
    if outer is not None:
        at = [sch.get(l).same_as(sch.get(outer)) for l in loops]
        loops = loops[at.index(True) + 1:] if True in at else []
    if not loops:
        return sch
    binds = _bindings(sch, block, loops)
    if binds is None:
        return sch
    last = stmt.writes[0].region[-1].min
    axes = [i for i, iv in enumerate(stmt.iter_vars) if _mentions(last, iv.var)]
    if len(axes) != 1 or stmt.iter_vars[axes[0]].iter_type != 0:
        return sch
    moving = [k for k, b in enumerate(binds) if axes[0] in b]
    if len(moving) != 1 or len(binds[moving[0]]) != 1:
        return sch
    extent = _int(sch.get(loops[moving[0]]).extent)
    lanes = _lanes(extent)
    if lanes is None:
        return sch
    depth = len(sch.get_loops(block)) - len(loops)  # loops above the block's own (outer and those above it)

    def step(s):
        vec = loops[moving[0]]
        if lanes < extent:
            _, vec = s.split(vec, [None, lanes])
        mine = s.get_loops(block)[depth:]
        others = [l for l in mine if not s.get(l).same_as(s.get(vec))]
        if others:
            s.reorder(*others, vec)
        s.vectorize(vec)
        return True

    sch, _ = _try(sch, step)
    return sch


def schedule_generic(func) -> Schedule | None:
    """The nest of the module docstring for ``func``; None where it has no blocks."""
    sch = Schedule(func)
    _, blocks = root_children(sch)
    if not blocks:
        return None
    sch, live = _inline(sch, blocks)
    pending, partial = [], set()  # the blocks in order, rfactor's partial results before their sums
    for block in live:
        rf = None
        if _is_reduction(sch.get(block)):
            sch, rf = _rfactor(sch, block)
        if rf is not None:
            pending.append(rf)
            partial.add(sch.get(block).name_hint)
        pending.append(block)
    intermediates = list(sch.get(sch.get_sblock("root")).alloc_buffers)
    while pending:
        anchor, producers = pending[-1], pending[:-1]
        rf = producers[-1] if sch.get(anchor).name_hint in partial else None
        sch, outer, vectorized = _arrange(sch, anchor, intermediates)
        nest, left = [anchor], []
        for producer in reversed(producers):
            readers = _readers(sch, producer, pending)
            inside = readers and all(any(sch.get(r).same_as(sch.get(n)) for n in nest) for r in readers)
            if outer is not None and inside:
                sch, done = _try(sch, lambda s, p=producer: s.compute_at(p, outer, preserve_unit_loops=True) or True)
                if done:
                    nest.append(producer)
                    continue
            left.insert(0, producer)
        for block in nest:
            if sch.get(block).name_hint in partial or (block is anchor and vectorized):
                continue  # the V partial results summed in order, or done by _arrange
            sch = _vectorize_written_axis(sch, block, outer)
        if outer is not None:
            work = [_domain(sch.get(b)) for b in nest]
            extent = _int(sch.get(outer).extent)
            if (extent is None or extent > 1) and (any(w is None for w in work) or sum(work) >= MIN_PARALLEL):
                sch, _ = _try(sch, lambda s: s.parallel(outer))
        else:
            sch = _outer_parallel_block(sch, anchor)
        pending = left
    return sch


# -- the fallback ------------------------------------------------------------------------------------
def _outer_parallel_block(sch, block):
    """The block's leading loops bound to spatial axes only, fused and parallel (where there is enough work)."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    binds = _bindings(sch, block, loops) if loops else None
    if binds is None:
        return sch
    prefix = []
    for loop, axes in zip(loops, binds):
        if not axes or any(stmt.iter_vars[a].iter_type != 0 for a in axes) or _int(sch.get(loop).extent) is None:
            break
        prefix.append(loop)
    if not prefix:
        return sch
    work = _domain(stmt)
    if math.prod(_int(sch.get(l).extent) for l in prefix) < 2 or (work is not None and work < MIN_PARALLEL):
        return sch

    def step(s):
        fused = s.fuse(*prefix) if len(prefix) > 1 else prefix[0]
        s.parallel(fused)
        return True

    sch, _ = _try(sch, step)
    return sch


def outer_parallel(func) -> Schedule | None:
    """The simplest safe schedule: every block's outer spatial loops fused and parallel."""
    sch = Schedule(func)
    _, blocks = root_children(sch)
    if not blocks:
        return None
    for block in blocks:
        sch = _outer_parallel_block(sch, block)
    return sch
