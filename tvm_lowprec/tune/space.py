"""The MetaSchedule design space of a quantized GEMM kernel: the default schedule's structure with its
tile sizes left to the search.

The PrimFunc (:func:`~tvm_lowprec.kernels.build_qgemm`) fixes the weight packing (``nr`` vectors of
``lanes`` columns per panel) and the intrinsic; what the schedule may still choose, and the search
samples, is:

- the row tile ``mr``: a factor of the padded M, at most :data:`MAX_ROWS` (the largest row tile of the
  target's tile tables, plus headroom: register spills are measured, not guessed);
- the K blocking: how many ``kstep`` slices one pass over a B panel covers (all of K, or blocks that
  keep a panel slice in L1 while every row tile passes over it).

Every candidate tensorizes its inner loop with the target's intrinsic in the schedule itself (no
post-processor rewrites it, none adds loops around it), so every candidate builds: the failures
MetaSchedule's generic rules produce on TVM 0.27 (a vectorized loop around the tensorized block:
"Cannot broadcast lanes=16 to 64") cannot occur.
"""

from __future__ import annotations

from tvm.s_tir import meta_schedule as ms

from ..schedule.qgemm import QGemmRule, tile_gemm

MAX_ROWS = 8  # row-tile bound for the search (the tile tables go up to 6)
MAX_K_SLICES = 512  # kstep slices per K block


def is_tunable(func) -> bool:
    """A kernel the search space covers: tvm-lowprec's non-batched quantized GEMM."""
    attrs = func.attrs
    return attrs is not None and attrs.get("lowprec.op", None) == "qgemm" and int(attrs.get("lowprec.batch", 0)) == 0


def qgemm_space(sch) -> None:
    """Schedule ``sch`` (a qgemm PrimFunc as ``main``) as the default rule does
    (:func:`~tvm_lowprec.schedule.qgemm.tile_gemm`), with the row tile and K blocking sampled."""
    func = sch.mod["main"]
    _, nr, _ = (int(x) for x in func.attrs["lowprec.tile"])
    intrin = str(func.attrs["lowprec.intrin"])
    lanes, kstep = (int(x) for x in func.attrs["lowprec.vector"])
    QGemmRule._prepare_inputs(sch)
    m = sch.get_loops(sch.get_sblock("gemm"))[-3]
    mr = sch.sample_perfect_tile(m, n=2, max_innermost_factor=MAX_ROWS)[1]

    def k_blocks(sch, slices):
        return sch.sample_perfect_tile(slices, n=2, max_innermost_factor=MAX_K_SLICES)

    tile_gemm(sch, mr, nr, k_blocks, intrin, lanes, kstep)


def space_generator():
    """The ScheduleFn space: our function only; no generic rules or post-processors; the tile-size
    mutator for the evolutionary search."""
    return ms.space_generator.ScheduleFn(
        qgemm_space, sch_rules=[], postprocs=[], mutator_probs={ms.mutator.MutateTileSize(): 1.0}
    )
