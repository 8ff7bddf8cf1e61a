"""The last column vector of a scheduled qgemm whose N no vector divides: overlapping, not predicated.

A GEMM's tiles cover N padded to whole panels; its epilogue writes the real columns only, through the
block predicate ``column < N``. That predicate depends on the vector's lane, so TVM's vectorizer
leaves the whole epilogue scalar (LLVM's loop vectorizer then makes masked vectors behind run-time
alias checks, every tile): Whisper's attention scores (6x1500x1500x64, 1500 = 93 x 16 + 12) ran at 121
GOPS, the same GEMM at N = 1504 at 346 (2-core Zen 4, one thread).

After scheduling, every epilogue vector starts at ``min(start, N - lanes)`` instead and the column
conjunct of its predicate is dropped (rows keep theirs: a row condition is the same for every lane and
stays a branch around the vector)::

    for v in range(vectors of the tile):           # e.g. N = 1500, the last panel 1472..1503
      c = min(panel + v * lanes, N - lanes)        # 1472, then 1484 (not 1488)
      out[row, c : c + lanes] = requant(acc[row, c : c + lanes])

The last vector overlaps the one before it and writes the same values again; it reads accumulator
columns of its own tile, which holds all of them where the last panel has at least ``lanes`` real
columns (``N mod (lanes x nr)`` is 0 or at least ``lanes``); otherwise the function is left as it is.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlockRealize
from tvm.sym.pattern import detect_linear_equation
from tvm.tirx.analysis import undefined_vars

from ..tir_nest import map_nest
from .qgemm import gemm_rows


def _conjuncts(expr):
    """The terms of a conjunction (``a and b and ...``), in order."""
    if isinstance(expr, tirx.And):
        return _conjuncts(expr.a) + _conjuncts(expr.b)
    return [expr]


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in undefined_vars(expr))


def overlap_column_tail(func):
    """``func`` (a scheduled qgemm PrimFunc) with its epilogue's last column vector overlapping the
    one before it (see the module's text); any other function, or one it does not fit, unchanged."""
    attrs = func.attrs if func.attrs is not None else {}
    if attrs.get("lowprec.op", None) != "qgemm" or "lowprec.vector" not in attrs or gemm_rows(func) != 1:
        return func
    if len(attrs.get("lowprec.block", [])):  # a GPU layout (a block tile): its epilogue is per thread, left as it is
        return func
    n = int(attrs["lowprec.shape"][1])
    lanes, nr = int(attrs["lowprec.vector"][0]), int(attrs["lowprec.tile"][1])
    if n < lanes or n % lanes == 0 or 0 < n % (lanes * nr) < lanes:
        return func

    def rewrite(loop):
        if not isinstance(loop, tirx.For):
            return None
        realize = loop.body
        if (loop.kind != tirx.ForKind.VECTORIZED or not isinstance(realize, SBlockRealize)
                or realize.block.name_hint != "epilogue" or not isinstance(loop.extent, tirx.IntImm)
                or int(loop.extent.value) != lanes):
            return None
        lane = loop.loop_var
        column = realize.iter_values[-1]
        linear = detect_linear_equation(column, [lane])  # [coefficient, the rest]: column = start + lane
        if len(linear) != 2 or not isinstance(linear[0], tirx.IntImm) or int(linear[0].value) != 1:
            return None
        column = tirx.min(linear[1], tirx.const(n - lanes, str(lane.ty))) + lane
        kept = [term for term in _conjuncts(realize.predicate) if not _uses(term, lane)]
        predicate = kept[0] if kept else tirx.const(True, "bool")
        for term in kept[1:]:
            predicate = tirx.And(predicate, term)
        realize = SBlockRealize([*realize.iter_values[:-1], column], predicate, realize.block)
        return tirx.For(lane, loop.min, loop.extent, loop.kind, realize, loop.thread_binding, loop.annotations)

    body = map_nest(func.body, rewrite)
    return func if body.same_as(func.body) else func.with_body(body)
