"""Schedule for the depthwise kernel (:func:`~tvm_lowprec.kernels.depthwise.build_depthwise`).

Parallel over output rows; per output pixel and per vector of channels, the int32 accumulator stays
in registers across the unrolled kernel taps (the innermost, vectorized loop runs over channels,
which are contiguous in NHWC), then the requantizing epilogue writes 8-bit results.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .blocks import find_block


class DepthwiseRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "qdepthwise":
            return None
        sch = Schedule(func)
        lanes = spec.gemm.lanes  # int32 lanes of one vector register
        padded = find_block(sch, "padded")
        if padded is not None:
            loops = sch.get_loops(padded)
            sch.parallel(sch.fuse(loops[0], loops[1]))
            if int(sch.get(loops[-1]).extent) % lanes == 0:
                sch.vectorize(loops[-1])
        acc, epilogue = sch.get_sblock("acc"), sch.get_sblock("epilogue")
        b, oh, ow, c, kh, kw = sch.get_loops(acc)
        channels = int(sch.get(c).extent)
        vector = channels % lanes == 0
        co, ci = sch.split(c, [None, lanes]) if vector else (c, None)
        if vector:
            sch.reorder(co, kh, kw, ci)
        rows = sch.fuse(b, oh)
        sch.parallel(rows)
        sch.reverse_compute_at(epilogue, co)
        sch.unroll(kh)
        sch.unroll(kw)
        if vector:
            sch.vectorize(ci)
            sch.vectorize(sch.get_loops(epilogue)[-1])
        init = sch.decompose_reduction(acc, kh)
        if vector:
            sch.vectorize(sch.get_loops(init)[-1])
        return sch
