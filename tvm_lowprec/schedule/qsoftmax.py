"""Schedule rule for :func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax`. Loop nest::

    for row in parallel(all axes but the last):
      m = max(x[row, :])                      # integers
      e[row, :] = table[m - x[row, :]]        # one row of exponentials, in cache
      s = sum(e[row, :])
      y[row, :] = quantize(e[row, :] / s)     # vectorized

Everything of one row is computed under that row's iteration, so the exponentials never leave the cache.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

_LANES = 8  # float32 lanes of the narrowest vector the rows have (ymm)


class QSoftmaxRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "qsoftmax":
            return None
        sch = Schedule(func)
        out = sch.get_sblock("out")
        loops = sch.get_loops(out)
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        sch.parallel(row)
        for name in ("row_sum", "exp", "row_max"):
            sch.compute_at(sch.get_sblock(name), row)
        inner = sch.get_loops(out)[-1]
        if int(sch.get(inner).extent) % _LANES == 0:
            _, vec = sch.split(inner, [None, _LANES])
            sch.vectorize(vec)
        return sch
