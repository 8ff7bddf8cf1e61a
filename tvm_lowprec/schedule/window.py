"""Schedule rule for small-window reductions: max/average pooling (and any PrimFunc whose last block
reduces over a few constant-extent axes, its other blocks injective, e.g. the padding before a pool).

Loop nest::

    for outer in parallel(fused spatial axes but the last):
      out[outer, :] = init                       # vectorized
      for window in reduction axes:              # a few taps: 3x3, 5x5
        for inner in vectorize(last spatial axis): out[outer, inner] = max(out, in[outer + window, inner])

The last spatial axis is the channel axis in NHWC (the layout the convolutions carry through pools)
and the width axis in NCHW: contiguous either way, so the taps are vector loads.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule

from .blocks import root_children

MAX_WINDOW = 256  # reduction points per output: larger reductions are not windows (layer norm, softmax)
_VECTOR = 16
_MIN_PARALLEL = 1 << 12


class WindowReductionRule:
    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        sch = Schedule(func)
        root, blocks = root_children(sch)
        reducing = [i for i, b in enumerate(blocks) if any(iv.iter_type == 2 for iv in sch.get(b).iter_vars)]
        if len(reducing) != 1 or not _is_window(sch.get(blocks[reducing[0]])):
            return None
        window, epilogue = blocks[reducing[0]], blocks[reducing[0] + 1:]  # epilogue: a dequantize, say
        try:
            for producer in blocks[:reducing[0]]:  # the padding
                sch.compute_inline(producer)
            for consumer in reversed(epilogue[1:]):  # the epilogue as one block
                sch.reverse_compute_inline(consumer)
        except tvm.s_tir.schedule.ScheduleError:
            return None
        if not contiguous_in_last_spatial_axis(sch.get(window)):
            return None  # a row reduction (softmax, layer norm, a matmul's A): not a window
        return schedule_window(sch, window, epilogue[0] if epilogue else None)


def _taps_only(block) -> bool:
    """Every index that a reduction variable moves also moves with an output axis (``h + kh``): taps
    of a window. A convolution's channel sum (``x[c, ...]``, c reduced alone) is not a window."""
    from tvm.tirx.analysis import undefined_vars

    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == 2]
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == 0]
    for region in block.reads:
        for r in region.region:
            used = undefined_vars(r.min)
            if any(v.same_as(x) for v in used for x in reduce) and not any(v.same_as(x) for v in used for x in spatial):
                return False
    return True


def _is_window(block) -> bool:
    if not _taps_only(block):
        return False
    kinds = [iv.iter_type for iv in block.iter_vars]
    reduce = [iv.dom.extent for iv in block.iter_vars if iv.iter_type == 2]
    if not reduce or 0 not in kinds or set(kinds) - {0, 2}:
        return False
    if not all(hasattr(e, "value") for e in reduce):
        return False
    window = 1
    for extent in reduce:
        window *= int(extent.value)
    return window <= MAX_WINDOW


def contiguous_in_last_spatial_axis(block) -> bool:
    """Every read's innermost index moves with the last spatial axis (the one vectorized)."""
    from tvm.tirx.analysis import undefined_vars

    inner = [iv.var for iv in block.iter_vars if iv.iter_type == 0][-1]
    return all(any(v.same_as(inner) for v in undefined_vars(region.region[-1].min)) for region in block.reads if region.region)


def schedule_window(sch, block, epilogue=None):
    """The loop nest above for the window block (also used by the strided rule for a reduction that
    writes the output itself)."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(loops) != len(kinds) or any(not hasattr(sch.get(l).extent, "value") for l in loops):
        return None  # loops not one per axis, or symbolic: leave it
    spatial = [l for l, k in zip(loops, kinds) if k == 0]
    reduce = [l for l, k in zip(loops, kinds) if k == 2]
    inner = spatial[-1]
    sch.reorder(*spatial[:-1], *reduce, inner)
    if len(spatial) > 1:
        outer = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
        total = int(sch.get(outer).extent.value) * int(sch.get(inner).extent.value)
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
    # no decompose_reduction: the update block without its init is no reduction block, and TIR
    # refuses to vectorize a loop over it; with the init kept, it lowers to a test of the window's
    # first tap, uniform across the vector lanes
    _vectorize_last(sch, block)
    if epilogue is not None:  # element-wise on each output row, while it is in cache
        if len(spatial) > 1:
            sch.reverse_compute_at(epilogue, sch.get_loops(block)[0])
        _vectorize_last(sch, epilogue)
    return sch


def _vectorize_last(sch, block):
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent.value)
    if extent > _VECTOR and extent % _VECTOR == 0:
        _, loop = sch.split(loop, [None, _VECTOR])
    if extent <= _VECTOR or extent % _VECTOR == 0:
        sch.vectorize(loop)
