"""Schedule rule for the 8-bit softmax on a row with a register permute: the kernel written as vector
code with the exponentials from two 16-entry tables
(:func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax_vectors`)::

    for item in parallel(rows, or vectors of positions along the last axis):
      q_k = x[item, k]                       # every vector of the row (or bin k), bound once
      top = max_k q_k                        # along the row: then the max of the lanes, broadcast
      e_k = H[(top - q_k) >> 4] * L[(top - q_k) & 15]   # vpermps
      inverse = 1 / (sum_k e_k * scale_out)  # sums in the order of the scheduled kernel's
      y[item, k] = quantize(e_k * inverse)

A row longer than the unrolled form takes (64 vectors) is the same code in loops
(:func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax_row_loop`: Whisper's 1500 frames).

Declines a softmax on a row without a permute (:attr:`~tvm_lowprec.hwspec.TargetSpec.register_permute`:
the Arm rows) or of a shape the vectors do not fit (the row rule,
:class:`~tvm_lowprec.schedule.rows.RowOpRule`, schedules it), and every other function.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.qsoftmax import build_qsoftmax_row_loop, build_qsoftmax_vectors


class VectorSoftmaxRule:
    def apply(self, func, spec):
        attrs = func.attrs if func.attrs is not None else {}
        permute = getattr(spec, "register_permute", None)
        if attrs.get("lowprec.op", None) != "qsoftmax" or "lowprec.softmax" not in attrs or permute is None:
            return None
        for build in (build_qsoftmax_vectors, build_qsoftmax_row_loop):  # unrolled where the row fits, else loops
            vectors = build(func, permute, spec.round_to_int)
            if vectors is not None:
                return Schedule(vectors)
        return None
