"""Schedule rule for the table lookup kernel (:mod:`tvm_lowprec.kernels.lookup`)::

    for o in parallel(n // lanes):        # serial below _MIN_PARALLEL bytes (a fork costs more)
      Y[o*lanes : +lanes] = lookup(...)   # the kernel's vector body: vpermi2b, vpshufb, tbl
    for i in range(n % lanes):            # the tail, scalar
      Y[...] = table[X[...]]

Declines every other function.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.lookup import OP

_MIN_PARALLEL = 1 << 16  # bytes: below this a lookup takes less than a worker wake-up (about 1 us)


class LookupRule:
    def apply(self, func, spec):
        attrs = func.attrs if func.attrs is not None else {}
        if attrs.get("lowprec.op", None) != OP:
            return None
        sch = Schedule(func)
        n = int(attrs["lowprec.shape"][0])
        if n < int(attrs["lowprec.lanes"]):
            return sch  # the tail alone
        # The vectors in parallel, where there are enough of them (the lookup is the block's body).
        (loop,) = sch.get_loops(sch.get_sblock("lookup"))
        if n >= _MIN_PARALLEL:
            sch.parallel(loop)
        return sch
