"""TVM's own dlight CPU reduction rule (softmax, layer norm: row reductions fused with elementwise
work) as the last fallback: it parallelises the rows. Wrapped to the one rule interface of
:data:`~tvm_lowprec.schedule.DEFAULT_RULES`, ``apply(func, spec) -> Schedule | None``.
"""

from __future__ import annotations


class DlightRule:
    def __init__(self, rule):
        self.rule = rule

    def __repr__(self):
        return f"DlightRule({type(self.rule).__name__})"

    def apply(self, func, spec):
        if func.attrs is not None and func.attrs.get("lowprec.op", None) is not None:
            return None
        target = spec.tvm_target()
        with target:
            sch = self.rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return sch
