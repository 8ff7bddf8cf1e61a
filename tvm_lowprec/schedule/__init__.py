"""Schedule rules: each takes a PrimFunc and a TargetSpec and returns a Schedule, or None to decline."""

from tvm import tirx
from tvm.s_tir.dlight import cpu as _dlight_cpu
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight import gpu as _dlight_gpu

from .bf16_gemm import Bf16GemmRule
from .byte_transpose import ByteTransposeRule
from .col2im import Col2imRule
from .cuda import CudaPackBRule, CudaQGemmRule
from .depthwise import DepthwiseRule
from .depthwise_dot import DepthwiseDotRule
from .dlight_rules import DlightRule
from .elementwise import ElementwiseRule
from .generic import GenericRule
from .fp8_weights import Fp8WeightsRule
from .fp32_depthwise import Fp32DepthwiseRule
from .fp32_gemm import Fp32GemmRule
from .fp32_matmul import Fp32MatmulRule
from .lookup import LookupRule
from .nbits import NbitsGemmRule
from .pool import SeparablePoolRule
from .qgemm import Im2colRule, PackBRule, QGemmRule
from .qgemm16 import QGemm16Rule
from .resize import ResizeRule
from .rows import RowOpRule
from .softmax_vectors import VectorSoftmaxRule
from .strided import StridedReductionRule
from .window import WindowReductionRule

# in priority order: ours first, then TVM's dlight row-reduction rule (softmax, layer norm), and last the
# generic rule, which accepts whatever the others decline (no kernel is left serial and scalar)
DEFAULT_RULES = (QGemmRule(), NbitsGemmRule(), QGemm16Rule(), Fp8WeightsRule(), Bf16GemmRule(), Fp32GemmRule(), Fp32DepthwiseRule(), Fp32MatmulRule(), PackBRule(), Im2colRule(), Col2imRule(),
                 VectorSoftmaxRule(), RowOpRule(), LookupRule(), DepthwiseDotRule(), DepthwiseRule(), SeparablePoolRule(), ResizeRule(), ByteTransposeRule(), ElementwiseRule(), WindowReductionRule(), StridedReductionRule(),
                 DlightRule(_dlight_cpu.Reduction(), no_recompute=True), GenericRule())


# GPU rows: the mma GEMM, then TVM's dlight GPU rules (the fallback accepts anything it can bind)
CUDA_RULES = (CudaQGemmRule(), CudaPackBRule(), DlightRule(_dlight_gpu.Reduction(), own_ops=True),
              DlightRule(_dlight_gpu.GeneralReduction(), own_ops=True), DlightRule(_dlight_gpu.Fallback(), own_ops=True))



def has_symbolic_shape(func) -> bool:
    """Whether some buffer of ``func``'s parameters has a dimension that is not a constant (a symbolic
    length: a prompt's tokens, a batch), or some parameter is a scalar (a length passed at run time)."""
    from ..kernel_cost import param_buffers

    buffers = param_buffers(func)
    return len(buffers) != len(func.params) or any(not isinstance(d, tirx.IntImm) for b in buffers for d in b.shape)


def schedule_func(func, spec, rules=None):
    """The first rule that accepts ``func`` schedules it; ``None`` when none does. ``rules``: the
    spec's backend's table (``spec.backend.schedule_rules()``) unless given. A kernel with a symbolic shape goes only to
    the rules that declare ``symbolic = True`` (they read extents that may be variables); the others
    tile by constant extents and are not asked."""
    symbolic = has_symbolic_shape(func)
    for rule in spec.backend.schedule_rules() if rules is None else rules:
        if symbolic and not getattr(rule, "symbolic", False):
            continue
        sch = rule.apply(func, spec)
        if sch is not None:
            return sch
    return None


class _Scheduled:
    """What dlight's ``ApplyDefaultSchedule`` reads of a rule's result: ``.mod["main"]``."""

    def __init__(self, func):
        import tvm

        self.mod = tvm.IRModule({"main": func})


class _AsDlightRule(ScheduleRule):
    """One of our rules as a dlight ``ScheduleRule`` (``apply(func, target, tunable)``): the kernel
    scheduled as ``tvm_lowprec.compile`` schedules it (:func:`tvm_lowprec.pipeline.schedule_kernel`:
    the rule, then the steps every kernel takes), or None where the rule declines."""

    def __init__(self, rule, spec):
        self.rule, self.spec = rule, spec

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's signature
        from ..pipeline import schedule_kernel

        if tunable:
            raise NotImplementedError("tvm_lowprec.schedule.rules are default schedules (tunable=False); tune with "
                                      "tvm_lowprec.tune, whose search spaces keep the intrinsics")
        if func.attrs is not None and func.attrs.get("tir.is_scheduled", False):
            return None  # built scheduled (a lookup kernel): nothing to do, as in ScheduleKernels
        scheduled = schedule_kernel(func, self.spec, rules=(self.rule,), keep_unscheduled=False)
        return None if scheduled is None else [_Scheduled(scheduled)]

    def __repr__(self):
        return f"{type(self.rule).__name__}@{self.spec.name}"


def rules(target="native") -> list:
    """The row's schedule rules as a dlight-style rule list, in priority order, for
    ``tvm.s_tir.dlight.ApplyDefaultSchedule(*rules(target))`` (with the row's TVM target in scope):
    each schedules a kernel as ``tvm_lowprec.compile`` would, or declines."""
    from ..targets import resolve_target

    spec = resolve_target(target)
    return [_AsDlightRule(rule, spec) for rule in spec.backend.schedule_rules()]


__all__ = ["Bf16GemmRule", "ByteTransposeRule", "CUDA_RULES", "Col2imRule", "CudaPackBRule", "CudaQGemmRule", "DEFAULT_RULES", "DepthwiseRule", "DlightRule",
           "ElementwiseRule", "Fp32DepthwiseRule", "GenericRule", "Fp32GemmRule", "Fp32MatmulRule", "Fp8WeightsRule", "LookupRule", "Im2colRule", "NbitsGemmRule", "PackBRule", "QGemm16Rule", "QGemmRule",
           "ResizeRule", "RowOpRule", "SeparablePoolRule", "StridedReductionRule", "VectorSoftmaxRule", "WindowReductionRule", "rules", "schedule_func"]
