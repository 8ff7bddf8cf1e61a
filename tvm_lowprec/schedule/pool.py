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
over the fused (column, channel) axis; else the channels in the row's vectors. A nest runs in
parallel from :data:`MIN_PARALLEL` elements: three forks of TVM's pool for SPPF's 40x40x16 pools made
them 2.5x slower at 2 threads than at 1 (7.0 -> 17.7 us for three calls, Zen 4). Declines every
other function.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.pool import OP
from .blocks import root_children
from .elementwise import padding_nest
from .qgemm import narrow_indices
from .window import _bits, _rows_contiguous, schedule_wide_window, schedule_window


MIN_PARALLEL = 1 << 16  # elements a nest writes (about 4 us of work at memory speed) before it forks


class SeparablePoolRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != OP:
            return None
        sch = Schedule(narrow_indices(func))  # LoopPartition takes the padding's hint on int32 loops
        _, blocks = root_children(sch)
        *pads, rows, columns = blocks
        for pad in pads:
            if not padding_nest(sch, pad, MIN_PARALLEL):
                return None
        for block in (rows, columns):
            lanes = spec.gemm.vector_bits // _bits(sch.get(block))
            if _rows_contiguous(sch.get(block), lanes):
                schedule_wide_window(sch, block, None, lanes, MIN_PARALLEL)
            elif schedule_window(sch, block, vector_bits=spec.gemm.vector_bits, min_parallel=MIN_PARALLEL) is None:
                return None
        return sch
