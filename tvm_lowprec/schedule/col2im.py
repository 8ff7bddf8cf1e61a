"""Schedule rule for :func:`~tvm_lowprec.kernels.col2im.build_col2im` (a transposed convolution's col2im
with bias and requantization). Loop nest::

    for (b, oh) in parallel:
      for ow:
        acc[:] = 0                                  # one output pixel's channels, vectorized
        for kh, kw (unrolled): acc[c] += cols[...]  # the taps that reach it, masked; vectorized over c
        out[b, oh, ow, :] = requant(acc + bias)     # vectorized over c

Channels are innermost and contiguous in both the columns and the output (NHWC). Where the strides
equal the kernel (the 2x2/stride-2 upsampler) each output pixel has one tap and no sum: the gather is
inlined into the epilogue, vectorized over channels when they fill vectors, else left to LLVM's loop
vectorizer (one channel at 480x480: 0.66 -> 0.1 ms).
"""

from __future__ import annotations

from tvm.s_tir import Schedule


_MIN_RUN = 8  # a shorter run of an upsampler's row is left to LLVM's loop vectorizer


def _upsample_runs(sch, ow, c, kw: int, lanes: int) -> None:
    """An upsampler's output row, ``(ow, c)``, as runs of ``kw * C`` elements: run ``ow // kw`` reads one
    GEMM row's ``(ow % kw, c)`` columns, contiguous, and the parameters are repeated to that length
    (:func:`~tvm_lowprec.kernels.col2im.param_run`), so each run is one vector loop. Runs shorter
    than :data:`_MIN_RUN` (one channel, a segmentation map) are unrolled and the row left to LLVM's
    loop vectorizer."""
    width = int(sch.get(ow).extent)
    if width % kw:
        return
    _, tap = sch.split(ow, [None, kw])
    run = sch.fuse(tap, c)
    length = int(sch.get(run).extent)
    if length < _MIN_RUN:
        sch.unroll(run)
    elif length % lanes == 0 and length > lanes:
        sch.vectorize(sch.split(run, [None, lanes])[1])
    else:
        sch.vectorize(run)


class Col2imRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "col2im":
            return None
        sch = Schedule(func)
        gather, epilogue = sch.get_sblock("col2im"), sch.get_sblock("epilogue")
        b, oh, ow, c = sch.get_loops(epilogue)
        sch.parallel(sch.fuse(b, oh))
        lanes = spec.gemm.vector_bits // 32  # int32 lanes
        channels = int(sch.get(c).extent)
        if all(iv.iter_type == 0 for iv in sch.get(gather).iter_vars):  # one tap per pixel
            sch.compute_inline(gather)
            _upsample_runs(sch, ow, c, int(func.attrs["lowprec.kernel"][1]), lanes)
            return sch
        sch.compute_at(gather, ow)
        own = sch.get_loops(gather)[2:]  # (c, kh, kw) under (b*oh, ow); a loop of extent 1 is dropped
        if channels == 1 or len(own) != 3:  # one output channel (a segmentation map): nothing to vectorize
            sch.unroll(own[-1])
            return sch
        c_g, kh, kw = own
        sch.reorder(kh, kw, c_g)
        init = sch.decompose_reduction(gather, kh)
        for loop in (sch.get_loops(init)[-1], c_g, c):
            if channels % lanes == 0:
                _, inner = sch.split(loop, [None, lanes])
                sch.vectorize(inner)
        sch.unroll(kw)
        return sch
