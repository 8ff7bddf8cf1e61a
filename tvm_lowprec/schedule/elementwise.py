"""Fallback rule for the remaining injective PrimFuncs (quantize, dequantize, casts, reshapes).

Inlines the blocks into the ones writing the outputs (a fused chain of injective operators becomes one
loop nest per output: one, or several for a split) and keeps each nest's axes: the outer ones fused and
parallel, the innermost vectorized. Fusing every axis into one vectorized loop makes every lane divide
its position back into indices when the innermost extent is not a multiple of the vector (a 6400x24
transpose-and-concatenate: 1.6 ms so, 0.33-0.51 ms as a nest; a 25600x27 reshape 0.61 -> 0.06 ms).

A concatenation along the innermost axis whose pieces do not start at multiples of the vector (4 pieces
of 6 channels) would compute every piece in every lane: where its pieces are at most a vector of bytes,
the axis is split into steps of the pieces' common divisor and cut into one loop per step, so each step's piece
is known, its select folds and its (resized) indices simplify, the column loop kept apart from the fused
rows (a text detector's FPN upsample-and-concatenate, 1x120x120x24: 0.102 -> 0.013 ms on the Zen 5 host,
one thread, alone); otherwise (one exception to inlining) its pieces are computed into buffers of their
own first (6.4 -> 0.55 ms before the steps). A concatenation whose pieces do start at multiples of the
vector is partitioned instead: the innermost loop is cut at the pieces' boundaries into one loop per
piece, so that each vector reads one piece, contiguously, with no per-lane select of the pieces and its
indices simplified (a YOLO C2f block's split-add-concatenate, 1x80x80x24 from three 8-channel pieces:
0.24 -> 0.057 ms on a 2-core Emerald Rapids, where the pieces read through a flattened view had been
gathered a byte at a time). Declines functions with reductions (those need a rule of their own) and
chains that cannot be inlined.
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule
from tvm.tirx.analysis import undefined_vars
from tvm.sym.analyzer import Analyzer

from ..kernel_cost import buffer_bytes
from .affine_loads import affine_loads
from .blocks import root_children, subexpressions
from .qgemm import narrow_indices

_VECTOR = 16
_LANES = (16, 8)  # vector widths tried for the innermost axis, widest first
_MAX_UNROLL = 32  # a short innermost axis that no width divides is unrolled (its indices fold)
_MIN_PARALLEL = 1 << 14  # below this many elements a thread fork costs more than it saves
_MIN_ROWS = 8  # a concatenation's column loop is kept apart only above this many rows (parallel grain)
_READ_ORDER_BYTES = 1 << 18  # a read this large is swept in its own order (_in_read_order)
_MIN_LOOSE = 16  # the shortest piece of a concatenation cut into one loop per piece (_partition_loose)
_FLAT = 64  # elements per vector of a flat nest: a zmm of bytes (LLVM splits it where that is wider)


def _int64_data(func) -> bool:
    """Whether a buffer of ``func`` holds int64 values (positions, token ids): ForceNarrowIndexToInt32
    stops there ("The buffer parameter ... has dtype T.int64")."""
    return any(str(getattr(param.ty, "dtype", "")) == "int64" for param in func.params)


class ElementwiseRule:
    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        sch = Schedule(func)
        root, blocks = root_children(sch)
        if not blocks or any(iv.iter_type != 0 for b in blocks for iv in sch.get(b).iter_vars):
            return None  # empty, or a reduction: not ours
        # its border split off by LoopPartition: int32 loops (TVM's narrowing refuses int64 data buffers)
        if any(_is_padding(sch.get(b)) for b in blocks) and not _int64_data(func):
            sch = Schedule(narrow_indices(func))
            root, blocks = root_children(sch)
        blocks = _without_trailing_reshapes(sch, blocks)
        kept = _pieces_of_misaligned_concats(sch, blocks)
        leaves = []  # the blocks that write the function's outputs (several for a split), and kept ones
        intermediates = list(sch.get(root).alloc_buffers) if root is not None else []
        for producer in blocks[:-1]:
            if sch.get(producer).name_hint in kept:
                leaves.append(producer)
                continue
            try:
                sch.compute_inline(producer)
            except tvm.s_tir.schedule.ScheduleError:
                if any(region.source.same_as(b) for region in sch.get(producer).writes for b in intermediates):
                    return None  # an intermediate that cannot be inlined: not a chain of injective ops
                leaves.append(producer)
        leaves.append(blocks[-1])
        before = sch.mod["main"]
        after = affine_loads(before)
        if not after.same_as(before):  # the inlined copies' reads in their simplest form
            names = [sch.get(block).name_hint for block in leaves]
            sch = Schedule(after)
            leaves = [sch.get_sblock(name) for name in names]
        for block in leaves:
            if not _nest(sch, block):
                return None
        return sch


def _without_trailing_reshapes(sch, blocks) -> list:
    """The blocks after the reshapes that end the chain were folded into the block before them
    (``reverse_compute_inline``: it writes the output's flat positions from its own loop nest), as long
    as one can be: a nest over the reshaped output would divide every lane's flat position back into
    the producer's indices (an FPN's nearest upsample into a flat 86400-byte piece: 0.11 ms of scalar
    gathers)."""
    while len(blocks) > 1 and sch.get(blocks[-1]).name_hint.startswith("T_reshape"):
        try:
            sch.reverse_compute_inline(blocks[-1])
        except tvm.s_tir.schedule.ScheduleError:
            break
        blocks = blocks[:-1]
    return blocks


def _offset_along(index):
    """(var, c) for an index ``var - c`` or ``var``; None for anything else."""
    if isinstance(index, tvm.tirx.Var):
        return index, 0
    if isinstance(index, tvm.tirx.Sub) and isinstance(index.a, tvm.tirx.Var) and isinstance(index.b, tvm.tirx.IntImm):
        return index.a, int(index.b.value)
    return None


def _pieces_of_misaligned_concats(sch, blocks) -> set[str]:
    """Names of the blocks that write the pieces of a concatenation along the innermost axis whose
    piece offsets are not all multiples of the vector width it will get."""
    kept = set()
    for block in blocks:
        stmt = sch.get(block)
        if not stmt.writes or not stmt.iter_vars:
            continue
        extent = stmt.iter_vars[-1].dom.extent
        if not hasattr(extent, "value"):
            continue
        lanes = next((v for v in _LANES if int(extent.value) % v == 0), None)
        inner = stmt.iter_vars[-1].var
        offsets = {}
        for region in stmt.reads:
            if not region.region:
                continue  # a scalar
            found = _offset_along(region.region[-1].min)
            if found is not None and found[0].same_as(inner):
                offsets[region.source.name] = found[1]
        if len(set(offsets.values())) < 2 or (lanes is not None and all(o % lanes == 0 for o in offsets.values())):
            continue
        if _partitionable(stmt, inner, int(extent.value)):
            continue  # cut into one loop per piece instead (_partition_pieces)
        for producer in blocks:
            if any(w.source.name in offsets for w in sch.get(producer).writes):
                kept.add(sch.get(producer).name_hint)
    return kept


def _piece_sizes(stmt, var, extent: int) -> list[int] | None:
    """The sizes of the pieces of a concatenation along ``var`` (:func:`_piece_cuts`), or None."""
    cuts = _piece_cuts(stmt, var, extent)
    if not cuts:
        return None
    bounds = [0, *cuts, extent]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _step(sizes: list[int], extent: int) -> int | None:
    """The step :func:`_partition_pieces` unrolls a concatenation of pieces ``sizes`` in (their common
    divisor), or None: a piece wider than a vector of bytes, or more than ``_MAX_UNROLL`` steps."""
    step = math.gcd(*sizes)
    return step if max(sizes) <= _FLAT and extent // step <= _MAX_UNROLL else None


def _partitionable(stmt, var, extent: int) -> bool:
    """A concatenation along ``var`` that :func:`_partition_pieces` computes in unrolled steps, or
    cuts into one loop per piece (pieces of at least :data:`_MIN_LOOSE` elements)."""
    sizes = _piece_sizes(stmt, var, extent)
    return sizes is not None and (_step(sizes, extent) is not None or _loose(sizes))


def _loose(sizes: list[int]) -> bool:
    """Pieces :func:`_partition_loose` takes: none shorter than :data:`_MIN_LOOSE`, one at least in
    whole vectors (else each piece's loop would be scalar: computed into buffers of their own first)."""
    return min(sizes) >= _MIN_LOOSE and any(size % lanes == 0 for size in sizes for lanes in _LANES)


def _piece_cuts(stmt, var, extent: int) -> list[int] | None:
    """Where the pieces of a concatenation along ``var`` (extent ``extent``) start, from the
    ``if_then_else`` conditions of ``stmt``'s value (``c <= var``, as TVM's concatenate writes them; the
    other comparisons with a constant too), each strictly inside the axis; None where a condition
    compares ``var`` in any other way (nothing to cut at safely)."""
    from tvm.tirx.analysis import undefined_vars

    select = tvm.ir.Op.get("prim.if_then_else")
    cuts = set()
    for node in subexpressions(stmt.body.value if hasattr(stmt.body, "value") else stmt.body):
        if not (isinstance(getattr(node, "op", None), tvm.ir.Op) and node.op.same_as(select)):
            continue
        cond = node.args[0]
        if not any(v.same_as(var) for v in undefined_vars(cond)):
            continue
        a, b = getattr(cond, "a", None), getattr(cond, "b", None)
        if not isinstance(cond, (tvm.tirx.LE, tvm.tirx.LT, tvm.tirx.GE, tvm.tirx.GT)):
            return None
        if isinstance(a, tvm.tirx.IntImm) and b.same_as(var):  # c <= v, c < v, c >= v, c > v
            cut = int(a.value) + (1 if isinstance(cond, (tvm.tirx.LT, tvm.tirx.GE)) else 0)
        elif isinstance(b, tvm.tirx.IntImm) and a.same_as(var):  # v < c, v <= c, v >= c, v > c
            cut = int(b.value) + (1 if isinstance(cond, (tvm.tirx.LE, tvm.tirx.GT)) else 0)
        else:
            return None
        if 0 < cut < extent:
            cuts.add(cut)
    return sorted(cuts)


def _partition_loose(sch, inner, sizes: list[int]) -> bool:
    """A concatenation of pieces with no vector width in common and too long to unroll (a detector
    head's 400, 100 and 25 anchors) cut at the pieces' boundaries: each piece's loop reads its one
    piece, in vectors of the widest width that divides it, unrolled when short, else left to LLVM (the
    head's dequantize-requantize-concatenate of 84x525 values, its reads affine: 71 -> 28 us, Zen 4, one
    thread, alone)."""
    pieces = sch.loop_partition(inner, sizes[:-1])
    for piece, size in zip(pieces, sizes):
        for child in sch.get_child_blocks(piece):
            loop = sch.get_loops(child)[-1]
            lanes = next((v for v in _LANES if size % v == 0), None)
            if lanes is not None:
                sch.vectorize(sch.split(loop, [None, lanes])[1] if size > lanes else loop)
            elif size <= _MAX_UNROLL:
                sch.unroll(loop)
    return True


def _partition_pieces(sch, block) -> bool:
    """The innermost loop of ``block`` vectorized piece by piece where it writes a concatenation of
    several pieces that are each a whole number of vectors: split into vectors of the widest width
    every piece takes, the loop over vectors cut at the pieces' boundaries (TVM can split only loops
    that start at 0), each piece's vector loop vectorized. False: nothing done."""
    stmt, inner = sch.get(block), sch.get_loops(block)[-1]
    extent = int(sch.get(inner).extent.value)
    sizes = _piece_sizes(stmt, stmt.iter_vars[-1].var, extent)
    if sizes is None:
        return False
    width = next((v for v in _LANES if all(size % v == 0 for size in sizes)), None)
    if width is None:  # pieces of a few channels (an FPN's 6): steps of their common divisor, a loop each
        step = _step(sizes, extent)
        if step is None:
            return _loose(sizes) and _partition_loose(sch, inner, sizes)
        steps, _ = sch.split(inner, [None, step])
        count = extent // step
        # one loop per step, so each step's piece is known when TVM vectorizes it: the selects fold, the
        # indices simplify (unrolled instead, the vectorizer met a select on a vector condition and made
        # the whole loop scalar: GhostNet's 12 + 12-channel concatenate-and-add of 1x32x32, 14-21 -> 4 us,
        # Zen 4, one thread, alone)
        for piece in sch.loop_partition(steps, [1] * (count - 1)) if count > 1 else [steps]:
            for child in sch.get_child_blocks(piece):
                if step > 1:
                    sch.vectorize(sch.get_loops(child)[-1])
        return True
    if extent == width:  # one vector: nothing to cut
        sch.vectorize(inner)
        return True
    vectors, _ = sch.split(inner, [None, width])
    pieces = sch.loop_partition(vectors, [size // width for size in sizes[:-1]])
    for piece in pieces:
        for child in sch.get_child_blocks(piece):
            sch.vectorize(sch.get_loops(child)[-1])
    return True


def _reads_run_along(stmt, var) -> bool:
    """Every read's innermost index moves with ``var``: a vector along it reads contiguous runs."""
    reads = [r for r in stmt.reads if r.region]  # scalars aside
    return bool(reads) and all(any(v.same_as(var) for v in undefined_vars(r.region[-1].min)) for r in reads)


def _is_padding(stmt) -> bool:
    """The block stores ``Select(inside, value, pad)`` with ``pad`` the same for every element: a
    padding copy (the stem's padded input, whose padding copy FuseOps merged into the image's
    quantize-and-transpose). ``pad`` is a constant or the zero point read from the kernel's parameter
    (:func:`~tvm_lowprec.kernels.im2col.pad_argument`): anything that reads none of the block's axes."""
    store = stmt.body
    value = getattr(store, "value", None) if isinstance(store, tvm.tirx.BufferStore) else None
    if not isinstance(value, tvm.tirx.Select):
        return False
    axes = [iv.var for iv in stmt.iter_vars]
    return not any(v.same_as(axis) for v in undefined_vars(value.false_value) for axis in axes)


def _vectorize_layout_change(sch, block) -> bool:
    """A layout change whose output's innermost axis is short and is not the axis its reads run along
    (an NCHW image quantized into NHWC, 3 channels): the rows parallel, the last two axes left to LLVM,
    whose loop vectorizer loads along the axis before the last and interleaves the stores (TVM's
    vectorizer can only scatter them). Measured on a 1x3x320x320 image: 0.08 ms so, 0.22 ms with TVM
    vectors along that axis, 0.32 ms vectorizing the fused loop (a gather with a division per lane).

    Padded (the image written straight into the stem's padded 4-channel input): the rows and columns
    carry ``pragma_loop_partition_hint``, so TVM's LoopPartition splits off the border and the interior
    is the plain layout change; the channels are unrolled, so the padding channel is a constant store."""
    loops, stmt = sch.get_loops(block), sch.get(block)
    extents = [sch.get(l).extent for l in loops]
    if len(loops) < 2 or len(stmt.iter_vars) != len(loops) or not all(hasattr(e, "value") for e in extents):
        return False
    last, second = int(extents[-1].value), int(extents[-2].value)
    ivs = [iv.var for iv in stmt.iter_vars]
    padding = _is_padding(stmt)
    if (last >= _VECTOR or (second % _VECTOR and not padding) or _reads_run_along(stmt, ivs[-1])
            or not _reads_run_along(stmt, ivs[-2])):
        return False
    rows = None
    if len(loops) > 2:
        rows = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        total = last * second * int(sch.get(rows).extent.value)
        if total >= _MIN_PARALLEL and int(sch.get(rows).extent.value) > 1:
            sch.parallel(rows)
    if padding:
        for loop in (rows, loops[-2]):
            if loop is not None:
                sch.annotate(loop, "pragma_loop_partition_hint", 1)
        sch.unroll(loops[-1])
    return True


def padding_nest(sch, block, min_parallel: int = _MIN_PARALLEL) -> bool:
    """A padding copy merged into its producer (an integer add before a convolution that reads its
    window in place), laid out as it is: the rows parallel, rows and columns partitioned (the border
    split off), the channels in vectors where a width divides them, else unrolled. False: not one."""
    loops, stmt = sch.get_loops(block), sch.get(block)
    if len(loops) < 3 or len(stmt.iter_vars) != len(loops) or not _is_padding(stmt):
        return False
    channels = int(sch.get(loops[-1]).extent.value)
    rows = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
    if math.prod(int(sch.get(l).extent.value) for l in (rows, *loops[-2:])) >= min_parallel:
        sch.parallel(rows)
    for loop in (rows, loops[-2]):
        sch.annotate(loop, "pragma_loop_partition_hint", 1)
    lanes = next((v for v in (_FLAT, 32, *_LANES) if channels % v == 0), None)
    if lanes is not None:
        sch.vectorize(sch.split(loops[-1], [None, lanes])[1] if channels > lanes else loops[-1])
    elif channels <= _MAX_UNROLL:
        sch.unroll(loops[-1])
    return True


def _flat_index(region, analyzer):
    """The row-major position of a buffer region's first element (its shape's strides)."""
    position = tvm.tirx.IntImm("int64", 0)
    for extent, rng in zip(region.source.shape, region.region):
        position = position * extent + rng.min
    return analyzer.simplify(position)


def _reads_in_flat_order(stmt) -> bool:
    """Every buffer the block reads (scalars aside) is read at the position it writes, counted in
    row-major order: the reshapes of a chain (a [57600, 8] GEMM output added to a [1, 240, 240, 8] tensor)
    do not move any element, so the nest is one flat loop."""
    if not stmt.iter_vars or len(stmt.writes) != 1:
        return False
    analyzer = Analyzer()
    for iv in stmt.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    out = _flat_index(stmt.writes[0], analyzer)
    reads = [r for r in stmt.reads if r.region and any(int(getattr(e, "value", 2)) != 1 for e in r.source.shape)]
    return bool(reads) and all(analyzer.can_prove_equal(_flat_index(r, analyzer), out) for r in reads)


def _flat_lanes(extents) -> int | None:
    """The widest vector of at most :data:`_FLAT` elements, from 8, for a flat loop over ``extents``: one
    that every trailing product of the extents (a pixel's channels, a row's pixels, ...) divides or is a
    divisor of, so a vector starting at a multiple of its width meets every boundary at the same lane.
    Otherwise each lane computes its own address from ``x // 576 * 576 + x % 576 // 24 * 24 + x % 24``,
    which TVM's simplifier does not fold back to ``x`` in a vector, and the loads become byte gathers
    (Keras MobileNetV2's 1x24x24x24 residual add: 14.7 us in vectors of 64, 1.2 us in vectors of 48,
    two pixels; Zen 4, one thread, alone)."""
    suffixes, product = [], 1
    for e in reversed(extents):
        product *= e
        suffixes.append(product)
    for lanes in range(_FLAT, 7, -1):
        if product % lanes == 0 and all(lanes % p == 0 or p % lanes == 0 for p in suffixes):
            return lanes
    return None


def _flat_nest(sch, block, extents) -> bool:
    """A block whose innermost axis is shorter than :data:`_FLAT` and whose reads are all in its own
    flat order, as one loop: vectors of up to :data:`_FLAT` elements whatever the channel count (an 8-channel
    dequantize-add-quantize of 1x240x240x8: 0.04-0.08 ms as a nest of 8-lane vectors, 0.021 ms flat on a
    Zen 5), the vectors' loop parallel, its width from :func:`_flat_lanes`. False: nothing done."""
    total = 1
    for e in extents:
        total *= e
    lanes = _flat_lanes(extents) if extents[-1] < _FLAT else None
    if lanes is None or len(extents) < 2 or not _reads_in_flat_order(sch.get(block)):
        return False
    outer, vec = sch.split(sch.fuse(*sch.get_loops(block)), [None, lanes])
    sch.vectorize(vec)
    if total >= _MIN_PARALLEL:
        sch.parallel(outer)
    return True


def _reads_a_row_operand(stmt) -> bool:
    """Whether the block reads a buffer indexed by its innermost axis alone (a per-channel gate or
    scale: the same vector for every pixel). As one vector of several whole vectors that are no power
    of two (48 channels: three of 16), LLVM hoists it out of the pixel loop as lanes that it rebuilds
    with one insert each per pixel (the text detector's squeeze-excite gate multiply, 1x60x60x48: 110
    us, 3% of copy; 20 us in steps of 16, the gate reloaded per step). 24 channels (16 + 8 lanes) keep
    their one vector (tests/test_schedule_rules.py)."""
    last, outer = stmt.iter_vars[-1].var, [iv.var for iv in stmt.iter_vars[:-1]]
    for region in stmt.reads:
        names = [n for r in region.region for n in subexpressions(r.min) if isinstance(n, tvm.tirx.expr.Var)]
        if any(n.same_as(last) for n in names) and not any(n.same_as(o) for n in names for o in outer):
            return True
    return False


def _in_read_order(sch, block, loops) -> list:
    """``loops`` (the block's outer loops, in the order of its iteration variables) reordered to follow
    the axes of the largest buffer the block reads, so the parallel loop sweeps that buffer once. A
    transpose back to NCHW writes ``y[c, h, w] = f(x[h, w, c])``: with ``c`` outermost every channel
    sweeps all of ``x`` again at a stride (lraspp's 1x160x160x21 float output, 2.15 MB over a 1 MB L2:
    0.50 ms); ordered ``h, c`` each row of ``x`` is read while it is in L1 (0.16 ms, Zen 4, one thread,
    alone). Only for a buffer of at least :data:`_READ_ORDER_BYTES`, which a pass per channel would
    bring from beyond L2. Loops whose variable the buffer's indices do not use go outermost; ties keep
    their order."""
    stmt = sch.get(block)
    if len(loops) < 2 or len(stmt.iter_vars) < len(loops):
        return loops
    reads = [r for r in stmt.reads if r.region and buffer_bytes(r.source) is not None]
    if not reads:
        return loops
    read = max(reads, key=lambda r: buffer_bytes(r.source))
    if buffer_bytes(read.source) < _READ_ORDER_BYTES:  # in cache whatever the order: the writes' order counts (ConvNeXt's
        return loops  # last 3x3x768 NHWC -> NCHW, 7 KiB read: 6.5 us as written, 22 us in the read's order)

    def axis_of(i):
        var = stmt.iter_vars[i].var
        axes = [a for a, r in enumerate(read.region) if any(v.same_as(var) for v in undefined_vars(r.min))]
        return min(axes) if axes else -1

    order = sorted(range(len(loops)), key=axis_of)
    if order == list(range(len(loops))):
        return loops
    sch.reorder(*[loops[i] for i in order])
    return [loops[i] for i in order]


def _reads_a_fraction(stmt) -> bool:
    """Whether a read's innermost index is the innermost axis divided by a constant (a repeat along
    the channels: ``y[..., c] = x[..., c // m]``). TVM vectorizes that as a gather of a byte per lane;
    steps of up to 64 elements unrolled let LLVM's SLP vectorizer make them loads and byte shuffles
    (FastViT's channel repeat, 1x32x32x48 -> 96: 42.6 -> 1.8 us, Zen 4, one thread, alone)."""
    if not stmt.iter_vars:
        return False
    var = stmt.iter_vars[-1].var
    for region in stmt.reads:
        index = region.region[-1].min if region.region else None
        if (isinstance(index, tvm.tirx.FloorDiv) and isinstance(index.b, tvm.tirx.IntImm) and index.b.value > 1
                and isinstance(index.a, tvm.tirx.Var) and index.a.same_as(var)):
            return True
    return False


def _nest(sch, block) -> bool:
    """One block's outer axes fused and parallel (when large enough), its innermost axis vectorized
    (or unrolled when short and no vector width divides it); False for a block without loops or with a
    symbolic extent."""
    loops = sch.get_loops(block)
    if not loops or not all(hasattr(sch.get(l).extent, "value") for l in loops):
        return False
    if _vectorize_layout_change(sch, block) or padding_nest(sch, block):
        return True
    extents = [int(sch.get(l).extent.value) for l in loops]
    total = 1
    for e in extents:
        total *= e
    if total == 1:
        return True
    if _flat_nest(sch, block, extents):
        return True
    loops = loops[:max(i for i, e in enumerate(extents) if e > 1) + 1]  # trailing axes of extent 1 aside
    inner = loops[-1]
    extent = int(sch.get(inner).extent.value)
    lanes = next((v for v in _LANES if extent % v == 0), None)
    if len(loops) == 1 and lanes is not None and extent > lanes:
        outer, vec = sch.split(inner, [None, lanes])
        sch.vectorize(vec)
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
        return True
    stmt = sch.get(block)
    concat = bool(stmt.iter_vars) and _piece_sizes(stmt, stmt.iter_vars[-1].var, extent) is not None
    if len(loops) > 1:
        # a concatenation keeps its column loop: fused, every pixel would divide its position back into
        # row and column for the pieces' (resized) indices (the detector's 1x80x80x48 upsample and
        # concatenate, pieces of 16 and 32 channels: 11-13 -> 4-5 us on the Zen 5 host, one thread, alone)
        apart = concat and len(loops) > 2 and math.prod(extents[:len(loops) - 2]) >= _MIN_ROWS
        fused = _in_read_order(sch, block, loops[:-2] if apart else loops[:-1])
        outer = sch.fuse(*fused) if len(fused) > 1 else fused[0]
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
    if sch.get(block).iter_vars and _partition_pieces(sch, block):
        return True
    if lanes is not None and _reads_a_fraction(sch.get(block)):
        chunk = next(c for c in (64, 32, 16, 8) if extent % c == 0)
        sch.unroll(sch.split(inner, [None, chunk])[1] if extent > chunk else inner)
        return True
    if lanes is not None:
        # a pixel's channels as one vector (24: a zmm and a ymm, not 3 ymm in a loop), but not a
        # concatenation's select of pieces (each lane would evaluate every piece)
        stmt = sch.get(block)
        whole = (extent <= _FLAT and stmt.iter_vars and not _piece_cuts(stmt, stmt.iter_vars[-1].var, extent)
                 and not (extent % _VECTOR == 0 and extent & (extent - 1) and _reads_a_row_operand(stmt)))
        vec = sch.split(inner, [None, lanes])[1] if extent > lanes and not whole else inner
        sch.vectorize(vec)
    elif extent <= _MAX_UNROLL:
        sch.unroll(inner)
    return True
