"""The lookup a GEMM runs on its own output (:mod:`tvm_lowprec.quant.lookup_epilogue`), scheduled.

The GEMM part is scheduled as the plain qgemm it was (:func:`gemm_part`: the same function, so the
default rule and its tuning records apply unchanged); :func:`attach` then puts the lookup back::

    for task in parallel(...):            # the GEMM's parallel loop: R whole rows per task
      <the GEMM's tiles and epilogues>
      out[task rows] = table[out[task rows]]   # lookup_in_place: vectors, then the range's tail

where the GEMM's schedule marks its parallel loop as one whose iterations write whole output rows,
all columns (:data:`WHOLE_ROWS`, set by :func:`~tvm_lowprec.schedule.qgemm.tile_gemm` where the row
tiles are the tasks, in the default schedule and in the tuning space alike), and ``R`` is the
coefficient of the loop's variable in the epilogue block's row index (80 for a convolution whose
tasks are its 80-pixel output rows). A task's range that whole vectors do not fill ends with scalar
lookups. Otherwise the lookup runs after the GEMM, as one more pass over the output (parallel over
chunks of :data:`CHUNK` vectors).
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..kernels.lookup import lookup_in_place
from ..quant.lookup_epilogue import BLOCK, GEMM_NAME, attrs_of, root_items, with_root_body

WHOLE_ROWS = "lowprec.whole_rows"  # For annotation: each iteration writes whole rows of the output, all columns
CHUNK = 64  # lookup vectors per task of the trailing pass
_MIN_PARALLEL = 1 << 16  # bytes: a trailing pass below this runs on one thread


def is_fused(func) -> bool:
    return isinstance(func, tirx.PrimFunc) and GEMM_NAME in attrs_of(func)


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 0


def _epilogue_rows(stmt):
    """The row index (first iter value) of the ``epilogue`` block under ``stmt``, or None."""
    if isinstance(stmt, SBlockRealize):
        if stmt.block.name_hint == "epilogue":
            return stmt.iter_values[0]
        return _epilogue_rows(stmt.block.body)
    for child in (list(stmt) if isinstance(stmt, tirx.SeqStmt) else
                  [getattr(stmt, name) for name in ("body", "then_case", "else_case") if getattr(stmt, name, None) is not None]):
        found = _epilogue_rows(child)
        if found is not None:
            return found
    return None


def _rows_per_task(loop) -> int | None:
    """Rows one iteration of ``loop`` writes: the coefficient of its variable in the epilogue's row
    index (None where the epilogue is not under it or the index is not linear in it)."""
    from tvm.sym.pattern import detect_linear_equation

    rows = _epilogue_rows(loop.body)
    if rows is None:
        return None
    coefficients = detect_linear_equation(rows, [loop.loop_var])
    if len(coefficients) != 2 or not isinstance(coefficients[0], tirx.IntImm) or int(coefficients[0].value) <= 0:
        return None
    return int(coefficients[0].value)


def gemm_part(func):
    """A fused function's GEMM as the qgemm PrimFunc it was built from (its params, name and
    attributes, its body without the trailing lookup block); any other function as it is."""
    if not is_fused(func):
        return func
    items = root_items(func)
    last = items[-1]
    if not (isinstance(last, SBlockRealize) and last.block.name_hint == BLOCK):
        raise ValueError(f"{func.attrs['global_symbol']}: a fused lookup without its {BLOCK!r} block")
    attrs = attrs_of(func)
    attrs["global_symbol"] = attrs.pop(GEMM_NAME)
    for key in ("lowprec.lookup", "lowprec.folded"):
        attrs.pop(key)
    return with_root_body(func, items[:-1], [*func.params[:-2], func.params[-1]], attrs)


def attach(scheduled, fused, intrin):
    """The scheduled GEMM part with ``fused``'s lookup put back (see the module docstring)."""
    table, out = fused.params[-2], scheduled.params[-1]
    m, n = (int(e) for e in out.shape)
    lanes = intrin.lanes
    items, placed = [], False
    for stmt in root_items(scheduled):
        rows = _rows_per_task(stmt) if isinstance(stmt, tirx.For) and WHOLE_ROWS in stmt.annotations else None
        if rows is not None and not placed and _is_zero(stmt.min):
            task = stmt.loop_var
            start = task * (rows * n)
            stop = tirx.min((task + 1) * rows, m) * n
            annotations = {k: v for k, v in stmt.annotations.items() if k != WHOLE_ROWS}
            stmt = tirx.For(task, stmt.min, stmt.extent, stmt.kind, tirx.SeqStmt([*(stmt.body if isinstance(stmt.body, tirx.SeqStmt) else [stmt.body]),
                            lookup_in_place(out, table, intrin, start, stop)]), stmt.thread_binding, annotations)
            placed = True
        items.append(stmt)
    if not placed:  # a pass of its own after the GEMM
        per_task = CHUNK * lanes
        tasks = -(-(m * n) // per_task)
        chunk = tirx.Var("chunk", "int32")
        kind = tirx.ForKind.PARALLEL if m * n >= _MIN_PARALLEL and tasks > 1 else tirx.ForKind.SERIAL
        items.append(tirx.For(chunk, tirx.const(0, "int32"), tirx.const(tasks, "int32"), kind,
                              lookup_in_place(out, table, intrin, chunk * per_task,
                                              tirx.min((chunk + 1) * per_task, m * n))))
    attrs = attrs_of(scheduled)
    attrs.update({key: attrs_of(fused)[key] for key in ("global_symbol", "lowprec.lookup", "lowprec.folded")})
    attrs["lowprec.lookup_placed"] = "tasks" if placed else "after"
    return with_root_body(scheduled, items, [*scheduled.params[:-1], table, out], attrs)
