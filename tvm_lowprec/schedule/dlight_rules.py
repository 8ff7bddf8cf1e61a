"""TVM's own dlight CPU reduction rule (softmax, layer norm: row reductions fused with elementwise
work) as the last fallback: it parallelises the rows. Wrapped to the one rule interface of
:data:`~tvm_lowprec.schedule.DEFAULT_RULES`, ``apply(func, spec) -> Schedule | None``.
"""

from __future__ import annotations


class DlightRule:
    """``own_ops``: also schedule tvm-lowprec's own kernels (im2col, 8-bit softmax, lookup tables): on
    a GPU every kernel needs a thread binding, and after the mma GEMM rule these generic ones are all
    there is; on a CPU our own rules handle them."""

    def __init__(self, rule, own_ops: bool = False):
        self.rule = rule
        self.own_ops = own_ops

    def __repr__(self):
        return f"DlightRule({type(self.rule).__name__})"

    def apply(self, func, spec):
        if not self.own_ops and func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        target = spec.tvm_target()
        with target:
            sch = self.rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return sch
