"""tvm-lowprec's passes as ``tvm.transform`` passes, for pipelines of your own.

Each step of :func:`tvm_lowprec.compile` is a module pass here, in the order ``compile`` runs them
(:data:`PHASES`); :func:`pipeline` is the whole of it as one pass, TVM's ``relax_pipeline`` form::

    target = "x86-avx512-vnni"
    ex = tvm.compile(mod, target=tvm_lowprec.tvm_target(target), relax_pipeline=tvm_lowprec.pipeline(target),
                     tir_pipeline=tvm_lowprec.transform.tir_pipeline(target))

builds what ``tvm_lowprec.compile(mod, target)`` builds (its kernels' machine code made in-process, as
``tvm.compile`` does; run it with ``relax.VirtualMachine(ex, tvm.cpu())``). A pipeline of your own
is these passes with yours between them::

    seq = tvm.transform.Sequential([tvm_lowprec.transform.QDQToInteger(target), my_pass,
                                    *tvm_lowprec.transform.after_qdq_to_integer(target)])

Passes that depend on the target row take its name (or a :class:`~tvm_lowprec.hwspec.TargetSpec`);
they run in whatever ``tvm.target.Target`` scope you set, but the row decides the instructions.
"""

from __future__ import annotations

import tvm
from tvm import relax

from . import pipeline as _pipeline
from .frontend.relax_module import prepare_module
from .quant.batch_norm import batch_norm_module
from .quant.depthwise_multiplier import depthwise_multiplier_module
from .quant.fast_math import fast_math_module
from .quant.float_gemm import float_gemm_module
from .quant.fold_qdq import fold_qdq_module
from .quant.integer_binary import integer_binary_module
from .quant.lookup_epilogue import lookup_epilogue_module
from .quant.lookup_tables import lookup_tables_module
from .quant.propagate_layout import propagate_layout_module
from .quant.qdq_to_integer import rewrite_module
from .quant.row_ops import row_ops_module
from .quant.through_concat import through_concat_module
from .quant.weight_only import weight_only_module
from .targets import resolve_target
from .unaligned_inputs import unaligned_inputs


_spec = resolve_target  # a row's name, "native", a TargetSpec, a tvm.target.Target or a dict


def _module_pass(name: str, fn):
    return tvm.transform.module_pass(lambda mod, _ctx: fn(mod), opt_level=0, name=f"lowprec.{name}")


def PrepareModule():  # noqa: N802 - TVM's pass naming
    """A TVM frontend's module made ready: weights kept as inputs bound as constants
    (:func:`~tvm_lowprec.frontend.relax_module.prepare_module`)."""
    return _module_pass("PrepareModule", prepare_module)


def WeightOnly(target, config=None):  # noqa: N802
    """Weight-only layers (int4, float8 weights kept narrow; ``config``: a ``WeightOnlyConfig``)."""
    spec = _spec(target)
    return _module_pass("WeightOnly", lambda mod: weight_only_module(mod, spec, config))


def QDQToInteger(target, requant_mode: str = "float"):  # noqa: N802
    """Dequantize -> matmul/conv -> quantize as integer kernels on the row's instruction, requantized in
    their epilogue."""
    spec = _spec(target)
    # a depthwise convolution with a channel multiplier first made one over repeated channels
    return _module_pass("QDQToInteger", lambda mod: rewrite_module(depthwise_multiplier_module(mod), spec, requant_mode))


def FoldQDQ():  # noqa: N802
    """Data movement (reshape, transpose, concat, pooling...) kept on the 8-bit codes."""
    return _module_pass("FoldQDQ", fold_qdq_module)


def BatchNorm():  # noqa: N802
    """Inference batch norms with constant statistics as ``x * a + b`` (before the layout pass)."""
    return _module_pass("BatchNorm", batch_norm_module)


def PropagateLayout():  # noqa: N802
    """The convolutions' NHWC layout carried through the layers between them."""
    return _module_pass("PropagateLayout", propagate_layout_module)


def RowOps():  # noqa: N802
    """Softmax and layer norm of 8-bit tensors as 8-bit kernels."""
    return _module_pass("RowOps", row_ops_module)


def ThroughConcat():  # noqa: N802
    """Element-wise chains after a concatenation moved onto its pieces."""
    return _module_pass("ThroughConcat", through_concat_module)


def LookupTables(target):  # noqa: N802
    """Float functions of one 8-bit tensor (Sigmoid, SiLU, GELU...) as 256-entry tables."""
    spec = _spec(target)
    return _module_pass("LookupTables", lambda mod: lookup_tables_module(mod, spec))


def IntegerBinary():  # noqa: N802
    """Adds and multiplies of two 8-bit tensors in int32 fixed point on the codes."""
    return _module_pass("IntegerBinary", integer_binary_module)


def LookupEpilogue(target):  # noqa: N802
    """A table lookup after a GEMM moved into the GEMM's epilogue."""
    spec = _spec(target)
    return _module_pass("LookupEpilogue", lambda mod: lookup_epilogue_module(mod, spec))


def FloatKernels(target):  # noqa: N802
    """The float32 matmuls and convolutions left with constant weights as packed FMA kernels."""
    spec = _spec(target)
    return _module_pass("FloatKernels", lambda mod: float_gemm_module(mod, spec))


def FastMath():  # noqa: N802
    """TVM's FastMathTransform for the float operators left between quantized ones (GELU included:
    :mod:`~tvm_lowprec.quant.fast_math`)."""
    return _module_pass("FastMath", fast_math_module)


def Finish():  # noqa: N802
    """NaN-safe quantization, a normalization's statistics and 8-bit means as integer sums, a shared
    dequantize copied into each reader."""
    return _module_pass("Finish", _pipeline.finish_module)


def LegalizeAndFuse():  # noqa: N802
    """TVM's LegalizeOps (our quantize: NaN -> the lowest code), our constant folder, FuseOps (at most
    ``pipeline.MAX_FUSED_OPS`` operators a kernel) and FuseTIR."""

    return _module_pass("LegalizeAndFuse", _pipeline.legalize_and_fuse)


def ScheduleKernels(target, tuned=None):  # noqa: N802
    """Every PrimFunc through the row's schedule rules (``tuned(func)``, when given, first)."""
    return _pipeline.schedule_module(_spec(target), tuned)


def Lower():  # noqa: N802
    """TVM's lowering for the target in scope (memory planning, VM lowering), then the call path's
    alignment declarations of a CPU target (:mod:`tvm_lowprec.unaligned_inputs`)."""

    def run(mod):
        target = tvm.target.Target.current(allow_none=False)
        mod = _pipeline.lowering_passes(target)(mod)
        return mod if target.kind.name == "cuda" else unaligned_inputs(mod)[0]

    return _module_pass("Lower", run)


def after_qdq_to_integer(target, fast_math: bool = True) -> list:
    """The passes after :func:`QDQToInteger`, in ``compile``'s order, through scheduling (no lowering):
    :func:`tvm_lowprec.pipeline.fused_module`'s steps (``tests/test_transform.py`` holds them to the
    same executable)."""
    passes = [FoldQDQ(), BatchNorm(), PropagateLayout(), RowOps(), ThroughConcat(), LookupTables(target), IntegerBinary(),
              LookupEpilogue(target), FloatKernels(target)]
    return passes + ([FastMath()] if fast_math else []) + [Finish(), LegalizeAndFuse(), ScheduleKernels(target)]


def passes(target, requant_mode: str = "float", fast_math: bool = True, weight_only=None) -> list:
    """Every pass of ``compile``'s, in its order (:func:`pipeline` is their ``Sequential``)."""
    return [PrepareModule(), WeightOnly(target, weight_only), QDQToInteger(target, requant_mode),
            *after_qdq_to_integer(target, fast_math), Lower()]


def pipeline(target="native", requant_mode: str = "float", fast_math: bool = True, weight_only=None):
    """The whole of ``compile``'s passes as one ``tvm.transform.Pass``: ``tvm.compile(mod,
    target=tvm_target(target), relax_pipeline=pipeline(target))``."""
    return tvm.transform.Sequential(passes(target, requant_mode, fast_math, weight_only), name="lowprec.Pipeline")


def tir_pipeline(target="native") -> str:
    """The name of the TIR pipeline ``compile`` builds a row's kernels with, for ``tvm.compile(...,
    tir_pipeline=...)``: on CPU rows TVM's default with small buffers kept on the stack
    (:mod:`~tvm_lowprec.stack_allocations`; TVM's default pipeline gives the same results, its GEMMs
    slower where row tiles are short), ``"default"`` on GPU rows."""
    from .native_build import tir_pipeline as for_target

    return for_target(tvm_target(target))


def tvm_target(target="native", num_threads: int | None = None) -> tvm.target.Target:
    """The ``tvm.target.Target`` of a target row (its CPU, features and thread count), as ``compile`` uses."""
    return _spec(target).tvm_target(num_threads or 2)


__all__ = ["BatchNorm", "FastMath", "Finish", "FloatKernels", "FoldQDQ", "IntegerBinary", "LegalizeAndFuse", "LookupEpilogue",
           "LookupTables", "Lower", "PrepareModule", "PropagateLayout", "QDQToInteger", "RowOps", "ScheduleKernels",
           "ThroughConcat", "WeightOnly", "after_qdq_to_integer", "passes", "pipeline", "tir_pipeline", "tvm_target"]
