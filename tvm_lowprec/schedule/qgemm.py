"""Schedule rule for the quantized GEMM built by :func:`tvm_lowprec.kernels.build_qgemm`.

Loop nest (kblock = 0, K whole inside the tile)::

    for panel in parallel(N / (lanes*nr)):          # one contiguous B micro-panel per task
      for mo in M / mr:                              # row tile
        acc[mr, panel] = 0
        for kb in K / kstep:                         # whole K: accumulators stay in registers
          for mi in unroll(mr): for g in unroll(nr):
            <intrinsic>(acc[mi, g*lanes:+lanes], A[mi, kb*kstep:+kstep], B[panel, kb, g])
        epilogue(acc[mr, panel])                    # bias, zero points, requantize: fused

With kblock > 0 a K-block loop sits between panel and row tiles, so the B panel slice stays in L1
while every row tile passes over it, and the epilogue runs once per panel after the last block.
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule

from ..kernels.qgemm import MAX_RUNS, MIN_PANEL_TASKS, best_runs, shares_row_tiles  # noqa: F401 (re-exported)
from .blocks import find_block
from .lookup_epilogue import WHOLE_ROWS


def _is_qgemm(func) -> bool:
    return func.attrs is not None and func.attrs.get("lowprec.op", None) == "qgemm"


class QGemmRule:
    """Declines anything that is not a lowprec qgemm PrimFunc. A symbolic M (rows known at run time)
    is tiled as a constant one is: the layout pads it to whole row tiles."""

    symbolic = True

    def apply(self, func, spec):
        if not _is_qgemm(func):
            return None
        mr, nr, kblock = (int(x) for x in func.attrs["lowprec.tile"])
        intrin = str(func.attrs["lowprec.intrin"])
        lanes, kstep = (int(x) for x in func.attrs["lowprec.vector"])
        batched = int(func.attrs.get("lowprec.batch", 0)) > 0
        rows = gemm_rows(func)
        sch = Schedule(func)
        self._prepare_inputs(sch)
        self._gemm(sch, mr // rows, nr, kblock, intrin, lanes, kstep, batched, rows)
        return sch

    # Step 1. Prepared activations and row sums: parallel over rows, vectorized along K.
    @staticmethod
    def _prepare_inputs(sch):
        for name in ("A_prepared", "rowsum"):
            block = find_block(sch, name)  # optional: absent means nothing to prepare
            if block is None:
                continue
            loops = sch.get_loops(block)
            sch.parallel(loops[0])
            # a row that no vector divides (K = 147, the 7x7x3 stem, padded to 148) is left to LLVM's
            # loop vectorizer: TVM's vectors with a masked tail ran 2.4 ms, the stem GEMM 1.8 ms so
            if name == "A_prepared" and int(sch.get(loops[-1]).extent) % 16 == 0:
                _, vec = sch.split(loops[-1], [None, 16])
                sch.vectorize(vec)

    # Step 2. Tile, tensorize, fuse the epilogue.
    @staticmethod
    def _gemm(sch, groups, nr, kblock, intrin, lanes, kstep, batched, rows=1):
        tile_gemm(sch, groups, nr, [None, kblock // kstep] if kblock else None, intrin, lanes, kstep, batched, rows)


# K steps of one tap unrolled at most. ResNet-50 at 112x112 on a Zen 4 (1 thread, kernels' sum / compile
# on one core): whole taps 6.06 ms / 26.9 s (its 4x4-output 3x3 layers of 512 channels at 261 GOPS, 128
# steps x 16 instructions a body); 32 steps 5.31 / 6.9 s; 16 5.26 / 5.8 s (458 GOPS); 8 5.32 / 5.3 s
MAX_TAP_UNROLL = 16


def _tap_unroll(steps: int) -> int:
    """The K steps of one convolution tap unrolled together: all of them up to :data:`MAX_TAP_UNROLL`,
    else the largest divisor of them no larger."""
    return max(d for d in range(1, min(steps, MAX_TAP_UNROLL) + 1) if steps % d == 0)


def gemm_rows(func) -> int:
    """Activation rows per instruction of a qgemm PrimFunc (``lowprec.rows``; 1 for dot products)."""
    return int(func.attrs.get("lowprec.rows", 1))


def row_loop(sch, rows: int = 1):
    """The gemm block's row loop: over rows, or over groups of ``rows`` rows for a matrix instruction
    (whose accumulator is blocked ``[M / rows, N / lanes, rows, lanes]``)."""
    return sch.get_loops(sch.get_sblock("gemm"))[-3 if rows == 1 else -5]


def tile_gemm(sch, mr, nr, k_blocks, intrin, lanes, kstep, batched=False, rows=1, runs=None):
    """The GEMM loop nest: ``mr`` rows (row groups where ``rows`` > 1) x ``nr`` vectors per tile
    (``mr`` an int or a sampled factor), the lane loop (the group's rows x lanes block) tensorized
    with ``intrin``. ``k_blocks``: None keeps all of K inside a row tile (epilogue fused per row
    tile); else the two factors ``[blocks, slices per block]`` of the ``K / kstep`` slices (or a
    function of the schedule and that loop giving them: a search samples them), a block loop between
    panel and row tiles (epilogue fused per panel). With K whole and a narrow GEMM
    (:func:`is_narrow`), runs of row tiles are the parallel loop: ``runs`` gives ``[runs, tiles per
    run]`` (a search's samples; default :func:`row_runs`)."""
    block = sch.get_sblock("gemm")
    window = rows == 1 and isinstance(mr, int) and window_tiles_apply(sch.mod["main"], mr)
    tiles = _window_tiles(sch, block, mr, _window_width(sch.mod["main"])) if window else None
    loops = sch.get_loops(block)
    batch = loops[0] if batched else None
    if rows == 1:
        m, n, k = loops[-3:]
        panel, g, lane = sch.split(n, [None, nr, lanes])
        inner = (lane,)
    else:  # the block's own (row, lane) loops are the instruction's
        m, n, r, lane, k = loops[-5:]
        panel, g = sch.split(n, [None, nr])
        inner = (r, lane)
    # a window's tiles: output rows (q) x tiles along them (mo); else the tiles of M
    q, mo, mi = tiles if window else (None, *sch.split(m, [None, mr]))
    rows_of = [q] if q is not None else []
    epi = sch.get_sblock("epilogue")
    if k_blocks is not None:
        slices, ki = sch.split(k, [None, kstep])
        ko, kb = sch.split(slices, k_blocks(sch, slices) if callable(k_blocks) else k_blocks)
        sch.reorder(panel, ko, *rows_of, mo, kb, mi, g, *inner, ki)
        sch.parallel(_with_batch(sch, batch, panel))
        sch.decompose_reduction(block, ko)
        _fuse_epilogue(sch, epi, panel)
    else:
        kb, ki = sch.split(k, [None, kstep])
        narrow = is_narrow(sch.mod["main"])
        # each task of a narrow GEMM writes whole output rows (its epilogue fused under the row tiles; a
        # row-sum term keeps it a pass of its own): WHOLE_ROWS marks that loop, for a lookup after it
        whole_rows = find_block(sch, "rowsum") is None
        if q is not None and narrow:  # the output rows are the runs
            sch.reorder(q, panel, mo, kb, mi, g, *inner, ki)
            sch.parallel(q)
            if whole_rows:
                sch.annotate(q, WHOLE_ROWS, 1)
        else:
            if runs is None and narrow and _static(sch, mo):  # a symbolic M: the panels are the parallel loop
                runs = row_runs(_extent(sch, mo))
            if runs is not None:
                run, mo = sch.split(mo, runs)
                sch.reorder(run, panel, mo, kb, mi, g, *inner, ki)
                sch.parallel(run)
                if whole_rows:
                    sch.annotate(run, WHOLE_ROWS, 1)
            else:
                sch.reorder(panel, *rows_of, mo, kb, mi, g, *inner, ki)
                sch.parallel(_with_batch(sch, batch, panel))
        sch.decompose_reduction(block, kb)
        _fuse_epilogue(sch, epi, mo)
    sch.tensorize(inner[0], intrin)
    sch.unroll(mi)
    sch.unroll(g)
    conv = sch.mod["main"].attrs.get("lowprec.window", None)
    if conv is not None and _extent(sch, kb) % (int(conv[2]) // kstep) == 0:
        # each tap's channel steps unrolled (constant offsets from the tap's address), the taps a loop.
        # Measured (AMX Xeon, 1 thread, us; all of K unrolled / taps looped): 6400x8x72 52 / 36,
        # 6400x16x72 47 / 37, 14400x6x216 244 / 180 (spilled accumulators), the 9-tap stem 84 / 87.
        # At most MAX_TAP_UNROLL steps of a tap unrolled: a wide layer's whole tap is a body of
        # thousands of instructions (ResNet-50's 512-channel 3x3 at 4x4 outputs: 128 steps x 16)
        sch.unroll(sch.split(kb, [None, _tap_unroll(int(conv[2]) // kstep)])[1])
    init = sch.get_sblock("gemm_init")
    if rows > 1:  # one vector per accumulator block
        sch.fuse(*sch.get_loops(init)[-2:])
    _vectorize_inner(sch, init, lanes * rows)
    _vectorize_inner(sch, epi, lanes * rows)


# A GEMM with fewer B panels than MIN_PANEL_TASKS (every convolution of a small detector: 8 to 64
# channels, one to four panels) runs its row tiles in parallel instead: with the panels as the parallel
# loop it had one to three tasks and ran on one thread (6400x16x48, Zen 3, 1 / 2 threads: 0.18 / 0.18
# ms; in runs of row tiles 0.19 / 0.11 ms). Runs of row tiles, not the tiles themselves, are the
# parallel loop: a parallel loop's body keeps its own allocations (the accumulator tile, the
# intrinsic's locals), and TVM makes them TVMBackendAllocWorkspace calls per iteration; one per tile
# cost 2x at one thread (0.38 ms), one per run nothing. At most MAX_RUNS runs, dividing the tiles
# exactly: a split that does not divide puts a predicate on the GEMM block, which tensorize's
# comparator refuses (the layout pads M where the tiles have no divisor to share:
# kernels.qgemm.splittable_rows).


def is_narrow(func) -> bool:
    """A qgemm PrimFunc whose row tiles, not its B panels, its threads share (fewer than
    :data:`MIN_PANEL_TASKS` panels, no batch); with K blocks the panels stay the parallel loop."""
    _, nr, kblock = (int(x) for x in func.attrs["lowprec.tile"])
    lanes, _ = (int(x) for x in func.attrs["lowprec.vector"])
    return shares_row_tiles(int(func.attrs["lowprec.shape"][1]), lanes * nr, kblock, int(func.attrs.get("lowprec.batch", 0)))


def row_runs(tiles: int) -> list[int]:
    """``[runs, tiles per run]`` for ``tiles`` row tiles: the most runs up to :data:`MAX_RUNS` that divide
    them (a prime number of tiles: one run, as one panel has)."""
    runs = best_runs(tiles)
    return [runs, tiles // runs]


def _window_tiles(sch, block, mr: int, out_w: int):
    """The row loops ``(q, tile, r)`` of a GEMM read through a convolution window whose row tile
    divides the output width: the block's row iterator ``m`` becomes ``(b * OH + oh, ow)``, so the
    window's index is ``ow * sw`` plus constants in the tile's rows (``ow = tile_w * mr + r``) and the
    division by the width happens once per output row ``q`` (the parallel loop of a narrow GEMM).
    Split plainly, ``m = (run * R + tile) * mr + r`` kept ``m // OW``, ``m % OW`` per row, which TVM's
    simplifier does not split and LLVM then divided for every row (the 4-channel stem: 98 us, 75 so)."""
    if len(sch.get_loops(block)) == 4:  # a grouped convolution's GEMMs: the group first
        sch.transform_block_layout(block, lambda g, m, n, k: (g, m // out_w, m % out_w, n, k))
    else:
        sch.transform_block_layout(block, lambda m, n, k: (m // out_w, m % out_w, n, k))
    q, ow = sch.get_loops(sch.get_sblock("gemm"))[-4:-2]
    ow_tile, r = sch.split(ow, [None, mr])
    return q, ow_tile, r


def window_tiles_apply(func, mr: int) -> bool:
    """Whether :func:`tile_gemm` lays a qgemm's row tiles of ``mr`` along the output rows of its
    convolution window (:func:`_window_tiles`): a GEMM read through a window whose output width ``mr``
    divides, its M not padded (the layout's row tile divides M too)."""
    out_w = _window_width(func)
    return out_w > 0 and out_w % mr == 0 and int(func.attrs["lowprec.shape"][0]) % int(func.attrs["lowprec.tile"][0]) == 0


def _window_width(func) -> int:
    """The output width of a GEMM read through a convolution window (``lowprec.window``), else 0."""
    window = func.attrs.get("lowprec.window", None)
    return 0 if window is None else int(window[10])


def _static(sch, loop) -> bool:
    return hasattr(sch.get(loop).extent, "value")


def _extent(sch, loop) -> int:
    extent = sch.get(loop).extent
    return int(extent.value) if hasattr(extent, "value") else 1 << 30  # symbolic: many


def _with_batch(sch, batch, panel):
    """The loop to parallelise: the panels, fused with the batch when there is one."""
    return panel if batch is None else sch.fuse(batch, panel)


def _fuse_epilogue(sch, epi, loop):
    """Move the epilogue under ``loop`` so it reads the accumulator tile while it is hot.

    With a row-sum term (nonzero weight zero point) the epilogue also reads ``rowsum``, made by a
    separate pass: it then stays a pass of its own over the whole accumulator (rare: symmetric
    weights, the common case, have no such term).
    """
    if find_block(sch, "rowsum") is None:  # no row term: fuse
        # unit loops kept: the loop count must not depend on the tile (a search replays this trace
        # with other row tiles, 1 included)
        sch.reverse_compute_at(epi, loop, preserve_unit_loops=True)
        return
    sch.parallel(sch.get_loops(epi)[0])


def _vectorize_inner(sch, block, lanes):
    """Vectorize the innermost loop of ``block`` by ``lanes`` (split first when it is longer)."""
    loops = sch.get_loops(block)
    inner = loops[-1]
    extent = sch.get(inner).extent
    if hasattr(extent, "value") and extent.value > lanes and extent.value % lanes == 0:
        _, inner = sch.split(inner, [None, lanes])
    sch.vectorize(inner)


class PackBRule:
    """Run-time weight packing (:func:`~tvm_lowprec.kernels.build_pack_b`): each block parallel over its
    outermost loop (batch x panel for the packing). The column sums run row by row of B, a vector of B's
    bytes at a time, not down each column with every load a row apart (BERT's 12x64x128 pack 15.9 -> 2.8
    us on the Zen 5 host, one thread, alone; MiniLM's 12x32x128 1.5 us either way), and the correction
    from them in vectors. Where the padded columns are not whole vectors of bytes, the sums go in vectors of
    int32, and the loop over those vectors carries ``pragma_loop_partition_hint``, so the vectors past the
    last column are split off from the interior's (Zen 3, AVX2, one thread, alone: ViT's 12x64x50 pack 33.6
    -> 16.7 us, Whisper's 6x64x250 70.5 -> 33.9 us; before, every vector tested every column). The column-sum block is absent when the activation zero point cancels it (za'
    = 0)."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "pack_b":
            return None
        sch = Schedule(func)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            name = sch.get(block).name_hint
            if name == "colsum":  # (batch, column, row) -> (batch, row, column): rows of B added in vectors,
                sch.reorder(loops[0], loops[2], loops[1])  # a vector of B's bytes per step (4 of int32 sums)
                columns, lanes = _extent(sch, loops[1]), spec.gemm.vector_bits // 8
                _vectorize_inner(sch, block, lanes if columns % lanes == 0 else spec.gemm.vector_bits // 32)
                outer = sch.get_loops(block)
                if len(outer) > 3:  # columns in vectors and a padded tail: the tail split off
                    sch.annotate(outer[-2], "pragma_loop_partition_hint", 1)
            elif name == "corr":
                _vectorize_inner(sch, block, spec.gemm.vector_bits // 32)
            elif name == "B_packed":
                _pack_panels(sch, loops)
            sch.parallel(sch.fuse(loops[0], loops[1]) if name == "B_packed" else loops[0])
        return sch


def _pack_panels(sch, loops):
    """The packing's loops over K-groups and column groups carry ``pragma_loop_partition_hint``: TVM's
    LoopPartition splits off the padded border, so the interior has no bounds test per byte and LLVM
    vectorizes it (Whisper's 6x250x64 P*V pack: 37.5 -> 4.5 us; its 6x64x250 K pack, columns padded:
    35 -> 15 us; BERT's 12x128x64, no border: 4.2 -> 4.4 us; Zen 4, one thread, alone). Unrolling the
    panel step as well made the unpadded packs slower (5.7 us) and the padded ones no faster."""
    for loop in loops[2:-2]:
        sch.annotate(loop, "pragma_loop_partition_hint", 1)


def narrow_indices(func):
    """``func`` with its indices and loops in int32: TVM's LoopPartition ignores the partition hint of
    an int64 loop (the padding copy in int64 shapes, as FuseTIR needs it beside TVM's legalized
    operators: 3.9 -> 52 us for a 160x160x8 copy, its border Select left in every element)."""
    narrowed = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    # a deep copy: the pass's result shares the statements it left unchanged with ``func``, and a
    # Schedule over them then rewrote ``func`` itself in place (the next rule saw a scheduled function)
    return tvm.ir.load_json(tvm.ir.save_json(narrowed))


COPY_MIN_PARALLEL = 1 << 16  # bytes an im2col or padding copy writes before it forks (1x80x80x8: 1.1 us
# alone, 1.5 us on two threads of a Zen 4; 1x160x160x8: 3.9 -> 3.0 us)


class Im2colRule:
    """im2col (:func:`~tvm_lowprec.kernels.im2col.build_im2col`, NHWC): the padding copy and the
    gather, each parallel over its two outer loops; the contiguous channel run vectorized when it fills
    whole vectors, else left to LLVM's loop vectorizer (24 channels: 0.28 ms unrolled, 0.14 ms so, for
    a 120x120 3x3 im2col). The padding copy's rows and columns carry ``pragma_loop_partition_hint``:
    TVM's LoopPartition splits off the border, so the interior is a copy without the padding's Select,
    its channels unrolled where no vector fits them (the 3-channel stem of a 320x320 detector, Zen 3,
    one thread: 0.24 -> 0.10 ms for the whole im2col; 8 channels at 160x160 0.09 -> 0.07 ms). The
    padding copy alone (``lowprec.op = "pad"``, before a GEMM that reads the window in place) is
    scheduled the same way."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) not in ("im2col", "pad"):
            return None
        sch = Schedule(narrow_indices(func))
        lanes = spec.gemm.vector_bits // 8
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            channels = int(sch.get(loops[-1]).extent)
            rows = sch.fuse(loops[0], loops[1])
            if math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(block)) >= COPY_MIN_PARALLEL:
                sch.parallel(rows)
            padding = sch.get(block).name_hint == "padded"
            if padding:  # TVM's LoopPartition splits off the border rows and columns: no Select inside
                for loop in (rows, loops[2]):
                    sch.annotate(loop, "pragma_loop_partition_hint", 1)
            if channels % lanes == 0 or channels in (lanes // 2, lanes // 4):
                _vectorize_inner(sch, block, lanes)
            elif not padding and _grouped(func):  # one group's channels a tap: one short vector copy
                if channels in (4, 8, 16):  # of 32 to 128 bits; the (kw, c) run is not contiguous here
                    sch.vectorize(loops[-1])
            elif padding:  # a few channels (the 3-channel stem): one copy per pixel, unrolled
                sch.unroll(loops[-1])
            elif _taps_contiguous(func):  # a tap row's (kw, c) run is one vector copy
                sch.vectorize(sch.fuse(loops[-2], loops[-1]))
        return sch


def _grouped(func) -> bool:
    """Whether an im2col gathers a grouped convolution's groups (each tap's run is one group's channels)."""
    return int(func.attrs.get("lowprec.groups", 1)) > 1


def _taps_contiguous(func) -> bool:
    """Whether an im2col's ``(kw, c)`` run is contiguous in its source (no dilation along W)."""
    return int(func.attrs.get("lowprec.dilation_w", 1)) == 1
