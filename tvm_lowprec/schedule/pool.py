"""Schedule rule for the separable max pool (:mod:`~tvm_lowprec.kernels.pool`): three loop nests,
each parallel over its rows::

    padded = pad(x)                    # border split off by LoopPartition, the interior a copy
    for row in parallel(padded rows):  # KW taps, then KH: each pass a small window
      pool_rows[row, :] = max_kw padded[row, : + kw]
    for row in parallel(output rows):
      pool_max[row, :] = max_kh pool_rows[row + kh, :]

Each pass is a window reduction, scheduled as :mod:`~tvm_lowprec.schedule.window` schedules one:
where the channels fill less than a vector and the window moves one column per output (SPPF's 16
channels, and the column pass always), the taps of a row are contiguous runs and the vectors run
over the fused (column, channel) axis; else the channels in the row's vectors. Declines every other
function.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.pool import OP
from .blocks import root_children
from .elementwise import padding_nest
from .qgemm import narrow_indices
from .window import _bits, _rows_contiguous, schedule_wide_window, schedule_window


class SeparablePoolRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != OP:
            return None
        sch = Schedule(narrow_indices(func))  # LoopPartition takes the padding's hint on int32 loops
        _, blocks = root_children(sch)
        *pads, rows, columns = blocks
        for pad in pads:
            if not padding_nest(sch, pad):
                return None
        for block in (rows, columns):
            lanes = spec.gemm.vector_bits // _bits(sch.get(block))
            if _rows_contiguous(sch.get(block), lanes):
                schedule_wide_window(sch, block, None, lanes)
            elif schedule_window(sch, block, vector_bits=spec.gemm.vector_bits) is None:
                return None
        return sch
