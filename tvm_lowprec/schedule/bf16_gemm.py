"""Schedule rule for the bf16 GEMM built by :func:`tvm_lowprec.kernels.bf16_gemm.build_bf16_gemm`.

Loop nest (the tile ``mr x nr`` is the decision stored on the PrimFunc)::

    Xb[M, K/2, 2] = bf16(X)                       # parallel over rows, once per row
    for panel in parallel(N / (nr*lanes)):        # one contiguous block of packed weights per task
      for mo in M / mr:                            # row tile (M = 1: one, the GEMV)
        acc[mr, nr*lanes] = 0                      # mr*nr vector registers
        for kb in K / 2:                           # the pairs in order: the sum's order is the instruction's
          for mi in unroll(mr): for g in unroll(nr):
            vdpbf16ps(acc[mi, g], W[panel, kb, g], broadcast(Xb[mi, kb]))
        Y[mo*mr:+mr, panel] = acc * scale          # epilogue fused, read while the tile is hot

The rule declines a PrimFunc it does not know, and a bf16 GEMM on a spec without a bf16 recipe (its
loops then run as written: correct, slow).
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..intrin.x86_bf16 import IMPORT_PRAGMA
from ..kernels.bf16_gemm import OP
from .blocks import epilogue_under


class Bf16GemmRule:
    """Declines anything that is not a lowprec bf16 GEMM PrimFunc for a row with the recipe."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != OP or getattr(spec, "bf16", None) is None:
            return None
        intrin = spec.bf16.intrin
        if str(func.attrs["lowprec.intrin"]) != intrin.intrin:
            return None
        mr, nr = (int(x) for x in func.attrs["lowprec.tile"])
        lanes = int(func.attrs["lowprec.vector"])
        sch = Schedule(func)
        self._round(sch, lanes)
        panel, mo, lane, (mi, g) = self._tile(sch, mr, nr, lanes)
        self._epilogue(sch, mo, lanes)
        sch.tensorize(lane, intrin.intrin)  # Step 4. The instruction, its LLVM IR linked into the kernel
        sch.unroll(mi)
        sch.unroll(g)
        sch.annotate(panel, IMPORT_PRAGMA, intrin.llvm_import)
        return sch

    # Step 1. The activations rounded to bf16 pairs: parallel over rows, vectorized along K.
    @staticmethod
    def _round(sch, lanes):
        block = sch.get_sblock("bf16_round")
        i, j, t = sch.get_loops(block)
        sch.parallel(i)
        row = sch.fuse(j, t)
        if int(sch.get(row).extent) % lanes == 0:
            sch.vectorize(sch.split(row, [None, lanes])[1])

    # Step 2. The register tile: panels parallel, the pairs of K in order inside the row tile.
    @staticmethod
    def _tile(sch, mr, nr, lanes):
        block = sch.get_sblock("bf16_gemm")
        m, n, kb, t = sch.get_loops(block)
        panel, g, lane = sch.split(n, [None, nr, lanes])
        mo, mi = sch.split(m, [None, mr])
        sch.reorder(panel, mo, kb, mi, g, lane, t)
        sch.parallel(panel)
        sch.decompose_reduction(block, kb)
        init = sch.get_sblock("bf16_gemm_init")
        sch.vectorize(sch.get_loops(init)[-1])
        return panel, mo, lane, (mi, g)

    # Step 3. The epilogue (scale, and the padding columns and rows dropped) under the row tile.
    @staticmethod
    def _epilogue(sch, mo, lanes):
        epilogue_under(sch, "bf16_epilogue", mo, lanes)
