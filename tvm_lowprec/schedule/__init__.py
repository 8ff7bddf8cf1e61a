"""Schedule rules: each takes a PrimFunc and a TargetSpec and returns a Schedule, or None to decline."""

from tvm.s_tir.dlight import cpu as _dlight_cpu
from tvm.s_tir.dlight import gpu as _dlight_gpu

from .bf16_gemm import Bf16GemmRule
from .byte_transpose import ByteTransposeRule
from .col2im import Col2imRule
from .cuda import CudaPackBRule, CudaQGemmRule
from .depthwise import DepthwiseRule
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
                 VectorSoftmaxRule(), RowOpRule(), LookupRule(), DepthwiseRule(), SeparablePoolRule(), ResizeRule(), ByteTransposeRule(), ElementwiseRule(), WindowReductionRule(), StridedReductionRule(),
                 DlightRule(_dlight_cpu.Reduction(), no_recompute=True), GenericRule())


# GPU rows: the mma GEMM, then TVM's dlight GPU rules (the fallback accepts anything it can bind)
CUDA_RULES = (CudaQGemmRule(), CudaPackBRule(), DlightRule(_dlight_gpu.Reduction(), own_ops=True),
              DlightRule(_dlight_gpu.GeneralReduction(), own_ops=True), DlightRule(_dlight_gpu.Fallback(), own_ops=True))

RULES = {"cpu": DEFAULT_RULES, "cuda": CUDA_RULES}


def schedule_func(func, spec, rules=None):
    """The first rule that accepts ``func`` schedules it; ``None`` when none does. ``rules``: the
    spec's device's table (:data:`RULES`) unless given."""
    for rule in RULES[spec.device] if rules is None else rules:
        sch = rule.apply(func, spec)
        if sch is not None:
            return sch
    return None


__all__ = ["Bf16GemmRule", "ByteTransposeRule", "CUDA_RULES", "Col2imRule", "CudaPackBRule", "CudaQGemmRule", "DEFAULT_RULES", "DepthwiseRule", "DlightRule",
           "ElementwiseRule", "Fp32DepthwiseRule", "GenericRule", "Fp32GemmRule", "Fp32MatmulRule", "Fp8WeightsRule", "LookupRule", "Im2colRule", "NbitsGemmRule", "PackBRule", "QGemm16Rule", "QGemmRule",
           "RULES", "ResizeRule", "RowOpRule", "SeparablePoolRule", "StridedReductionRule", "VectorSoftmaxRule", "WindowReductionRule", "schedule_func"]
