"""Schedule rule for the 4-bit weight-only GEMM of :func:`tvm_lowprec.kernels.nbits.build_nbits_gemm`.

Loop nest (a tile of ``mr`` rows x ``nr`` lane vectors, from the row's ``nibble`` tile table; one
K block at a time)::

    prologue: per (row, block): the activations' block sums (and for int8, max|x| and the quantized
              bytes), vectorized; in parallel only for large M x K (see PARALLEL_PROLOGUE)
    for task in parallel(N / (lanes * nr)):          # one contiguous stream of packed weights per task
      for mo in M / mr:
        Y[mo, task] = 0
        for b in K / block:                           # one block's bytes, scales, zero points
          acc[mr, nr, lanes] = 0
          for g in block / 8 (by c in int8):
            int8:  for mi, t in unroll(mr, nr): <4-bit dot product>(acc[mi, t], a[mi, b, g:g+c], W[task, b, t, g:g+c])
                   (c groups per call: vpmaddubsw sums them in int16 before one vpmaddwd)
            float: for j, h in unroll(4, 2): for mi, t in unroll(mr, nr): acc[mi, t] += x * float(nibble(W))
          Y[mo, task] += block scales x acc           # vectorized over lanes

Float activations with a widened block (``w_float``: tiles with ``wide_b``, several row tiles)::

    for task in parallel(N / (lanes * nr)):
      Y[:, task] = 0
      for b in K / block:
        w[block, nr, lanes] = s * float(nibble(W[task, b])) - s * z    # once, for every row tile (L1)
        for mo in M / mr:
          acc[mr, nr, lanes] = 0
          for k in block: for mi, t in unroll(mr, nr): acc[mi, t] += broadcast(x[mi, k]) * w[k, t]
          Y[mo, task] += acc

The float path loads and widens each byte vector once for the mr rows of the tile (LLVM shares the
unrolled loads); the int8 path unpacks inside the intrinsic, and LLVM shares those too.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .blocks import find_block


def _is_nbits(func) -> bool:
    return func.attrs is not None and func.attrs.get("lowprec.op", None) == "nbits_gemm"


class NbitsGemmRule:
    """Declines anything that is not a lowprec nbits_gemm PrimFunc. A symbolic M (a prompt's tokens)
    is split into row tiles as a constant one is (the kernel pads it to whole tiles)."""

    symbolic = True

    def apply(self, func, spec):
        if not _is_nbits(func):
            return None
        mr = int(func.attrs["lowprec.tile"][0])
        call_groups = int(func.attrs["lowprec.vector"][1]) // 8
        int8 = str(func.attrs["lowprec.weight_only"]).endswith("/int8")
        sch = Schedule(func)
        if find_block(sch, "w_float") is not None:
            _gemm_widened(sch, mr)
            return sch
        _prologue(sch)
        _gemm(sch, mr, str(func.attrs["lowprec.intrin"]) if int8 else None, call_groups)
        return sch


# A parallel region costs a wake-up of the pool's workers (TVM_THREAD_POOL_SPIN_COUNT=0, as when another
# runtime shares the cores: tens of microseconds), more than a small prologue takes on one core.
# Measured at 1x4096x4096, block 32, 2 threads, spin count 0: the GEMV 0.279 ms with the three prologue
# loops serial against 0.311 ms parallel (the prologue reads 16 KiB; at M = 64, 1 MiB).
PARALLEL_PROLOGUE = 1 << 18  # elements of X from which the prologue loops run in parallel


# Step 1. The activations' per-block statistics: over (row, block), inner loops vectorized.
def _prologue(sch):
    m, _, k = sch.mod["main"].attrs["lowprec.shape"]
    # a symbolic M (a prompt's tokens): in parallel, as a prompt's rows are many
    parallel = not hasattr(m, "value") and not isinstance(m, int) or int(m) * int(k) >= PARALLEL_PROLOGUE
    scale = find_block(sch, "x_scale")
    if scale is not None:
        sch.compute_inline(scale)
    for name in ("x_amax", "x_quant", "x_sum"):
        block = find_block(sch, name)
        if block is None:
            continue
        loops = sch.get_loops(block)
        if parallel:
            sch.parallel(sch.fuse(loops[0], loops[1]))
        if name == "x_quant":
            sch.vectorize(sch.fuse(loops[3], loops[4]))


# Step 2. Tasks in parallel, row tiles of mr, the block's partial sums computed under the block loop.
def _gemm(sch, mr: int, intrin: str | None, call_groups: int = 1):
    y, b, _ = _tasks(sch, mr, block_outside=False)
    acc = sch.get_sblock("acc")
    sch.compute_at(acc, b, preserve_unit_loops=True)
    am, _, _, av, al, g, h, j = sch.get_loops(acc)[-8:]
    if intrin is not None:  # one call per (row, vector): call_groups x 8 k of L lanes
        g, gi = sch.split(g, [None, call_groups]) if call_groups > 1 else (g, al)
        sch.reorder(g, am, av, *((gi,) if call_groups > 1 else ()), al, h, j)
    else:  # each byte vector loaded and widened once, for every row of the tile
        sch.reorder(g, j, h, am, av, al)
        sch.vectorize(al)
        for loop in (j, h):
            sch.unroll(loop)
    sch.unroll(am)
    sch.unroll(av)
    sch.decompose_reduction(acc, g)
    if intrin is not None:
        sch.tensorize(gi, intrin)
    _finish(sch, y, b)


# Step 2'. Float activations, widened blocks: the block loop outside the row tiles, the dequantized block
# computed under it (vectorized over lanes), each row tile's partial sums under the row tile.
def _gemm_widened(sch, mr: int):
    y, b, mo = _tasks(sch, mr, block_outside=True)
    acc = sch.get_sblock("acc")
    sch.compute_at(acc, mo, preserve_unit_loops=True)
    widened = sch.get_sblock("w_float")
    sch.compute_at(widened, b, preserve_unit_loops=True)
    w_loops = sch.get_loops(widened)
    sch.vectorize(w_loops[-1])
    sch.unroll(w_loops[-2])
    am, _, _, av, al, g, h, j = sch.get_loops(acc)[-8:]
    sch.reorder(g, h, j, am, av, al)
    sch.vectorize(al)
    sch.unroll(am)
    sch.unroll(av)
    sch.decompose_reduction(acc, g)
    _finish(sch, y, b)


def _tasks(sch, mr: int, block_outside: bool):
    """Y's loops: tasks in parallel, then the row tiles and the K blocks (in either order)."""
    y = sch.get_sblock("Y")
    m, task, v, lane, b = sch.get_loops(y)
    mo, mi = sch.split(m, [None, mr])
    sch.reorder(task, *((b, mo) if block_outside else (mo, b)), mi, v, lane)
    sch.parallel(task)
    return y, b, mo


def _finish(sch, y, b):
    """Y's update vectorized over lanes and unrolled over the tile; the initializations vectorized."""
    y_m, y_v, y_l = sch.get_loops(y)[-3:]
    sch.vectorize(y_l)
    sch.unroll(y_v)
    sch.unroll(y_m)
    sch.vectorize(sch.get_loops(sch.get_sblock("acc_init"))[-1])
    sch.decompose_reduction(y, b)
    sch.vectorize(sch.get_loops(sch.get_sblock("Y_init"))[-1])
