"""Fallback rule for the remaining injective PrimFuncs (quantize, dequantize, casts, reshapes).

Inlines every block into the ones writing the outputs (a fused chain of injective operators becomes
one loop nest per output: one, or several for a split), fuses each loop nest, parallelises its outer
part and vectorises its inner part. Declines functions with reductions (those need a rule of their
own) and chains that cannot be inlined.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule

from .blocks import root_children

_VECTOR = 16
_MIN_PARALLEL = 1 << 14  # below this many elements a thread fork costs more than it saves


class ElementwiseRule:
    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        sch = Schedule(func)
        root, blocks = root_children(sch)
        if not blocks or any(iv.iter_type != 0 for b in blocks for iv in sch.get(b).iter_vars):
            return None  # empty, or a reduction: not ours
        leaves = []  # the blocks that write the function's outputs (several for a split)
        intermediates = list(sch.get(root).alloc_buffers) if root is not None else []
        for producer in blocks[:-1]:
            try:
                sch.compute_inline(producer)
            except tvm.s_tir.schedule.ScheduleError:
                if any(region.source.same_as(b) for region in sch.get(producer).writes for b in intermediates):
                    return None  # an intermediate that cannot be inlined: not a chain of injective ops
                leaves.append(producer)
        leaves.append(blocks[-1])
        for block in leaves:
            if not _fuse_and_vectorize(sch, block):
                return None
        return sch


def _reads_run_along(stmt, var) -> bool:
    """Every read's innermost index moves with ``var``: a vector along it reads contiguous runs."""
    from tvm.tirx.analysis import undefined_vars

    return bool(stmt.reads) and all(any(v.same_as(var) for v in undefined_vars(r.region[-1].min)) for r in stmt.reads)


def _vectorize_layout_change(sch, block) -> bool:
    """A layout change whose output's innermost axis is short and is not the axis its reads run along
    (an NCHW image quantized into NHWC, 3 channels): vectors along the axis before it instead, the short
    axis unrolled around them, so loads are contiguous and the stores interleave. Fusing every axis
    into one vectorized loop (the default below) makes each vector a gather with a division per lane:
    5.6x slower on a 1x3x480x480 image here."""
    loops, stmt = sch.get_loops(block), sch.get(block)
    extents = [sch.get(l).extent for l in loops]
    if len(loops) < 2 or len(stmt.iter_vars) != len(loops) or not all(hasattr(e, "value") for e in extents):
        return False
    last, second = int(extents[-1].value), int(extents[-2].value)
    ivs = [iv.var for iv in stmt.iter_vars]
    if last >= _VECTOR or second % _VECTOR or _reads_run_along(stmt, ivs[-1]) or not _reads_run_along(stmt, ivs[-2]):
        return False
    outer, inner = sch.split(loops[-2], [None, _VECTOR])
    sch.reorder(outer, loops[-1], inner)
    sch.vectorize(inner)
    sch.unroll(loops[-1])
    rows = sch.fuse(*loops[:-2], outer) if len(loops) > 2 else outer
    if last * second * (int(sch.get(rows).extent.value) * _VECTOR // second) >= _MIN_PARALLEL:
        sch.parallel(rows)
    return True


def _fuse_and_vectorize(sch, block) -> bool:
    """One block's loops fused, split into a parallel outer part and a vectorized inner part; False
    for a block without loops or with a symbolic extent."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    if _vectorize_layout_change(sch, block):
        return True
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = sch.get(fused).extent
    if not hasattr(extent, "value"):
        return False  # symbolic shape: leave as is
    total = int(extent.value)
    if total >= _VECTOR and total % _VECTOR == 0:
        outer, inner = sch.split(fused, [None, _VECTOR])
        sch.vectorize(inner)
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
    elif total >= _MIN_PARALLEL:
        sch.parallel(fused)
    return True
