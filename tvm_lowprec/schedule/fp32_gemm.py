"""Schedule rule for the float32 GEMM and convolution of :mod:`tvm_lowprec.kernels.fp32_gemm`.

Loop nest (the tile ``mr x nr``, ``kblock`` and ``k_unroll`` are the decision stored on the PrimFunc)::

    for panel in parallel(N / (nr*lanes)):        # one contiguous block of packed weights per task
      for kb in K / kblock:                        # kblock 0: one block (then acc stays per row tile)
        for mo in M / mr:                          # row tile (M = 1: one, the GEMV)
          acc[mr, nr*lanes] (= 0 on the first block)   # mr*nr vector registers
          for ko in kblock / k_unroll:             # a convolution: for c in its block, kh; for kw (unrolled)
            for ki in unroll(k_unroll): for mi in unroll(mr): for g in unroll(nr):
              acc[mi, g] += broadcast(X[mi, k]) * Wp[panel, k, g*lanes:+lanes]     # one vfmadd
      Y[:, panel] = act(acc + bias)                # epilogue: under mo when K is whole (the tile still
                                                   # hot), under the panel after its last K block;
                                                   # a convolution's (NCHW stores): its own loop

With a K block the panel's slice of weights (``kblock * panel`` floats: 8 KiB on AVX2) stays in L1
while every row tile passes over it (measured 128x768x768 on Zen 3: 85 GFLOPS against 32 with K
whole). This is :mod:`tvm_lowprec.schedule.fp8_weights`' nest with the decode step gone (the weight
vector is loaded, not widened) and the K block added; the two rules share the nest's shape, not code,
because the blocks and the convolution's three reduction loops differ.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.fp32_gemm import OP
from .blocks import epilogue_under, find_block


def func_extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _is_fp32_gemm(func) -> bool:
    return func.attrs is not None and func.attrs.get("lowprec.op", None) == OP


class Fp32GemmRule:
    """Declines anything that is not a lowprec float32 GEMM/convolution PrimFunc."""

    def apply(self, func, spec):
        if not _is_fp32_gemm(func):
            return None
        mr, nr, kblock = (int(x) for x in func.attrs["lowprec.tile"])
        lanes, k_unroll = int(func.attrs["lowprec.vector"]), int(func.attrs["lowprec.k_unroll"])
        conv = str(func.attrs.get("lowprec.kind", "gemm")) == "conv"
        sch = Schedule(func)
        _, loop = self._tile(sch, mr, nr, lanes, k_unroll, kblock, conv)
        if conv:
            self._conv_epilogue(sch)
            self._pad(sch)
        else:
            self._epilogue(sch, loop, lanes)
        return sch

    # Step 1. The register tile: panels parallel, K inside the row tile, the lane loop vectorized.
    @staticmethod
    def _tile(sch, mr, nr, lanes, k_unroll, kblock, conv):
        block = sch.get_sblock("fp32_gemm")
        m, n, *ks = sch.get_loops(block)
        panel, g, lane = sch.split(n, [None, nr, lanes])
        mo, mi = sch.split(m, [None, mr])
        kblocks = []
        if conv:  # (c, kh, kw): the innermost window loop unrolled; a K block is a block of channels
            outer, ki = list(ks[:-1]), ks[-1]
            window = kblock and kblock // int(func_extent(sch, ks[1]) * func_extent(sch, ks[2]))
            if window:
                kbo, outer[0] = sch.split(outer[0], [None, window])
                kblocks = [kbo]
        elif kblock:
            kbo, ko, ki = sch.split(ks[0], [None, kblock // k_unroll, k_unroll])
            kblocks, outer = [kbo], [ko]
        else:
            ko, ki = sch.split(ks[0], [None, k_unroll])
            outer = [ko]
        sch.reorder(panel, *kblocks, mo, *outer, ki, mi, g, lane)
        sch.parallel(panel)
        sch.vectorize(lane)
        sch.decompose_reduction(block, kblocks[0] if kblocks else outer[0])
        for loop in (ki, mi, g):
            sch.unroll(loop)
        init = sch.get_sblock("fp32_gemm_init")
        sch.vectorize(sch.get_loops(init)[-1])
        return panel, (panel if kblocks else mo)

    # Step 2. The epilogue (bias, activation; padding columns and rows dropped) under the row tile,
    # or under the panel, after its last K block, when K is blocked.
    @staticmethod
    def _epilogue(sch, loop, lanes):
        epilogue_under(sch, "fp32_epilogue", loop, lanes)

    # Step 2 (convolution). The NCHW epilogue after the GEMM, parallel over output channels. Not under
    # the panel: TVM 0.27's region inference gets the rows of ``acc[oh * OW + ow, o]`` wrong there when
    # M is padded (an extent of 2 for 16 columns), and the stores, one pixel row per channel, want
    # their own loop anyway.
    @staticmethod
    def _conv_epilogue(sch):
        epi = sch.get_sblock("fp32_epilogue")
        b, o, *_ = sch.get_loops(epi)
        sch.parallel(sch.fuse(b, o))

    # Step 3. A convolution's padded copy of its input: parallel over channels, rows vectorized.
    @staticmethod
    def _pad(sch):
        pad = find_block(sch, "fp32_pad")
        if pad is None:
            return
        loops = sch.get_loops(pad)
        sch.parallel(sch.fuse(loops[0], loops[1]))
