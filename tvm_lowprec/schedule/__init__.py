"""Schedule rules: each takes a PrimFunc and a TargetSpec and returns a Schedule, or None to decline."""

from .elementwise import ElementwiseRule
from .qgemm import Im2colRule, PackBRule, QGemmRule

DEFAULT_RULES = (QGemmRule(), PackBRule(), Im2colRule(), ElementwiseRule())


def schedule_func(func, spec, rules=DEFAULT_RULES):
    """The first rule that accepts ``func`` schedules it; ``None`` when none does."""
    for rule in rules:
        sch = rule.apply(func, spec)
        if sch is not None:
            return sch
    return None


__all__ = ["DEFAULT_RULES", "ElementwiseRule", "Im2colRule", "PackBRule", "QGemmRule", "schedule_func"]
