"""Schedule rule for small-window reductions: max/average pooling (and any PrimFunc whose last block
reduces over a few constant-extent axes, its other blocks injective, e.g. the padding before a pool).

Loop nest::

    for outer in parallel(fused spatial axes but the last):
      out[outer, :] = init                       # vectorized
      for window in reduction axes:              # a few taps: 3x3, 5x5
        for inner in vectorize(last spatial axis): out[outer, inner] = max(out, in[outer + window, inner])

The last spatial axis is the channel axis in NHWC (the layout the convolutions carry through pools)
and the width axis in NCHW: contiguous either way, so the taps are vector loads.

Padding. Inlined, the padding is a bounds test in every tap; the loops over the output rows and
columns carry ``pragma_loop_partition_hint``, so TVM's LoopPartition splits off the border and the
interior's taps are plain loads (ResNet's 3x3 stride-2 pool of 112x112x64, Zen 5, one thread:
31 -> 8 us).

Few channels. Where the channels fill less than a vector (SPPF's 5x5 stride-1 pools of 40x40x16)
and the window moves one pixel per output column, a tap of a whole row is one contiguous run of
``W x C`` values: the padding is then copied once into a buffer and the window vectorized over the
fused (column, channel) axis, a full vector per tap (7.5 -> 2.6 us, same host)::

    padded = pad(x)                              # its border split off, the interior a copy
    for row in parallel(output rows):
      for chunk in (W x C) / lanes:
        for window: out[row, chunk] = max(out, padded[row + kh, chunk + kw x C])   # vectorized
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule

from .blocks import root_children

MAX_WINDOW = 256  # reduction points per output: larger reductions are not windows (layer norm, softmax)
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
        producers = blocks[:reducing[0]]
        if not contiguous_in_last_spatial_axis(sch.get(window)):
            return None  # a row reduction (softmax, layer norm, a matmul's A): not a window
        lanes = spec.gemm.vector_bits // _bits(sch.get(window))
        if not epilogue and len(producers) <= 1 and _rows_contiguous(sch.get(window), lanes):
            return schedule_wide_window(sch, window, producers[0] if producers else None, lanes)
        try:
            for producer in producers:  # the padding
                sch.compute_inline(producer)
            for consumer in reversed(epilogue[1:]):  # the epilogue as one block
                sch.reverse_compute_inline(consumer)
        except tvm.s_tir.schedule.ScheduleError:
            return None
        return schedule_window(sch, window, epilogue[0] if epilogue else None, partition=bool(producers),
                               vector_bits=spec.gemm.vector_bits)


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


def _bits(block) -> int:
    return tvm.DataType(str(block.writes[0].source.dtype)).bits


def _rows_contiguous(block, lanes: int) -> bool:
    """Whether the window's taps of a whole output row are contiguous runs: the channels (last axis)
    fill less than a vector, columns x channels whole vectors, and every read indexes its last two
    axes as ``column + tap`` (stride 1, no dilation) and ``channel``, over a buffer as wide as the
    output's columns plus the window's taps."""
    from tvm.sym.pattern import detect_linear_equation

    spatial = [iv for iv in block.iter_vars if iv.iter_type == 0]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == 2]
    if len(spatial) < 3 or any(not hasattr(iv.dom.extent, "value") for iv in spatial):
        return False
    width, channels = int(spatial[-2].dom.extent.value), int(spatial[-1].dom.extent.value)
    if channels >= lanes or (width * channels) % lanes:
        return False
    column, channel = spatial[-2].var, spatial[-1].var
    for region in block.reads:
        if region.source.same_as(block.writes[0].source):
            continue  # the reduction's own output
        if len(region.region) < 2 or int(region.source.shape[-1]) != channels:
            return False
        w_index, c_index = region.region[-2].min, region.region[-1].min
        if not (isinstance(c_index, tvm.tirx.Var) and c_index.same_as(channel)):
            return False
        coefficients = detect_linear_equation(w_index, [column, *(iv.var for iv in reduce)])
        if len(coefficients) == 0 or any(not hasattr(c, "value") or int(c.value) not in (0, 1)
                                         for c in coefficients[:-1]) or int(coefficients[0].value) != 1:
            return False
    return True


def schedule_wide_window(sch, block, padding, lanes: int, min_parallel: int = _MIN_PARALLEL):
    """The few-channels loop nest above: ``padding`` (a block or None) copied into its buffer, the
    window vectorized over the fused (column, channel) axis."""
    if padding is not None:
        loops = sch.get_loops(padding)
        rows = sch.fuse(*loops[:-2])
        sch.annotate(rows, "pragma_loop_partition_hint", 1)  # the border split off: the interior is a copy
        sch.annotate(loops[-2], "pragma_loop_partition_hint", 1)
        if _extent_product(sch, sch.get_loops(padding)) >= _MIN_PARALLEL:
            sch.parallel(rows)
        sch.vectorize(loops[-1])
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = [l for l, k in zip(loops, kinds) if k == 0]
    reduce = [l for l, k in zip(loops, kinds) if k == 2]
    rows = sch.fuse(*spatial[:-2]) if len(spatial) > 3 else spatial[0]
    chunk, lane = sch.split(sch.fuse(spatial[-2], spatial[-1]), [None, lanes])
    sch.reorder(rows, chunk, *reduce, lane)
    if _extent_product(sch, [rows, chunk, lane]) >= min_parallel:
        sch.parallel(rows)
    sch.vectorize(lane)
    return sch


def _extent_product(sch, loops) -> int:
    return math.prod(int(sch.get(loop).extent.value) for loop in loops)


def schedule_window(sch, block, epilogue=None, partition: bool = False, vector_bits: int | None = None,
                    min_parallel: int = _MIN_PARALLEL):
    """The loop nest above for the window block (also used by the strided rule for a reduction that
    writes the output itself). ``partition``: the padding is inlined, its bounds tests split off by
    LoopPartition along the output rows and columns. ``vector_bits``: the row's vector register
    (each block's lanes: that over its output's bits); None: 16 lanes."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(loops) != len(kinds) or any(not hasattr(sch.get(l).extent, "value") for l in loops):
        return None  # loops not one per axis, or symbolic: leave it
    spatial = [l for l, k in zip(loops, kinds) if k == 0]
    reduce = [l for l, k in zip(loops, kinds) if k == 2]
    inner = spatial[-1]
    total = _extent_product(sch, spatial)
    sch.reorder(*spatial[:-1], *reduce, inner)
    if partition and len(spatial) > 2:  # rows and columns: each split into border and interior
        sch.annotate(spatial[-2], "pragma_loop_partition_hint", 1)
        outer = sch.fuse(*spatial[:-2]) if len(spatial) > 3 else spatial[0]
        sch.annotate(outer, "pragma_loop_partition_hint", 1)
        if total >= min_parallel:
            sch.parallel(outer)
    elif len(spatial) > 1:
        outer = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
        total = int(sch.get(outer).extent.value) * int(sch.get(inner).extent.value)
        if total >= min_parallel:
            sch.parallel(outer)
    # no decompose_reduction: the update block without its init is no reduction block, and TIR
    # refuses to vectorize a loop over it; with the init kept, it lowers to a test of the window's
    # first tap, uniform across the vector lanes
    _vectorize_last(sch, block, vector_bits // _bits(sch.get(block)) if vector_bits else 16)
    if epilogue is not None:  # element-wise on each output row, while it is in cache
        if len(spatial) > 1:
            sch.reverse_compute_at(epilogue, sch.get_loops(block)[0])
        _vectorize_last(sch, epilogue, vector_bits // _bits(sch.get(epilogue)) if vector_bits else 16)
    return sch


def _vectorize_last(sch, block, lanes: int):
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent.value)
    if extent > lanes and extent % lanes == 0:
        _, loop = sch.split(loop, [None, lanes])
    if extent <= lanes or extent % lanes == 0:
        sch.vectorize(loop)
