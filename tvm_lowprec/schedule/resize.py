"""Schedule rule for the bilinear resize's two passes (:mod:`~tvm_lowprec.kernels.resize`)::

    for row in parallel(input rows):     # the W pass: table lookups along the row
      resize_rows[row, :] = x[row, x0[:]] * wx0[:] + x[row, x1[:]] * wx1[:]
    for row in parallel(output rows):    # the H pass: two source rows, contiguous
      resize[row, :] = resize_rows[y0[row], :] * wy0[row] + resize_rows[y1[row], :] * wy1[row]

The loops after a pass's own axis (the channels of NHWC in both passes; NCHW's W in the H pass) are
contiguous in its source row and its output row alike: fused into one run, in vectors of the row's
width where they divide it (else LLVM's loop vectorizer takes it); the loops before it are the rows.
NCHW's W pass, whose own axis is innermost, runs along it (its table lookups a gather). A pass forks
from :data:`MIN_PARALLEL` elements. Declines every other function.
"""

from __future__ import annotations

import math

from tvm.s_tir import Schedule

from ..kernels.resize import OP
from .blocks import root_children
from .qgemm import _vectorize_inner

MIN_PARALLEL = 1 << 14  # outputs a pass writes before it forks


class ResizeRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != OP:
            return None
        sch = Schedule(func)
        _, blocks = root_children(sch)
        lanes = spec.gemm.vector_bits // 32
        layout = str(func.attrs["lowprec.layout"])
        for block in blocks:
            loops = sch.get_loops(block)
            total = math.prod(int(sch.get(loop).extent) for loop in loops)
            axis = layout.index("H" if sch.get(block).name_hint == "resize" else "W")
            split = axis + 1 if axis + 1 < len(loops) else len(loops) - 1
            rows, run = sch.fuse(*loops[:split]), sch.fuse(*loops[split:])
            if total >= MIN_PARALLEL:
                sch.parallel(rows)
            if int(sch.get(run).extent) % lanes == 0:
                _vectorize_inner(sch, block, lanes)
        return sch
