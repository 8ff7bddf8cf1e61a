"""Fallback rule for the remaining injective PrimFuncs (quantize, dequantize, casts, reshapes).

Inlines every block into the last one (a fused chain of injective operators becomes one loop nest),
fuses the loop nest, parallelises the outer part and vectorises the inner part. Declines functions
with reductions (those need a rule of their own) and chains that cannot be inlined.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule

from .blocks import find_block

_VECTOR = 16
_MIN_PARALLEL = 1 << 14  # below this many elements a thread fork costs more than it saves


class ElementwiseRule:
    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        sch = Schedule(func)
        root = find_block(sch, "root")  # te-made funcs have a root block, TVMScript ones may not
        blocks = sch.get_child_blocks(root) if root is not None else []
        if not blocks or any(iv.iter_type != 0 for b in blocks for iv in sch.get(b).iter_vars):
            return None  # empty, or a reduction: not ours
        for producer in blocks[:-1]:
            try:
                sch.compute_inline(producer)
            except tvm.s_tir.schedule.ScheduleError:
                return None
        block = blocks[-1]
        loops = sch.get_loops(block)
        if not loops:
            return None
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = sch.get(fused).extent
        if not hasattr(extent, "value"):
            return None  # symbolic shape: leave as is
        total = int(extent.value)
        if total >= _VECTOR and total % _VECTOR == 0:
            outer, inner = sch.split(fused, [None, _VECTOR])
            sch.vectorize(inner)
            if total >= _MIN_PARALLEL:
                sch.parallel(outer)
        elif total >= _MIN_PARALLEL:
            sch.parallel(fused)
        return sch
