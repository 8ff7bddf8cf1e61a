"""Schedule rule for the int16 x int8 GEMM built by :func:`tvm_lowprec.kernels.qgemm16.build_qgemm16`.

Loop nest (the 8-bit rule's, :mod:`.qgemm`, with a chunk loop between row tile and K)::

    for panel in parallel(N / (lanes*nr)):           # one contiguous B micro-panel per task
      for mo in M / mr:                               # row tile
        wide[mr, panel] = 0                           # int64 (absent with an int32 accumulator)
        for c in chunks:                              # K in chunks whose int32 sum cannot overflow
          acc[mr, panel] = 0                          # int32, in registers
          for kb in chunk / kstep:
            for mi in unroll(mr): for g in unroll(nr):
              <intrinsic>(acc[mi, g*lanes:+lanes], A[mi, c, kb], B[panel, c, kb, g])
          wide[mr, panel] += int64(acc)               # once per chunk
        epilogue(wide or acc)                         # zero points, bias, requantize: fused
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .blocks import find_block
from .qgemm import QGemmRule, _fuse_epilogue, _vectorize_inner


class QGemm16Rule:
    """Declines anything that is not a lowprec qgemm16 PrimFunc."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "qgemm16":
            return None
        mr, nr, _ = (int(x) for x in func.attrs["lowprec.tile"])
        lanes = int(func.attrs["lowprec.vector"][0])
        sch = Schedule(func)
        QGemmRule._prepare_inputs(sch)  # Step 1. A_prepared and rowsum, as the 8-bit kernel's
        tile = self._int32 if find_block(sch, "wide") is None else self._int64
        mo, chunk = tile(sch, mr, nr, lanes)  # Step 2
        epilogue = sch.get_sblock("epilogue")
        _fuse_epilogue(sch, epilogue, mo)  # Step 3. The epilogue per row tile
        _tensorize_chunk(sch, *chunk, str(func.attrs["lowprec.intrin"]), lanes)  # Step 4
        _vectorize_inner(sch, epilogue, lanes)
        return sch

    # Step 2a. An int32 accumulator over all of K (one chunk): the 8-bit kernel's loop nest.
    @staticmethod
    def _int32(sch, mr, nr, lanes):
        gemm = sch.get_sblock("gemm")
        c, m, n, kb, ki = sch.get_loops(gemm)
        panel, g, lane = sch.split(n, [None, nr, lanes])
        mo, mi = sch.split(m, [None, mr])
        sch.reorder(panel, mo, c, kb, mi, g, lane, ki)
        sch.parallel(panel)
        sch.decompose_reduction(gemm, kb)
        return mo, (mi, g, lane)

    # Step 2b. int64: the tile loops on ``wide`` (the sum over chunks), one chunk of ``gemm`` computed
    # under its chunk loop into an int32 register tile, added into the int64 tile once per chunk.
    @staticmethod
    def _int64(sch, mr, nr, lanes):
        wide = sch.get_sblock("wide")
        m, n, c = sch.get_loops(wide)
        panel, g, lane = sch.split(n, [None, nr, lanes])
        mo, mi = sch.split(m, [None, mr])
        sch.reorder(panel, mo, c, mi, g, lane)
        sch.parallel(panel)
        sch.vectorize(lane)  # (before decompose_reduction, as parallel: it needs the reduction block)
        sch.unroll(mi)
        sch.unroll(g)
        sch.decompose_reduction(wide, c)
        _vectorize_inner(sch, sch.get_sblock("wide_init"), lanes)
        gemm = sch.get_sblock("gemm")
        sch.compute_at(gemm, c, preserve_unit_loops=True)  # the loop count must not depend on the tile
        _c, gm, gn, kb, ki = sch.get_loops(gemm)[-5:]
        gg, glane = sch.split(gn, [nr, lanes])
        sch.reorder(kb, gm, gg, glane, ki)
        sch.decompose_reduction(gemm, kb)
        return mo, (gm, gg, glane)


def _tensorize_chunk(sch, mi, g, lane, intrin, lanes):
    """One chunk's register tile: the lane loop tensorized, rows and vectors unrolled, the zeroing vectorized."""
    sch.tensorize(lane, intrin)
    sch.unroll(mi)
    sch.unroll(g)
    _vectorize_inner(sch, sch.get_sblock("gemm_init"), lanes)
