"""Schedule for the depthwise kernel (:func:`~tvm_lowprec.kernels.depthwise.build_depthwise`).

Loop nest (``L`` int32 lanes dividing the channels, ``U`` output pixels per step)::

    for b:
      for oh in parallel(OH):                  # rows: the threads' split; partitioned, see below
        for owo in range(OW / U):              # partitioned
          for co in range(C / L):
            acc[u, co*L : co*L + L] = 0
            for kh in range(KH):               # a loop, so that LLVM keeps U accumulators and the
              for kw in unroll(KW):            #   U + KW - 1 widened input columns of one kernel row
                for u in unroll(U):            #   in registers instead of KH * KW * U products
                  for ci in vectorized(L):     # zext(x) * sext(w') -> vpmaddwd, then vpaddd
                    acc[u, c] += x[b, oh*s + kh, (owo*U + u)*s + kw, c] * w'[kh, kw, c]
          for u in unroll(U):
            for c in vectorized(2L or L):      # whole pixels: 16-byte packs and stores
              out[b, oh, owo*U + u, c] = requant(acc[u, c] + corr[c])

The ``U`` pixels of a step share input columns (with stride 1, ``U + KW - 1`` loads per kernel row
instead of ``U * KW``). The taps read the unpadded input through a ``Select``
(:mod:`tvm_lowprec.kernels.depthwise`); ``pragma_loop_partition_hint`` on ``oh`` and ``owo`` makes TVM's
LoopPartition split off the border rows and column steps, so the interior, nearly all the work, has
no selects and no padded copy of the input is made. Where the interior is under half of a loop (a 9x9
window over an 8x8 input has none) that loop keeps its selects: no copies of the body for the borders.
Channels that no vector width divides (MixNet's 90 and 300) are split by the row's lanes all the same,
with the hint on the channel loops too: the whole vectors run as vector code and LoopPartition leaves
the last, partial one its own scalar loop. Fewer channels than one vector get the same nest without
vectors.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.depthwise import pixels_per_step
from .blocks import find_block


def _vector_lanes(channels: int, lanes: int) -> int | None:
    """A full int32 register of channels, or half of one (24 channels on AVX-512), or None."""
    return next((n for n in (lanes, lanes // 2) if n >= 4 and channels % n == 0), None)


# The least share of output rows (columns) whose taps are all inside the input for which the row (column)
# loop is partitioned. Below it the border is most of the work, and LoopPartition's copies of the body,
# one per distinct border case, cost compile time for little: MixNet's 90x8x8 9x9 depthwise (pad 4: no
# interior row) took 3.9 s in TVM's TIR passes.
MIN_INTERIOR = 0.5


def _interior(out_n: int, in_n: int, kernel: int, stride: int, dilation: int, before: int) -> int:
    """Output positions along one axis whose every tap lies inside the input."""
    first = -(-before // stride)
    last = min(out_n - 1, (in_n - 1 - (kernel - 1) * dilation + before) // stride)
    return max(0, last - first + 1)


def _interior_shares(func) -> tuple[float, float]:
    """The shares of interior output rows and columns (1.0 where the kernel does not say its window)."""
    shape, conv = func.attrs.get("lowprec.shape", None), func.attrs.get("lowprec.conv", None)
    if shape is None or conv is None:
        return 1.0, 1.0
    _, oh_n, ow_n, _, kh_n, kw_n = (int(v) for v in shape)
    sh, sw, dh, dw, top, left = (int(v) for v in conv)
    _, h_n, w_n, _ = (int(v) for v in func.params[0].shape)  # x, NHWC
    return (_interior(oh_n, h_n, kh_n, sh, dh, top) / oh_n, _interior(ow_n, w_n, kw_n, sw, dw, left) / ow_n)


class DepthwiseRule:
    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "qdepthwise":
            return None
        sch = Schedule(func)
        acc, epilogue = find_block(sch, "acc"), find_block(sch, "epilogue")
        if acc is None or epilogue is None:
            return None
        b, oh, ow, c, kh, kw = sch.get_loops(acc)
        channels = int(sch.get(c).extent)
        lanes = _vector_lanes(channels, spec.gemm.lanes)
        ragged = lanes is None and channels > spec.gemm.lanes
        if ragged:
            lanes = spec.gemm.lanes
        owo, owi = sch.split(ow, [None, pixels_per_step(int(sch.get(ow).extent))])
        co, ci = sch.split(c, [None, lanes]) if lanes else (c, None)
        if ragged:
            sch.annotate(co, "pragma_loop_partition_hint", 1)
        sch.reorder(owo, co, kh, kw, owi, *([ci] if lanes else []))
        sch.parallel(oh)
        for loop, interior in zip((oh, owo), _interior_shares(func)):
            if interior >= MIN_INTERIOR:  # border steps keep the selects, the interior loses them
                sch.annotate(loop, "pragma_loop_partition_hint", 1)
        sch.reverse_compute_at(epilogue, owo)
        sch.unroll(kw)
        sch.unroll(owi)
        if lanes:
            sch.vectorize(ci)
        init = sch.decompose_reduction(acc, kh)
        if lanes:
            io, ii = sch.get_loops(init)[-2:]
            sch.unroll(io)
            sch.vectorize(ii)
            eo, ec = sch.get_loops(epilogue)[-2:]
            eo2, ei = sch.split(ec, [None, 2 * lanes if channels % (2 * lanes) == 0 else lanes])
            if ragged:
                sch.annotate(eo2, "pragma_loop_partition_hint", 1)
            sch.unroll(eo)
            sch.vectorize(ei)
        return sch
