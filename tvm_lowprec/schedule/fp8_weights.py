"""Schedule rule for the float8-weight matmul built by :func:`tvm_lowprec.kernels.fp8_weights.build_fp8_weights`.

Loop nest (the tile ``mr x nr`` and ``k_unroll`` are the decision stored on the PrimFunc)::

    for panel in parallel(N / (nr*lanes)):        # one contiguous block of packed weights per task
      for mo in M / mr:                            # row tile (M = 1: one, the GEMV)
        acc[mr, nr*lanes] = 0                      # mr*nr vector registers
        for ko in K / k_unroll:
          for ki in unroll(k_unroll): for mi in unroll(mr): for g in unroll(nr):
            acc[mi, g] += broadcast(X[mi, k]) * f32(f16(bits(Wp[panel, k, g//2*lanes:+lanes], g%2)))  # vectorized
        Y[mo*mr:+mr, panel] = acc * scale          # epilogue fused, read while the tile is hot

Each weight vector is widened once per row tile and feeds ``mr`` FMAs (vectors ``2i`` and ``2i+1``
from the low and high bytes of one load of words); for M = 1 the loop streams the panel's bytes once.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.fp8_weights import OP
from .blocks import epilogue_under


def _is_fp8_weights(func) -> bool:
    return func.attrs is not None and func.attrs.get("lowprec.op", None) == OP


class Fp8WeightsRule:
    """Declines anything that is not a lowprec float8-weight matmul PrimFunc."""

    def apply(self, func, spec):
        if not _is_fp8_weights(func):
            return None
        mr, nr = (int(x) for x in func.attrs["lowprec.tile"])
        lanes, k_unroll = int(func.attrs["lowprec.vector"]), int(func.attrs["lowprec.k_unroll"])
        sch = Schedule(func)
        mo = self._tile(sch, mr, nr, lanes, k_unroll)
        self._epilogue(sch, mo, lanes)
        return sch

    # Step 1. The register tile: panels parallel, K inside the row tile, the lane loop vectorized.
    @staticmethod
    def _tile(sch, mr, nr, lanes, k_unroll):
        block = sch.get_sblock("fp8_gemm")
        m, n, k = sch.get_loops(block)
        panel, g, lane = sch.split(n, [None, nr, lanes])
        mo, mi = sch.split(m, [None, mr])
        ko, ki = sch.split(k, [None, k_unroll])
        sch.reorder(panel, mo, ko, ki, mi, g, lane)
        sch.parallel(panel)
        sch.vectorize(lane)
        sch.decompose_reduction(block, ko)
        for loop in (ki, mi, g):
            sch.unroll(loop)
        init = sch.get_sblock("fp8_gemm_init")
        sch.vectorize(sch.get_loops(init)[-1])
        return mo

    # Step 2. The epilogue (scale, and the padding columns and rows dropped) under the row tile.
    @staticmethod
    def _epilogue(sch, mo, lanes):
        epilogue_under(sch, "fp8_epilogue", mo, lanes)
