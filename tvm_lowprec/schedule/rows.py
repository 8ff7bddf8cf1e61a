"""Schedule rules for the 8-bit row operators (:mod:`~tvm_lowprec.quant.row_ops`). Loop nest::

    for row in parallel(all axes but the last, the last of them in blocks of up to 8 rows):
      for each reduction along the row:          # computed at the row: the row stays in registers
        part[0:V] = reduce(row[k*V : k*V+V])     # V lanes of partial results (rfactor), vectorized
        value = reduce(part)                     # V scalars, in order
      <the row's element-wise values>             # vectorized (the softmax's exponentials)
      y[row, :] = ...                             # vectorized

:func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax`: row maximum, the row of exponentials, their sum
(along an axis that is not the last, the DFL head's bins: the strided rule's nest,
:func:`~tvm_lowprec.schedule.strided.schedule_strided`, vectors along the innermost axis).
:func:`~tvm_lowprec.kernels.qlayernorm.build_qlayernorm`: integer sums of the row and of its squares
(one block, one read of each code), then the row's mean and normalizing factor. A row whose length no vector width divides keeps its
reductions scalar.

A block of rows computes its rows' statistics together (the layer norm's float64 division and square
root, vectorized across the rows): one row at a time, each row waited on that chain's latency (about 60
cycles for 96 elements of work). ConvNeXt's 28x28x96 layer norm 37 -> 27 us, Whisper's 250x384 33 -> 28
us (Zen 3, one thread, alone).

The partial sums change the order a float reduction (the softmax's row sum) adds in: within float
rounding of the sum in order, as a vectorized float softmax's (ONNX Runtime's) is.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .strided import schedule_strided, strip_of

_BLOCK_ROWS = 8  # rows per step at most: their per-row statistics (divisions, square roots) overlap
_LANES = (16, 8)  # float32 lanes per vector step: two ymm registers (one zmm), else one ymm


def _reduces_along_the_row(sch, block) -> bool:
    stmt = sch.get(block)
    return any(iv.iter_type == 2 for iv in stmt.iter_vars)


def _schedule_rows(func, producers: tuple[str, ...]):
    """``producers``: the blocks computed under each row, consumers first."""
    sch = Schedule(func)
    out = sch.get_sblock("out")
    rank = len(sch.get_loops(out))
    n = int(sch.get(sch.get_loops(out)[-1]).extent)
    lanes = next((v for v in _LANES if n % v == 0), None)
    partials = set()
    if lanes is not None:
        for name in producers:
            block = sch.get_sblock(name)
            if _reduces_along_the_row(sch, block):
                _, lane = sch.split(sch.get_loops(block)[-1], [None, lanes])
                sch.rfactor(lane, rank - 1)
                partials.add(name)
    loops = sch.get_loops(out)
    block_rows = next((r for r in range(_BLOCK_ROWS, 1, -1) if _extent(sch, loops[-2]) % r == 0), 1)
    if block_rows > 1:  # whole blocks of the last row axis: the producers' regions stay affine
        outer, _ = sch.split(loops[-2], [None, block_rows])
        loops = [*loops[:-2], outer]
    else:
        loops = loops[:-1]
    row = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(row)
    for name in producers:
        sch.compute_at(sch.get_sblock(name), row)
        if name in partials:
            sch.compute_at(sch.get_sblock(f"{name}_rf"), row)
    blocked = int(block_rows > 1)  # loops under ``row``: (block row, ...) where blocked
    if lanes is None:
        for name in producers:  # a value per row: vectorized across the block's rows
            inner = sch.get_loops(sch.get_sblock(name))
            if blocked and len(inner) == 2 and not _reduces_along_the_row(sch, sch.get_sblock(name)):
                sch.vectorize(inner[-1])
        return sch
    for name in partials:  # the partial results: loops (row, lane, [block row,] k) made (row, [block row,] k, lane)
        rf = sch.get_sblock(f"{name}_rf")
        inner = sch.get_loops(rf)[1:]
        if len(inner) > 1:
            sch.reorder(*inner[1:], inner[0])
        sch.vectorize(sch.get_loops(rf)[-1])
    for name in (*producers, "out"):
        block = sch.get_sblock(name)
        inner = sch.get_loops(block)[1:]
        if name in partials:  # a reduction's last step: (lane, block row), vectorized across the rows
            if blocked and len(inner) == 2:
                sch.vectorize(inner[1])
            continue
        if _reduces_along_the_row(sch, block):
            continue
        if len(inner) == 1 + blocked:  # a row's elements
            _, vec = sch.split(inner[-1], [None, lanes])
            sch.vectorize(vec)
        elif blocked and len(inner) == 1:  # a value per row: vectorized across the block's rows
            sch.vectorize(inner[0])
    return sch


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _schedule_column_moments(func):
    """:func:`~tvm_lowprec.kernels.qnorm_stats.build_qnorm_stats`: sums along outer axes, so the vectors
    run along the innermost (kept) axis, which both sums carry::

        for outer in parallel(kept axes, innermost // (strip * V)):
          for reduced axes: for s in unroll(strip): for lane in vectorize(V): (sum, sum of squares) += ...
          mean[...], factor[...] for those strip * V positions, vectorized
    """
    sch = Schedule(func)
    sums = sch.get_sblock("norm_sums")
    loops, stmt = sch.get_loops(sums), sch.get(sums)
    spatial = [l for l, iv in zip(loops, stmt.iter_vars) if iv.iter_type == 0]
    reduced = [l for l, iv in zip(loops, stmt.iter_vars) if iv.iter_type == 2]
    inner, walk = _extent(sch, spatial[-1]), 1
    for loop in reduced:
        walk *= _extent(sch, loop)
    lanes = next((v for v in _LANES if inner % v == 0), 1)
    strip = strip_of(walk, inner, lanes)
    vec_outer, vec = sch.split(spatial[-1], [None, strip * lanes])
    sch.reorder(*spatial[:-1], vec_outer, *reduced, vec)
    outer = sch.fuse(*spatial[:-1], vec_outer) if len(spatial) > 1 else vec_outer
    for name in ("norm_mean", "norm_factor"):
        sch.reverse_compute_at(sch.get_sblock(name), outer)
    if lanes > 1:
        for block in (sums, sch.get_sblock("norm_mean"), sch.get_sblock("norm_factor")):
            last = sch.get_loops(block)[-1]
            if block.same_as(sums) and strip > 1:
                steps, last = sch.split(last, [strip, lanes])
                sch.unroll(steps)
            sch.vectorize(last)
    if _extent(sch, outer) > 1:
        sch.parallel(outer)
    init = sch.decompose_reduction(sums, reduced[0])  # the zeroing once, before the walk
    if lanes > 1:
        sch.vectorize(sch.get_loops(init)[-1])
    return sch


class RowOpRule:
    """Schedules a row operator by its ``lowprec.op``; declines everything else."""

    PRODUCERS = {
        "qsoftmax": ("row_scale", "row_sum", "exp", "row_max"),
        "qlayernorm": ("row_factor", "row_mean", "row_sums"),
    }
    def apply(self, func, spec):
        op = func.attrs.get("lowprec.op", None) if func.attrs is not None else None
        if op == "qnorm_stats":
            return _schedule_column_moments(func)
        if op not in self.PRODUCERS:
            return None
        axis = func.attrs.get("lowprec.axis", None)
        if axis is not None and int(axis) != len(func.params[0].shape) - 1:  # along an outer axis: vectors
            return schedule_strided(func)  # along the innermost one, which the reductions carry
        return _schedule_rows(func, self.PRODUCERS[str(op)])
