"""Schedule rule for float32 matmuls whose operands are both computed at run time (attention's
``Q @ K^T`` and ``P @ V``, batched over heads), as TVM's legalization writes them::

    C[b.., i, j] += A[b.., i, k] * B[b.., k, j]        (one reduction block; elementwise blocks after it)

Constant-weight matmuls never get here: :mod:`tvm_lowprec.quant.float_gemm` turns them into the
packed kernel of :mod:`tvm_lowprec.kernels.fp32_gemm`. Here ``B`` cannot be packed at compile time,
but its rows are already contiguous along ``j``, so the register tile reads them as vectors in place::

    for (b.., io) in parallel:                      # heads x row tiles
      for jo in J / (nr*lanes):
        acc[mr, nr*lanes] = 0
        for k in K:
          for mi in unroll(mr): for g in unroll(nr):
            acc[mi, g] += broadcast(A[b, io*mr+mi, k]) * B[b, k, jo, g*lanes:+lanes]   # vfmadd
        C[b, io*mr:+mr, jo] = epilogue(acc)          # the elementwise blocks after it (a scale)

The tile comes from the target row's FMA recipe (:attr:`~tvm_lowprec.hwspec.TargetSpec.fma`),
shrunk to divide I and J (no padding here; heads are multiples of the vector width in practice; a
symbolic I keeps the recipe's height, its last tile predicated).
``B`` read as stored transposed (``B[.., j, k]``: a prompt's ``Q @ K^T`` against the KV cache, the
keys ``[total, head]``) is copied transposed once per head (``cache_read`` into ``[.., k, j]``, at the
heads' parallel loop, the row tiles inside it); the generic schedule ran those scores at 23.9 ms for
1x2x7x128x64 @ 256 keys, the copy and tile at 0.68 ms (symbolic rows: 1.69 ms; Zen 4, one thread).

A symbolic J (a decode step's or a prompt's scores against the cache, ``[.., head, total]``) is padded
to whole column tiles first, symbolic rows to whole row tiles (:meth:`Fp32MatmulRule._pad_to_tiles`),
where the product is the kernel's only block.

Declines other dtypes, a constant J that no vector divides, a symbolic K, a block that is not this
product, a transposed B without a batch loop, and rows without an FMA recipe.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError

from ..kernels.qgemm import SYMBOLIC_ROWS
from .blocks import root_children


def _var_of(expr):
    return expr if isinstance(expr, tirx.Var) else None


def _matmul_vars(block):
    """(batch vars, i, j, k, transposed) of a ``C[.., i, j] += A[.., i, k] * B[.., k, j]`` float32 block,
    else None; ``transposed``: None, or where B is read as ``B[.., j, k]`` (attention's ``Q @ K^T`` with
    the keys as stored) the index of that read in the block's reads."""
    iters = list(block.iter_vars)
    if len(iters) < 3 or [int(v.iter_type) for v in iters[-1:]] != [2] or any(int(v.iter_type) for v in iters[:-1]):
        return None  # iter_type 0: spatial, 2: reduction
    *batch, i, j, k = (v.var for v in iters)
    if len(block.writes) != 1 or str(block.writes[0].source.dtype) != "float32":
        return None
    out = block.writes[0].source
    operands = [r for r in block.reads if not r.source.same_as(out)]
    if len(operands) != 2 or any(str(r.source.dtype) != "float32" for r in operands):
        return None

    def tail(region):
        return tuple(_var_of(r.min) for r in region.region[-2:]) if len(region.region) >= 2 else (None, None)

    def is_pair(region, first, second):
        a, b = tail(region)
        return a is not None and b is not None and a.same_as(first) and b.same_as(second)

    if not any(is_pair(r, i, k) for r in operands):
        return None
    if any(is_pair(r, k, j) for r in operands):
        return batch, i, j, k, None
    transposed = [n for n, r in enumerate(block.reads) if not r.source.same_as(out) and is_pair(r, j, k)]
    if len(transposed) != 1:
        return None
    return batch, i, j, k, transposed[0]  # B read as [.., j, k]: the index of that read


def _largest_divisor(n: int, most: int) -> int:
    return next(d for d in range(max(1, min(n, most)), 0, -1) if n % d == 0)


def _constant(extent) -> int | None:
    return int(extent.value) if hasattr(extent, "value") else None


class Fp32MatmulRule:
    """Declines anything that is not a float32 (batched) matmul of two run-time operands. Its rows
    may be symbolic (a prompt's queries against a cache of constant length): row tiles of the
    recipe's height, the last one predicated."""

    symbolic = True

    def apply(self, func, spec):
        recipe = getattr(spec, "fma", None)
        if recipe is None or (func.attrs is not None and func.attrs.get("lowprec.op", None) is not None):
            return None
        sch = Schedule(func)
        _, blocks = root_children(sch)
        found = [(b, v) for b in blocks if (v := _matmul_vars(sch.get(b))) is not None]
        if len(found) != 1:
            return None
        block, (*_, transposed) = found[0]
        loops = sch.get_loops(block)
        if transposed is not None and len(loops) < 4:
            return None  # a transposed B is copied once per batch: without one, TVM's other rules
        extents = [_constant(sch.get(loop).extent) for loop in loops]
        rows, cols, lanes = extents[-3], extents[-2], recipe.intrin.lanes
        if extents[-1] is None or (cols is not None and cols % lanes):
            return None  # K a constant (a head's width), J a multiple of the vector width or symbolic
        tile = recipe.tile_for(SYMBOLIC_ROWS if rows is None else rows)
        # rows known at run time: whole tiles and a predicated last one
        mr = tile.mr if rows is None else _largest_divisor(rows, tile.mr)
        budget = (recipe.intrin.registers - 1) // (mr + 1)  # mr*nr accumulators + nr B vectors + broadcast
        most = max(1, min(tile.nr * max(1, tile.mr // mr), budget))
        if cols is None:  # the keys of a decode step's scores: padded to whole tiles (see _pad_to_tiles)
            if transposed is not None or len(blocks) != 1:
                return None
            try:
                self._pad_to_tiles(sch, block, len(loops), most * lanes, mr if rows is None else 1)
                local = sch.cache_write(block, 0, "local")
                jo = self._tile(sch, block, sch.get_loops(block), mr, most, lanes)
                self._local_tile(sch, local, jo)
            except ScheduleError:
                return None
            return sch
        nr = _largest_divisor(cols // lanes, most)
        index = [b.same_as(block) for b in blocks].index(True)
        try:
            outer = self._tile(sch, block, loops, mr, nr, lanes, transposed)
            self._epilogue(sch, blocks[:index], blocks[index + 1:], outer, block)
        except ScheduleError:
            return None  # an epilogue this nest cannot take: the next rule may
        return sch

    # A symbolic J (the keys of a decode step's ``Q @ K^T``, the transposed cache ``[.., head, total]``):
    # a split by the tile's width would predicate every tile, and TVM's vectorizer scalarizes a
    # predicated lane loop (1x2x7x64 @ 129 keys, Zen 3: 147 us; the generic schedule 89 us), and
    # loop_partition refuses a symbolic extent. So B and C are padded to whole tiles of columns
    # (``pad_einsum``: B copied, zeros past the keys; C written back), and symbolic rows to whole row
    # tiles (a predicated row kept LLVM from holding the accumulators in registers), each copy parallel
    # over its outer loops, the accumulators a local tile (:meth:`_local_tile`). Zen 3, one thread,
    # [1, 2, 7s, 64] x [1, 2, 64, keys]: decode (s = 1, 129 keys) 11.6 us, generic 90; a prompt's
    # (s = 128, 128 keys) 0.47 ms, generic 13.6 ms.
    @staticmethod
    def _pad_to_tiles(sch, block, depth, width, height=1):
        name = sch.get(block).name_hint
        sch.pad_einsum(block, [1] * (depth - 3) + [height, width, 1])
        for other in [b for b in root_children(sch)[1] if sch.get(b).name_hint != name]:
            loops = sch.get_loops(other)
            sch.parallel(sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0])  # the rows: LLVM vectorizes

    @staticmethod
    def _local_tile(sch, local, jo):
        """The tile's accumulators in a local buffer (``local``: the block that copies it to the padded
        output), copied once per tile: LLVM cannot keep a workspace buffer's elements in registers
        across K (another workspace read in the loop may alias it), so every FMA loaded and stored its
        accumulator (962 us for 896x64 @ 128 keys, Zen 3)."""
        sch.reverse_compute_at(local, jo, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(local)[-1])

    # Step 1. The register tile: heads and row tiles parallel, the lane loop vectorized.
    @staticmethod
    def _tile(sch, block, loops, mr, nr, lanes, transposed=None):
        *batch, i, j, k = loops
        name = sch.get(block).name_hint
        io, mi = sch.split(i, [None, mr])
        jo, g, lane = sch.split(j, [None, nr, lanes])
        sch.reorder(*batch, io, jo, k, mi, g, lane)
        if transposed is not None and batch:
            # B read as [.., j, k]: copied transposed once per batch (head) into a [.., k, j] buffer whose
            # rows the tile reads as vectors; the heads are the parallel loop, the row tiles run inside
            par = sch.fuse(*batch)
            copy = sch.cache_read(block, transposed, "global")
            sch.transform_layout(copy, ("write", 0), lambda *x: (*x[:-2], x[-1], x[-2]))
            sch.compute_at(copy, par)
            *_, cj, ck = sch.get_loops(copy)
            sch.reorder(ck, cj)
            width = _constant(sch.get(cj).extent)
            sch.vectorize(sch.split(cj, [None, lanes])[1] if width and width % lanes == 0 else cj)
        else:
            par = sch.fuse(*batch, io) if batch else io
        sch.parallel(par)
        sch.vectorize(lane)
        sch.decompose_reduction(block, k)
        sch.unroll(mi)
        sch.unroll(g)
        init = sch.get_sblock(name + "_init")
        sch.vectorize(sch.get_loops(init)[-1])
        return jo

    # Step 2. Elementwise blocks after the product: inlined into the last one, which runs under
    # the column tile while the accumulators are hot; blocks before it that only the epilogue reads
    # (attention's causal mask, which reverse_compute_at refused to leave behind: the prompt's scores
    # stayed on the generic schedule, 24 ms a layer for 128 queries) are inlined into it too; the
    # other blocks before it (copies of the operands) run in parallel.
    @staticmethod
    def _epilogue(sch, before, after, jo, product=None):
        kept = []
        for b in before:
            consumers = sch.get_consumers(b)
            if after and product is not None and not any(c.same_as(product) for c in consumers):
                sch.compute_inline(b)
            else:
                kept.append(b)
        for b in after[:-1]:
            sch.compute_inline(b)
        if after:
            sch.reverse_compute_at(after[-1], jo, preserve_unit_loops=True)
            sch.vectorize(sch.get_loops(after[-1])[-1])
        for b in kept:
            loops = sch.get_loops(b)
            sch.parallel(loops[0] if len(loops) == 1 else sch.fuse(*loops[:2]))
