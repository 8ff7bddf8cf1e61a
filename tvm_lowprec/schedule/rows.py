"""Schedule rules for the 8-bit row operators (:mod:`~tvm_lowprec.quant.row_ops`). Loop nest::

    for row in parallel(all axes but the last):
      for each reduction along the row:          # computed at the row: the row stays in registers
        part[0:V] = reduce(row[k*V : k*V+V])     # V lanes of partial results (rfactor), vectorized
        value = reduce(part)                     # V scalars, in order
      <the row's element-wise values>             # vectorized (the softmax's exponentials)
      y[row, :] = ...                             # vectorized

:func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax`: row maximum, the row of exponentials, their sum
(along an axis that is not the last, the DFL head's bins: the strided rule's nest,
:func:`~tvm_lowprec.schedule.strided.schedule_strided`, vectors along the innermost axis).
:func:`~tvm_lowprec.kernels.qlayernorm.build_qlayernorm`: integer sums of the row and of its squares,
then the row's mean and normalizing factor. A row whose length no vector width divides keeps its
reductions scalar.

The partial sums change the order a float reduction (the softmax's row sum) adds in: within float
rounding of the sum in order, as a vectorized float softmax's (ONNX Runtime's) is.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .strided import schedule_strided

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
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(row)
    for name in producers:
        sch.compute_at(sch.get_sblock(name), row)
        if name in partials:
            sch.compute_at(sch.get_sblock(f"{name}_rf"), row)
    if lanes is None:
        return sch
    for name in partials:  # the partial results: loops (row, lane, k) made (row, k, lane); (row, lane) for one step
        rf = sch.get_sblock(f"{name}_rf")
        inner = sch.get_loops(rf)
        if len(inner) > 2:
            sch.reorder(inner[-1], inner[-2])
        sch.vectorize(sch.get_loops(rf)[-1])
    for name in (*producers, "out"):
        block = sch.get_sblock(name)
        inner = sch.get_loops(block)
        if name in partials or len(inner) < 2 or _reduces_along_the_row(sch, block):
            continue  # a reduction's last step, or a value per row
        _, vec = sch.split(inner[-1], [None, lanes])
        sch.vectorize(vec)
    return sch


class RowOpRule:
    """Schedules a row operator by its ``lowprec.op``; declines everything else."""

    PRODUCERS = {
        "qsoftmax": ("row_scale", "row_sum", "exp", "row_max"),
        "qlayernorm": ("row_factor", "row_mean", "row_sum_sq", "row_sum"),
    }

    def apply(self, func, spec):
        op = func.attrs.get("lowprec.op", None) if func.attrs is not None else None
        if op not in self.PRODUCERS:
            return None
        axis = func.attrs.get("lowprec.axis", None)
        if axis is not None and int(axis) != len(func.params[0].shape) - 1:  # along an outer axis: vectors
            return schedule_strided(func)  # along the innermost one, which the reductions carry
        return _schedule_rows(func, self.PRODUCERS[str(op)])
