"""tvm-lowprec: quantized ONNX models on low-precision CPU instructions, through Apache TVM.

The user API::

    import tvm_lowprec
    mod = tvm_lowprec.from_onnx("model_qdq.onnx")           # Relax IRModule, QDQ form
    c = tvm_lowprec.compile(mod, target="native")          # integer kernels, tensorized
    y, = c(x)                                              # numpy in, numpy out
    c.kernels()                                            # which kernel uses which intrinsic
    tvm_lowprec.save(c, "model.tlp"); c = tvm_lowprec.load("model.tlp")   # compile once

    qmod = tvm_lowprec.quantize(tvm_lowprec.from_onnx("model_fp32.onnx"), samples)   # FP32 -> QDQ
    tvm_lowprec.accuracy_report(fp32_mod, qmod, held_out).table()                    # per-layer SQNR
"""

from __future__ import annotations

import contextlib
import gc

from . import _threads  # noqa: F401  (sizes TVM's thread pool before anything runs)
from . import intrin  # noqa: F401  (registers the tensor intrinsics)
from .compiled import Compiled, InputSpec, KernelInfo
from .emulation import EmulationError, emulated_executable, execution_mode
from .errors import DynamicShapeError, InputError, KernelBuildError, LowPrecError, QuantizationParameterError, UnsupportedOperatorError
from .frontend.onnx import from_onnx
from .frontend.pt2e import from_pt2e
from .frontend.relax_module import prepare_module, var_name
from .ptq import QuantConfig, accuracy_report, quantize
from .tune import tune
from .kernels import Epilogue, QGemmProblem
from .targets import TargetSpec, host_supports, native_target, registered_targets, resolve_target
from .native_build import build_executable, tir_pipeline
from . import pipeline, transform  # noqa: F401  (tvm_lowprec.pipeline(target): TVM's relax_pipeline form)
from .transform import tvm_target
from .unaligned_inputs import unaligned_inputs
from . import cache as _cache
from .errors import SavedModelError, SavedModelHostError, SavedModelVersionError
from .saved import load, save
from .quant.weight_only import WeightOnlyConfig

__version__ = "0.1.0"

_REQUANT_MODES = ("float", "fixed_point")


def _input_specs(mod) -> list[InputSpec]:
    main = mod["main"]
    names = main.attrs.get("lowprec.input_names", None) if main.attrs is not None else None
    names = [str(n) for n in names] if names is not None else [var_name(p) for p in main.params]
    narrow = main.attrs.get("lowprec.narrow_inputs", {}) if main.attrs is not None else {}
    specs = []
    for name, param in zip(names, main.params):
        ty = param.ty
        shape = tuple(int(s) if hasattr(s, "value") else str(s) for s in ty.shape)
        specs.append(InputSpec(name, shape, str(ty.dtype), str(narrow[name]) if name in narrow else None))
    return specs


def _narrow_outputs(mod) -> tuple:
    attrs = mod["main"].attrs
    found = attrs.get("lowprec.narrow_outputs", None) if attrs is not None else None
    return tuple(str(n) or None for n in found) if found is not None else ()


def _warn_dynamic(inputs) -> None:
    import warnings

    for spec in inputs:
        if any(not isinstance(d, int) for d in spec.shape):
            fixed = [d if isinstance(d, int) else "..." for d in spec.shape]
            warnings.warn(
                f"input {spec.name!r} has dynamic dimension(s) {list(spec.shape)}: one compile serves every size, "
                f"the integer GEMMs with their rows known at run time, but the other integer kernels (convolutions, "
                f"attention, row operators) need static shapes and the operators it feeds stay on the generic "
                f"schedule; fix them for those with from_onnx(model, shape_dict={{{spec.name!r}: {fixed}}})",
                stacklevel=4,
            )


@contextlib.contextmanager
def _dynamic_shapes_named(mod):
    """TVM's legalization fails inside (an assertion) on some symbolic shapes: where the model kept
    dynamic input dimensions, say which ones to fix instead."""
    dynamic = mod["main"].attrs.get("lowprec.dynamic", None) if mod["main"].attrs is not None else None
    try:
        yield
    except LowPrecError:
        raise
    except (AssertionError, AttributeError, TypeError, ValueError, IndexError, KeyError, RuntimeError) as err:
        if dynamic is None:
            raise
        cause = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        raise DynamicShapeError(f"{dynamic} (compiling with them failed: {cause})") from err


def _tuned_schedules(database, spec, num_threads):
    """The schedule lookup for ``compile``: ``database`` first, then the records shipped for the
    target row (``database=False``: neither)."""
    if database is False:
        return None
    import warnings

    from .tune.tuner import TuningDatabaseError, database_lookup, shipped_database

    lookups = []
    for source in (database, shipped_database(spec)):
        if source is None:
            continue
        try:
            lookups.append(database_lookup(source, spec, num_threads))
        except TuningDatabaseError as err:
            warnings.warn(f"{err}; compiling with the default schedules", stacklevel=4)

    def tuned(func):
        for lookup in lookups:
            sch = lookup(func)
            if sch is not None:
                return sch
        return None

    return tuned if lookups else None


def compile(  # noqa: A001
    mod, target="native", *, num_threads: int | None = None, requant_mode: str = "float", fast_math: bool = True,
    database=None, emulate="auto", weight_only: WeightOnlyConfig | None = None, cache=False,
) -> Compiled:
    """Compile a (quantized) Relax module into integer kernels for ``target``.

    Parameters
    ----------
    mod : tvm.IRModule
        From :func:`from_onnx` (QDQ, QOperator or FP32 ONNX) or any Relax module with a ``main``.
    target : str, dict, tvm.target.Target or TargetSpec
        A registered name (``"x86-avx512-vnni"``, ``"x86-avx-vnni"``, ``"x86-avx512"``, ``"x86-avx2"``),
        ``"native"`` (this host's best row), a TVM target or its dict form.
    num_threads : int, optional
        Threads of TVM's runtime pool for this model's calls (default: every CPU this process may use,
        or ``TVM_NUM_THREADS``).
    requant_mode : {"float", "fixed_point"}
        Requantization arithmetic; see :class:`tvm_lowprec.Epilogue`.
    fast_math : bool
        Polynomial exp/tanh/erf in the float operators (softmax, GELU, ...) for speed; relative
        error about 1e-6, below one quantization step. Integer kernels are unaffected.
    database : str, path, TuningResult, MetaSchedule Database or False, optional
        Tuning records (:func:`tvm_lowprec.tune`'s ``work_dir`` or its result): kernels with a record
        use the tuned schedule. Kernels without one use the records shipped with tvm-lowprec for the
        target row (``schedules/<row>/``), then the default rules; ``False`` uses the default rules
        only. A database that cannot be read is reported with a warning and ignored.
    emulate : {"auto", True, False}
        How to run a row this host lacks the instructions of. ``"auto"``: natively where the host
        has the row's instruction set, else *emulated*: the same build with each target intrinsic
        replaced by its documented semantics in generic LLVM IR, run on this CPU
        (:mod:`tvm_lowprec.emulation`; exact, slow, for checking results, never timed).
        ``True``: emulated even where native would run (to compare the two). ``False``: never; the
        compiled model then refuses to run on a host without the instructions. ``Compiled.execution``
        says which.
    weight_only : WeightOnlyConfig, optional
        How weight-only layers (int4 ``MatMulNBits`` or blocked QDQ weights, float8 weights) run:
        activations in float (default, what ONNX defines) or quantized per block to int8 on the fly
        (``WeightOnlyConfig(activations="int8")``, as ONNX Runtime's ``accuracy_level=4``).
    cache : bool or path
        ``True``: look the build up in the compile cache (``$TVM_LOWPREC_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/tvm-lowprec``, else ``~/.cache/tvm-lowprec``) and load it from there, or
        compile and store it; a path: that folder. The key covers the module, the target row, every
        option here, tuning records and the versions (:mod:`tvm_lowprec.cache`). Only builds this host
        runs natively are cached. Default ``False``: compile every time.

    Returns
    -------
    Compiled

    Examples
    --------
    >>> c = tvm_lowprec.compile(tvm_lowprec.from_onnx("qlinear.onnx"), target="x86-avx2")  # doctest: +SKIP
    >>> [row.intrinsic for row in c.kernels()]                                              # doctest: +SKIP
    ['lowprec_vpmaddwd_ymm_int16_8x2']
    """
    if requant_mode not in _REQUANT_MODES:
        raise ValueError(f"requant_mode must be one of {_REQUANT_MODES}, not {requant_mode!r}")
    if emulate not in ("auto", True, False):
        raise ValueError(f"emulate must be 'auto', True or False, not {emulate!r}")
    mod = prepare_module(mod)  # a TVM frontend's weights kept as inputs: bound as constants
    spec = resolve_target(target)
    folder = _cache.cache_dir(cache)
    key = None
    if folder is not None and _cache.cacheable(spec, emulate):
        key = _cache.compile_key(_cache.module_digest(mod), spec, _compile_options(
            num_threads, requant_mode, fast_math, emulate, weight_only), database)
        hit = _cache.lookup(folder, key)
        if hit is not None:
            return hit
    with _collector_paused():
        compiled = _build(mod, spec, num_threads, requant_mode, fast_math, database, emulate, weight_only)
    _cache.store(folder, key, compiled)
    return compiled


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a model compiles: the passes make millions of
    short-lived objects, and its generation scans cost about 3% of a compile (YOLO11n at 160x160,
    ``perf``: 0.8 of 24 s). Turned back on (as it was) when the compile ends, however it ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _compile_options(num_threads, requant_mode, fast_math, emulate, weight_only) -> dict:
    """The options of :func:`compile` besides the module, target and tuning records: the cache key's."""
    return {"num_threads": num_threads, "requant_mode": requant_mode, "fast_math": fast_math, "emulate": emulate,
            "weight_only": weight_only}


def _build(mod, spec, num_threads, requant_mode, fast_math, database, emulate, weight_only) -> Compiled:
    """:func:`compile` without the cache: the passes, then the build and the runnable form of the row's backend
    (:mod:`tvm_lowprec.backends`)."""
    from .pipeline import high_level, lowering_passes

    tvm_target = spec.tvm_target(num_threads or 2)
    inputs = _input_specs(mod)
    _warn_dynamic(inputs)
    tuned = _tuned_schedules(database, spec, num_threads)
    with tvm_target, _dynamic_shapes_named(mod):
        lowered = lowering_passes(tvm_target)(high_level(mod, spec, requant_mode, fast_math, tuned, weight_only))
    narrow = _narrow_outputs(mod)
    return spec.backend.build_compiled(lowered=lowered, spec=spec, tvm_target=tvm_target, inputs=inputs, narrow=narrow,
                                       num_threads=num_threads, emulate=emulate)


def _build_cuda(lowered, spec, tvm_target, inputs, narrow, num_threads, emulate) -> Compiled:  # noqa: ARG001
    """The CUDA backend's build: the device code built by nvcc here, run where TVM sees a GPU."""
    import tvm

    from .cuda.model import build_model, device_compiler

    with device_compiler(spec):
        executable = tvm.compile(lowered, target=tvm_target, relax_pipeline=None)
    runnable = executable if execution_mode(spec) == "cuda" else None
    return Compiled(executable, lowered, spec, inputs, narrow_outputs=narrow, runnable=runnable,
                    cuda=build_model(executable, spec))


def _build_cpu(lowered, spec, tvm_target, inputs, narrow, num_threads, emulate) -> Compiled:
    """The CPU backend's build: natively (LLVM's back end in a child process), emulated, or compile-only."""
    import tvm

    lowered, any_alignment = unaligned_inputs(lowered)
    mode = execution_mode(spec)
    if mode == "native" and emulate is not True:  # LLVM's back end in a child process: an abort there is a KernelBuildError
        executable, runnable = build_executable(lowered, tvm_target)
        return Compiled(executable, lowered, spec, inputs, narrow_outputs=narrow, num_threads=num_threads,
                        runnable=runnable, any_alignment=any_alignment)
    executable = tvm.compile(lowered, target=tvm_target, relax_pipeline=None, tir_pipeline=tir_pipeline(tvm_target))
    if emulate is True or (emulate == "auto" and mode == "emulated"):
        runnable, report = emulated_executable(lowered, executable, tvm_target)
        return Compiled(executable, lowered, spec, inputs, narrow_outputs=narrow, num_threads=num_threads,
                        runnable=runnable, emulation=report, any_alignment=any_alignment)
    return Compiled(executable, lowered, spec, inputs, narrow_outputs=narrow, num_threads=num_threads,
                    runnable=None, any_alignment=any_alignment)


__all__ = [
    "from_pt2e",
    "Compiled",
    "DynamicShapeError",
    "EmulationError",
    "Epilogue",
    "InputError",
    "InputSpec",
    "KernelInfo",
    "KernelBuildError",
    "pipeline",
    "transform",
    "tvm_target",
    "LowPrecError",
    "SavedModelError",
    "SavedModelHostError",
    "SavedModelVersionError",
    "QGemmProblem",
    "QuantConfig",
    "QuantizationParameterError",
    "TargetSpec",
    "UnsupportedOperatorError",
    "WeightOnlyConfig",
    "accuracy_report",
    "compile",
    "execution_mode",
    "from_onnx",
    "host_supports",
    "load",
    "native_target",
    "quantize",
    "registered_targets",
    "resolve_target",
    "save",
    "tune",
]
