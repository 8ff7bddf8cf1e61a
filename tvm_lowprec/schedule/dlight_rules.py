"""TVM's own dlight CPU reduction rule (softmax, layer norm: row reductions fused with elementwise
work) as the last fallback: it parallelises the rows. Wrapped to the one rule interface of
:data:`~tvm_lowprec.schedule.DEFAULT_RULES`, ``apply(func, spec) -> Schedule | None``.
"""

from __future__ import annotations


class DlightRule:
    """``own_ops``: also schedule tvm-lowprec's own kernels (im2col, 8-bit softmax, lookup tables): on
    a GPU every kernel needs a thread binding, and after the mma GEMM rule these generic ones are all
    there is; on a CPU our own rules handle them.

    ``no_recompute``: decline a schedule that runs some reduction more often than its domain has
    points. dlight's CPU reduction rule assumes every block shares the output's leading axes; a group
    norm of one group (mobilevit-v2: the mean of a whole 1x1x65536 tensor, then a normalize) has none
    in common, and the rule computed the 65536-point sum once per output element: 10.6 s for a kernel
    that runs in 0.07 ms unscheduled (the generic rule takes it instead). It also declines a reduction
    to a single value (:func:`_single_value_reduction`: a group norm's variance), which dlight leaves one
    serial chain of scalar adds over separate passes: against the generic rule's vector partial sums
    (Zen 4, one thread, mean then variance then sqrt) 0.17 / 0.03 us at 128 points, 3.50 / 0.23 us at
    2048 (mobilevit-v2's last group norm, 4 % of copy bandwidth), 7.1 / 0.48 us at 4096."""

    def __init__(self, rule, own_ops: bool = False, no_recompute: bool = False):
        self.rule = rule
        self.own_ops = own_ops
        self.no_recompute = no_recompute

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
        if sch is not None and self.no_recompute and (_recomputes_a_reduction(sch) or _single_value_reduction(sch)):
            return None
        return sch


def _single_value_reduction(sch) -> bool:
    """Whether some reduction block writes one value (every spatial extent 1; static extents only)."""
    from .blocks import root_children

    _, blocks = root_children(sch)
    for block in blocks:
        ivs = sch.get(block).iter_vars
        extents = [int(iv.dom.extent.value) if hasattr(iv.dom.extent, "value") else None for iv in ivs]
        if None in extents or not any(iv.iter_type == 2 for iv in ivs):
            continue
        if all(e == 1 for iv, e in zip(ivs, extents) if iv.iter_type == 0):
            return True
    return False


def _recomputes_a_reduction(sch) -> bool:
    """Whether the loops around some reduction block run more iterations than the block's domain has
    points (static extents only)."""
    import math

    from .blocks import root_children

    def extent(value):
        return int(value.value) if hasattr(value, "value") else None

    _, blocks = root_children(sch)
    stack = list(blocks)
    while stack:
        block = stack.pop()
        stmt = sch.get(block)
        stack.extend(sch.get_child_blocks(block))
        if not any(iv.iter_type == 2 for iv in stmt.iter_vars):
            continue
        domain = [extent(iv.dom.extent) for iv in stmt.iter_vars]
        runs = [extent(sch.get(loop).extent) for loop in sch.get_loops(block)]
        if None not in domain and None not in runs and math.prod(runs) > math.prod(domain):
            return True
    return False
