"""Kernel: a cumulative sum along one axis (ONNX ``CumSum``, ``relax.cumsum``), for static shapes.

TVM 0.27 has no legalization of ``relax.cumsum`` for the VM (a model with one stopped at VM codegen:
"CodeGenVM cannot emit this Relax operator directly ... R.cumsum": the position ids RoBERTa computes from
its attention mask). The data is viewed as ``[outer, length, inner]``; each (outer, inner) line is a
running sum, outer lines in parallel, inner ones as the vector. ``exclusive``: each position holds the
sum of the ones before it.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

OP = "cumsum"


def cumsum_kernel(outer: int, length: int, inner: int, in_dtype: str, out_dtype: str, exclusive: bool):
    zero = tvm.tirx.const(0, out_dtype)

    @T.prim_func(private=True, s_tir=True)
    def cumsum(x: T.Buffer((outer, length, inner), in_dtype), y: T.Buffer((outer, length, inner), out_dtype)):
        T.func_attr({"tir.is_scheduled": True, "lowprec.op": OP, "lowprec.schedule": "default", "op_pattern": 8})
        with T.sblock("root"):
            for o in T.parallel(outer):
                for k in range(inner):
                    y[o, 0, k] = zero if exclusive else T.Cast(out_dtype, x[o, 0, k])
                for i in range(1, length):
                    for k in range(inner):
                        y[o, i, k] = y[o, i - 1, k] + T.Cast(out_dtype, x[o, i - (1 if exclusive else 0), k])

    return cumsum


__all__ = ["OP", "cumsum_kernel"]
