"""Schedule rules for the 8-bit row operators (:mod:`~tvm_lowprec.quant.row_ops`). Loop nest::

    for row in parallel(all axes but the last):
      <the row's reductions and per-row values>   # computed at the row: the row stays in cache
      y[row, :] = ...                             # vectorized

:func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax`: row maximum, the row of exponentials, their sum
(along an axis that is not the last, the DFL head's bins: the strided rule's nest,
:func:`~tvm_lowprec.schedule.strided.schedule_strided`, vectors along the innermost axis).
:func:`~tvm_lowprec.kernels.qlayernorm.build_qlayernorm`: integer sums of the row and of its squares,
then the row's mean and normalizing factor.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .strided import schedule_strided

_LANES = 8  # float32 lanes of the narrowest vector the rows have (ymm)


def _schedule_rows(func, producers: tuple[str, ...]):
    """``producers``: the blocks computed under each row, consumers first."""
    sch = Schedule(func)
    out = sch.get_sblock("out")
    loops = sch.get_loops(out)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(row)
    for name in producers:
        sch.compute_at(sch.get_sblock(name), row)
    inner = sch.get_loops(out)[-1]
    if int(sch.get(inner).extent) % _LANES == 0:
        _, vec = sch.split(inner, [None, _LANES])
        sch.vectorize(vec)
    return sch


class RowOpRule:
    """Schedules a row operator by its ``lowprec.op``; declines everything else."""

    PRODUCERS = {
        "qsoftmax": ("row_sum", "exp", "row_max"),
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
