"""Schedule rule for the float32 depthwise convolution of :mod:`tvm_lowprec.kernels.fp32_depthwise`.

Loop nest::

    for c in parallel(C):
      pad channel c (its rows and padded columns)          # computed per channel: stays in L1/L2
      for oh in OH:
        for jo in OWp / (vectors*lanes):
          acc[vectors, lanes] = 0
          for kh, kw in unroll(KH, KW): for v in unroll(vectors):
            acc[v] += X_pad[c, oh*s+kh, (jo*vectors+v)*lanes*s + kw : +lanes] * broadcast(W[c, kh, kw])
        Y[c, oh, :OW] = act(acc + bias[c])                  # per output row
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.fp32_depthwise import OP


class Fp32DepthwiseRule:
    """Declines anything that is not a lowprec float32 depthwise PrimFunc."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != OP:
            return None
        lanes = int(func.attrs["lowprec.vector"])
        vectors = int(func.attrs["lowprec.tile"][1])
        sch = Schedule(func)
        block = sch.get_sblock("fp32_dw")
        b, c, i, j, kh, kw = sch.get_loops(block)
        jo, v, lane = sch.split(j, [None, vectors, lanes])
        sch.reorder(jo, kh, kw, v, lane)
        par = sch.fuse(b, c)
        sch.parallel(par)
        sch.vectorize(lane)
        sch.decompose_reduction(block, kh)
        for loop in (kh, kw, v):
            sch.unroll(loop)
        sch.vectorize(sch.get_loops(sch.get_sblock("fp32_dw_init"))[-1])
        sch.compute_at(sch.get_sblock("fp32_pad"), par, preserve_unit_loops=True)
        epi = sch.get_sblock("fp32_epilogue")
        sch.reverse_compute_at(epi, i, preserve_unit_loops=True)  # its row loop: LLVM's vectorizer
        return sch
