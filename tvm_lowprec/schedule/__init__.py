"""Schedule rules: each takes a PrimFunc and a TargetSpec and returns a Schedule, or None to decline."""

from tvm.s_tir.dlight import cpu as _dlight_cpu

from .col2im import Col2imRule
from .dlight_rules import DlightRule
from .elementwise import ElementwiseRule
from .depthwise import DepthwiseRule
from .qgemm import Im2colRule, PackBRule, QGemmRule
from .rows import RowOpRule
from .strided import StridedReductionRule
from .window import WindowReductionRule

# in priority order: ours first, TVM's dlight row-reduction rule (softmax, layer norm) last
DEFAULT_RULES = (QGemmRule(), PackBRule(), Im2colRule(), Col2imRule(), RowOpRule(), DepthwiseRule(), ElementwiseRule(), WindowReductionRule(),
                 StridedReductionRule(),                  DlightRule(_dlight_cpu.Reduction()))


def schedule_func(func, spec, rules=DEFAULT_RULES):
    """The first rule that accepts ``func`` schedules it; ``None`` when none does."""
    for rule in rules:
        sch = rule.apply(func, spec)
        if sch is not None:
            return sch
    return None


__all__ = ["Col2imRule", "DEFAULT_RULES", "DepthwiseRule", "DlightRule", "ElementwiseRule", "Im2colRule", "PackBRule", "QGemmRule", "RowOpRule",
           "StridedReductionRule", "WindowReductionRule", "schedule_func"]
