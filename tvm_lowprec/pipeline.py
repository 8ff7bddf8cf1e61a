"""The compilation pipeline, assembled in one place from phases.

1. weight-only layers (int4, float8 weights kept narrow: :mod:`~tvm_lowprec.quant.weight_only`);
   quantize-to-integer: :func:`~tvm_lowprec.quant.qdq_to_integer.qdq_to_integer` (target-aware);
   then data movement kept in the integer domain (:mod:`~tvm_lowprec.quant.fold_qdq`), inference batch
   norms as ``x * a + b`` (:mod:`~tvm_lowprec.quant.batch_norm`), the
   convolutions' NHWC layout carried through the layers between them
   (:mod:`~tvm_lowprec.quant.propagate_layout`), softmax and layer norm of 8-bit tensors as 8-bit
   kernels (:mod:`~tvm_lowprec.quant.row_ops`), element-wise chains after a concatenation moved onto
   its pieces (:mod:`~tvm_lowprec.quant.through_concat`), float functions of one 8-bit tensor (Sigmoid,
   SiLU, GELU) as 256-entry tables (:mod:`~tvm_lowprec.quant.lookup_tables`), adds and multiplies of two
   8-bit tensors as int32 fixed point on the codes (:mod:`~tvm_lowprec.quant.integer_binary`), then the float32 matmuls and
   convolutions left with constant weights as packed FMA kernels (:mod:`~tvm_lowprec.quant.float_gemm`),
   and, optionally, TVM's FastMathTransform for the float operators left between quantized ones; last,
   a normalization's statistics (:mod:`~tvm_lowprec.quant.norm_stats`) and the means of 8-bit
   tensors (:mod:`~tvm_lowprec.quant.integer_mean`) as integer sums of the codes, quantize/dequantize
   pairs inside float chains in float32 (:mod:`~tvm_lowprec.quant.float_qdq`), NaN-safe quantization
   (:mod:`~tvm_lowprec.quant.finite_quantize`) and a shared dequantize copied into each reader
   (:mod:`~tvm_lowprec.quant.dequantize_per_use`): :data:`FINISH`
2. legalize and fuse: TVM's LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR
3. schedule: every PrimFunc goes through the schedule rules (:mod:`tvm_lowprec.schedule`)
4. lower: TVM's CPU dataflow-lowering and finalize passes (memory planning, VM lowering)
"""

from __future__ import annotations

import tvm
from tvm import relax

from .scalar_params import opaque_scalar_kernels_pass
from .quant.batch_norm import batch_norm_module
from .quant.depthwise_multiplier import depthwise_multiplier_module
from .quant.fast_math import fast_math_module
from .quant.dequantize_per_use import dequantize_per_use_module
from .quant.finite_quantize import finite_quantize_module
from .quant.fold_constants import fold_constants_module
from .quant.float_gemm import float_gemm_module
from .quant.float_qdq import float_qdq_module
from .quant.fold_qdq import fold_qdq_module
from .quant.integer_binary import integer_binary_module
from .quant.integer_mean import integer_mean_module
from .quant.grouped_attention import grouped_attention_module
from .quant.legalize import LEGALIZE
from .quant.lookup_epilogue import lookup_epilogue_module
from .quant.norm_stats import norm_stats_module
from .quant.lookup_tables import lookup_tables_module
from .quant.propagate_layout import propagate_layout_module
from .quant.qdq_to_integer import rewrite_module
from .quant.row_ops import row_ops_module
from .quant.through_concat import through_concat_module
from .quant.weight_only import weight_only_module
from .index_checks import checked_indices_module
from .parallel_grain import serialize_small_kernels
from .schedule import schedule_func
from .schedule.column_tail import overlap_column_tail
from .schedule.generic import ATTR as GENERIC
from .schedule.lookup_epilogue import attach, gemm_part, is_fused


def schedule_module(spec, tuned=None):
    """Apply the first accepting schedule rule to every unscheduled PrimFunc; ``tuned(func)``, when
    given, is asked first (a tuning database's best schedule, or None). Each PrimFunc records where its
    schedule came from in ``lowprec.schedule``: ``"tuned"``, ``"default"`` (a rule written for its kind
    of kernel), ``"generic"`` (the last-resort rule, :class:`~tvm_lowprec.schedule.generic.GenericRule`,
    whose attribute ``lowprec.generic`` says which of its forms: ``"full"`` or ``"outer"``) or
    ``"none"`` (not even that one could schedule it)."""

    @tvm.ir.transform.module_pass(opt_level=0, name="lowprec.ScheduleFuncs")
    def _pass(mod, _ctx):
        updates = {}
        for gvar, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs.get("tir.is_scheduled", False):
                continue
            updates[gvar] = schedule_kernel(func, spec, tuned)
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod

    return _pass


def schedule_kernel(func, spec, tuned=None, rules=None, keep_unscheduled: bool = True):
    """One kernel as :func:`schedule_module` schedules it: ``tuned(func)`` first where given, else the
    first of ``rules`` (the row's table by default) that accepts it; then the steps every scheduled
    kernel takes (the qgemm's column tail, a fused lookup attached, small kernels serial) and the
    ``lowprec.schedule`` attribute. A kernel no rule accepts comes back marked ``"none"``, or as None
    where ``keep_unscheduled`` is false."""
    if relax.analysis.has_reshape_pattern(func):  # a view: TVM's lowering makes it a no-copy reshape
        return func.with_attr("lowprec.schedule", "view") if keep_unscheduled else None
    fused, func = (func, gemm_part(func)) if is_fused(func) else (None, func)  # a GEMM with its lookup
    sch = tuned(func) if tuned is not None else None
    from_database = sch is not None
    sch = sch if from_database else schedule_func(func, spec, rules)
    if sch is None:  # no rule accepts it: TVM lowers its loops as written (serial, scalar)
        return (fused if fused is not None else func).with_attr("lowprec.schedule", "none") if keep_unscheduled else None
    scheduled = overlap_column_tail(sch.mod["main"])  # a qgemm's last column vector unpredicated
    if fused is not None:
        scheduled = attach(scheduled, fused, spec.lookup_intrin)
    scheduled = serialize_small_kernels(scheduled)  # a few microseconds of work: no thread launch
    scheduled = scheduled.with_attr("tir.is_scheduled", True)
    source = "generic" if scheduled.attrs.get(GENERIC, None) is not None else "default"
    return scheduled.with_attr("lowprec.schedule", "tuned" if from_database else source)


def high_level(mod, spec, requant_mode: str = "float", fast_math: bool = True, tuned=None, weight_only=None):
    """Phases 1-3 (call inside the target's scope).

    Phase 1 runs as plain Python so that its errors (a zero scale, say) reach the caller unwrapped.
    ``fast_math`` replaces exp/tanh/erf with TVM's vectorizable polynomial forms (relative error
    about 1e-6; measured: a 128x256 softmax 2.3x faster, the quantized outputs unchanged).
    """
    return schedule_module(spec, tuned)(fused_module(mod, spec, requant_mode, fast_math, weight_only))


# the last rewrites of phase 1, in order: a normalization's statistics and the means of 8-bit tensors as
# integer sums of their codes, quantize/dequantize pairs inside float chains in float32, NaN-safe
# quantization, a shared dequantize copied into each reader
FINISH = (("norm_stats", norm_stats_module), ("integer_mean", integer_mean_module), ("float_qdq", float_qdq_module),
          ("finite_quantize", finite_quantize_module), ("dequantize_per_use", dequantize_per_use_module))


def rewrites(spec, requant_mode: str = "float", fast_math: bool = True, weight_only=None) -> list:
    """Phase 1, in order: ``(name, module -> module)`` (``benchmarks/compile_phases.py`` times each)."""
    return [
        ("grouped_attention", grouped_attention_module),
        ("weight_only", lambda m: weight_only_module(m, spec, weight_only)),
        ("depthwise_multiplier", depthwise_multiplier_module),
        ("qdq_to_integer", lambda m: rewrite_module(m, spec, requant_mode)),
        ("fold_qdq", fold_qdq_module),
        ("batch_norm", batch_norm_module),
        ("propagate_layout", propagate_layout_module),
        ("row_ops", row_ops_module),
        ("through_concat", through_concat_module),
        ("lookup_tables", lambda m: lookup_tables_module(m, spec)),
        ("integer_binary", integer_binary_module),
        ("lookup_epilogue", lambda m: lookup_epilogue_module(m, spec)),
        ("float_gemm", lambda m: float_gemm_module(m, spec)),  # last of the rewrites: only what stayed float
        *([("fast_math", fast_math_module)] if fast_math else []),
        *FINISH,
        ("checked_indices", checked_indices_module),  # a Gather's run-time indices raise out of range
    ]


def fused_module(mod, spec, requant_mode: str = "float", fast_math: bool = True, weight_only=None):
    """Phases 1-2: the module whose PrimFuncs are the kernels to schedule (or to tune).
    ``weight_only``: a :class:`~tvm_lowprec.quant.weight_only.WeightOnlyConfig` (default: float activations)."""
    for _, rewrite in rewrites(spec, requant_mode, fast_math, weight_only):
        mod = rewrite(mod)
    return legalize_and_fuse(mod)


def finish_module(mod):
    """The :data:`FINISH` rewrites (``transform.Finish``)."""
    for _, rewrite in FINISH:
        mod = rewrite(mod)
    return mod


def legalize_and_fuse(mod):
    """Phase 2: TVM's legalization (our quantize), our constant folder, fusion at most
    :data:`MAX_FUSED_OPS` deep."""
    with _fusion_depth(MAX_FUSED_OPS):
        return tvm.transform.Sequential(
            [
                relax.transform.DeadCodeElimination(),
                relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE),  # quantize: NaN -> the lowest code, as ORT
                relax.transform.AnnotateTIROpPattern(),
                opaque_scalar_kernels_pass(),  # FuseTIR fails on a scalar parameter beside tir_vars
                fold_constants_module_pass(),  # not relax's FoldConstant: see quant/fold_constants.py
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
                relax.transform.DeadCodeElimination(),
            ]
        )(mod)


def fold_constants_module_pass():
    return tvm.transform.module_pass(lambda mod, _ctx: fold_constants_module(mod), opt_level=0, name="lowprec.FoldConstants")


# The most operators FuseOps puts in one kernel (TVM's default: 256). A requantization reads its input
# more than once (the clip's bounds, the rounding), so a fused chain of them is an expression whose
# size TVM's TIR passes grow faster than the chain: a 600-node Q/DQ'd element-wise chain compiled in
# 1.2 s with 32, 26.5 s with 96, over 270 s with 128 (Zen 4 EPYC). Real exports fuse far fewer.
MAX_FUSED_OPS = 32


def _fusion_depth(depth: int):
    """A pass context like the current one, FuseOps' depth capped at ``depth``."""
    current = tvm.transform.PassContext.current()
    config = {str(k): v for k, v in current.config.items()} if current.config is not None else {}
    config["relax.FuseOps.max_depth"] = min(int(config.get("relax.FuseOps.max_depth", depth)), depth)
    return tvm.transform.PassContext(opt_level=current.opt_level, required_pass=list(current.required_pass),
                                     disabled_pass=list(current.disabled_pass), instruments=list(current.instruments),
                                     config=config)


def lowering_passes(target):
    """Phase 4 (TVM's own lowering for the target's device, its backend's: CPU, or CUDA with its CUDA-graph rewrite),
    the kernels no function calls any more dropped between TVM's two halves (:func:`drop_unused_kernels`)."""
    from .backends import backend_for_target

    backend = backend_for_target(target).lowering_pipeline()
    unused = tvm.transform.module_pass(lambda mod, _ctx: drop_unused_kernels(mod), opt_level=0,
                                       name="lowprec.DropUnusedKernels")
    return tvm.transform.Sequential(backend.dataflow_lower_passes(target) + [unused] + backend.finalize_passes(target))


def drop_unused_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the PrimFuncs no Relax function refers to. TVM's RewriteDataflowReshape turns a
    call of a reshape kernel into a view (``R.reshape``, no copy) and leaves the kernel in the module,
    where LLVM compiled it all the same and ``Compiled.kernels()`` listed it (YOLO11n at 160x160: 65 of
    211 kernels, never run)."""
    used = {gv.name_hint for f in mod.functions.values() if isinstance(f, relax.Function)
            for gv in relax.analysis.all_global_vars(f)}
    dead = [gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in used]
    if not dead:
        return mod
    kept = mod.clone()  # attributes and global infos (a GPU row's virtual devices) as they were
    for gv in dead:
        del kept[gv]
    return kept


class _CallablePipeline(type(tvm)):
    """This module, callable: ``tvm_lowprec.pipeline(target)`` is :func:`tvm_lowprec.transform.pipeline`
    (TVM's ``relax_pipeline`` form), while ``tvm_lowprec.pipeline.high_level`` and the rest stay here."""

    def __call__(self, *args, **kwargs):
        from .transform import pipeline

        return pipeline(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallablePipeline
