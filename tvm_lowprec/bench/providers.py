"""The registered GEMM providers: tvm-lowprec and its peers (ONNX Runtime, PyTorch, NumPy).

Every provider imports its library lazily, so a missing one is reported by ``available()`` instead of
breaking the harness. Thread counts are applied per point: ORT through ``SessionOptions``, torch
through ``torch.set_num_threads``, NumPy's BLAS through threadpoolctl when installed, tvm-lowprec
through ``compile(..., num_threads=...)``.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np

from .problems import QGemmProblem, make_problem, matmulinteger_model, qlinearmatmul_model
from .registry import BaseProvider, Prepared, register
from .timing import Measurement, Timing

NUMPY_DEFAULT_THREADS = "numpy threads: default (threadpoolctl not installed)"


# ---------------------------------------------------------------- thread limits

def numpy_thread_limit(threads: int):
    """Return ``(context factory, note)`` limiting NumPy's BLAS pool to ``threads``."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext, NUMPY_DEFAULT_THREADS
    return partial(threadpool_limits, limits=threads, user_api="blas"), ""


@contextlib.contextmanager
def torch_threads(threads: int):
    """Set torch's intra-op thread count and hide its quantized-tensor deprecation warnings."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
            yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- ONNX Runtime helpers

def ort_errors() -> tuple[type[BaseException], ...]:
    """ONNX Runtime's own exception classes (they do not derive from RuntimeError)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidGraph", "NotImplemented", "RuntimeException", "EPFail")
    return tuple(getattr(state, name) for name in names if hasattr(state, name))


def ort_session(model, threads: int, optimize: bool = True):
    """CPU session of ``model`` (ModelProto or path) with ``threads`` intra-op threads, one inter-op
    thread and ORT's default thread policy (intra-op workers spin between calls; benchmarks quiesce
    them before timing another runtime: :mod:`tvm_lowprec.bench.quiesce`); ``optimize=False`` runs
    the graph as written (for QDQ: float operators between DequantizeLinear and QuantizeLinear, no
    fused integer kernels)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 (ORT raises its own pybind classes)
        if not optimize or ORT_BROKEN_FUSION[1] not in str(err):
            raise
    warnings.warn(f"ONNX Runtime could not optimize {model if isinstance(model, (str, Path)) else 'the model'} "
                  f"(its {ORT_BROKEN_FUSION[0]} fails: '{ORT_BROKEN_FUSION[1]}'); running it with that one "
                  "optimizer disabled", stacklevel=2)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=[ORT_BROKEN_FUSION[0]])


# ONNX Runtime 1.32's MatMulAddFusion fails on transformers' BERT exported by torch's dynamo exporter
# (a 4-layer BertConfig model, FP32): "Exception during initialization: ... AddInitializedOrtValue
# Attempt to replace the existing tensor" at ORT_ENABLE_EXTENDED and above; disabling that one fusion
# (and no other of ORT's fusions) lets the session start
ORT_BROKEN_FUSION = ("MatMulAddFusion", "Attempt to replace the existing tensor")


def ort_runner(session, a: np.ndarray):
    """Zero-argument call running ``session`` on input ``A`` through IO binding."""
    binding = session.io_binding()
    binding.bind_cpu_input("A", a)
    binding.bind_output("Y")
    return partial(session.run_with_iobinding, binding)


def ort_qlinear_reference(problem: QGemmProblem) -> np.ndarray:
    """ORT's ``QLinearMatMul`` output for ``problem`` (the correctness reference)."""
    session = ort_session(qlinearmatmul_model(problem), threads=1)
    return session.run(None, {"A": problem.a})[0]


def max_abs_diff(out: np.ndarray, ref: np.ndarray) -> int:
    """Largest absolute difference in quantization steps; shape mismatch raises ValueError."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {out.shape} differs from ORT's {ref.shape}")
    return int(np.abs(out.astype(np.int32) - ref.astype(np.int32)).max())


def diff_vs_ort(out: np.ndarray, problem: QGemmProblem) -> tuple[float, str]:
    """``(max_diff_vs_ort, note)``; NaN with a note when ORT cannot provide the reference."""
    try:
        ref = ort_qlinear_reference(problem)
    except ImportError as err:
        return math.nan, f"no ORT reference: {err}"
    return max_abs_diff(out, ref), ""


# ---------------------------------------------------------------- providers

@register
class NumpyFp32(BaseProvider):
    """``A @ B`` in float32 through NumPy's BLAS (a dense floating-point yardstick)."""

    name = "numpy-fp32"
    requires = ("numpy",)

    def prepare(self, m, n, k, rng, threads=1):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        context, note = numpy_thread_limit(threads)
        return Prepared(run=partial(np.matmul, a, b), context=context, note=note)


class _OrtProvider(BaseProvider):
    requires = ("onnxruntime", "onnx")
    build_model = None  # set by subclasses: QGemmProblem -> onnx.ModelProto

    def errors(self):
        return ort_errors()

    def prepare(self, m, n, k, rng, threads=1):
        problem = make_problem(m, n, k, rng)
        session = ort_session(type(self).build_model(problem), threads)
        return Prepared(run=ort_runner(session, problem.a))


@register
class OrtMatMulInteger(_OrtProvider):
    """ONNX Runtime, one ``MatMulInteger`` node (uint8 x int8 -> int32)."""

    name = "ort-matmulinteger"
    build_model = staticmethod(matmulinteger_model)


@register
class OrtQLinearMatMul(_OrtProvider):
    """ONNX Runtime, one ``QLinearMatMul`` node (uint8 x int8 -> uint8)."""

    name = "ort-qlinearmatmul"
    build_model = staticmethod(qlinearmatmul_model)


@register
class TorchQLinear(BaseProvider):
    """``torch.ops.quantized.linear`` with a prepacked fbgemm weight (quint8 x qint8 -> quint8)."""

    name = "torch-qlinear"
    requires = ("torch",)

    def prepare(self, m, n, k, rng, threads=1):
        import torch

        problem = make_problem(m, n, k, rng)
        with torch_threads(threads):
            torch.backends.quantized.engine = "fbgemm"
            x = torch._make_per_tensor_quantized_tensor(
                torch.from_numpy(problem.a), problem.a_scale, problem.a_zero_point)
            w = torch._make_per_tensor_quantized_tensor(
                torch.from_numpy(np.ascontiguousarray(problem.b.T)), problem.b_scale, 0)
            packed = torch.ops.quantized.linear_prepack(w, None)
            run = partial(torch.ops.quantized.linear, x, packed, problem.y_scale, problem.y_zero_point)
            diff, note = diff_vs_ort(run().int_repr().numpy(), problem)
        return Prepared(run=run, context=partial(torch_threads, threads),
                        extra={"max_diff_vs_ort": diff}, note=note)


@register
class TorchIntMM(BaseProvider):
    """``torch._int_mm`` on int8 CPU tensors (int8 x int8 -> int32)."""

    name = "torch-int-mm"
    requires = ("torch",)

    def available(self):
        ok, reason = super().available()
        if ok:
            import torch

            if not hasattr(torch, "_int_mm"):
                return False, f"torch {torch.__version__} has no torch._int_mm"
        return ok, reason

    def prepare(self, m, n, k, rng, threads=1):
        import torch

        problem = make_problem(m, n, k, rng)
        a = torch.from_numpy((problem.a.astype(np.int16) - problem.a_zero_point).astype(np.int8))
        b = torch.from_numpy(problem.b)
        return Prepared(run=partial(torch._int_mm, a, b), context=partial(torch_threads, threads))


def tvm_timer(compiled, a: np.ndarray, timing: Timing) -> Measurement:
    """Time ``compiled`` with its own ``benchmark`` (TVM time_evaluator, no Python overhead)."""
    start = time.perf_counter()
    compiled(a)
    one_call = max(time.perf_counter() - start, 1e-7)
    number = max(1, math.ceil(timing.min_time / one_call))
    seconds = compiled.benchmark(a, number=number, repeat=timing.repeat)
    return Measurement(seconds=float(seconds), number=number, repeat=timing.repeat)


def describe_compiled(compiled) -> str:
    """``"<target row> [<intrinsics>]"`` from a tvm-lowprec ``Compiled`` (whatever of it exists)."""
    spec = getattr(getattr(compiled, "spec", None), "name", None) or str(getattr(compiled, "target", ""))
    kernels = getattr(compiled, "kernels", None)
    intrinsics = sorted({str(row.intrinsic) for row in kernels()}) if callable(kernels) else []
    return f"{spec} [{' '.join(intrinsics)}]" if intrinsics else spec


@register
class TvmLowprec(BaseProvider):
    """tvm-lowprec compiling the same ``QLinearMatMul`` model as ``ort-qlinearmatmul``."""

    name = "tvm-lowprec"
    requires = ("tvm", "onnx")

    def available(self):
        ok, reason = super().available()
        if not ok:
            return ok, reason
        try:
            import tvm_lowprec

            for attr in ("from_onnx", "compile"):
                getattr(tvm_lowprec, attr)
        except (ImportError, AttributeError) as err:
            return False, f"{type(err).__name__}: {err}"
        return True, ""

    def errors(self):
        import tvm_lowprec

        base = getattr(tvm_lowprec, "LowPrecError", None)
        return (base,) if isinstance(base, type) else ()

    full_range = False

    def prepare(self, m, n, k, rng, threads=1):
        import tvm_lowprec

        problem = make_problem(m, n, k, rng, full_range=self.full_range)
        module = tvm_lowprec.from_onnx(qlinearmatmul_model(problem))
        compiled = tvm_lowprec.compile(module, target="native", num_threads=threads)
        out = compiled(problem.a)[0]
        if self.full_range:  # ORT saturates on such weights without VNNI: compare with the exact result
            diff, note = max_abs_diff(out, exact_reference(problem)), "max_diff_vs_ort is vs the exact result"
        else:
            diff, note = diff_vs_ort(out, problem)
        extra = {"max_diff_vs_ort": diff, "target": describe_compiled(compiled)}
        return Prepared(run=partial(compiled, problem.a), timer=partial(tvm_timer, compiled, problem.a),
                        timer_name="tvm time_evaluator", extra=extra, note=note)


@register
class TvmLowprecFullRange(TvmLowprec):
    """tvm-lowprec on full-range int8 weights ([-128, 127]): without VNNI this takes the exact
    vpmaddwd recipe (7-bit weights can take the denser vpmaddubsw one); checked against the exact
    result, since ORT's and fbgemm's AVX2 kernels saturate on such weights."""

    name = "tvm-lowprec-int8w"
    full_range = True


def exact_reference(problem: QGemmProblem) -> np.ndarray:
    """The ONNX QLinearMatMul definition in int64/float64 (onnx.reference's arithmetic)."""
    # float64 BLAS is exact here (|acc| < 2**31 << 2**53) and far faster than an int64 matmul
    acc = (problem.a.astype(np.float64) - problem.a_zero_point) @ problem.b.astype(np.float64)
    mult = np.float32(problem.a_scale) * np.float32(problem.b_scale) / np.float32(problem.y_scale)
    y = np.rint(acc * np.float64(mult)) + problem.y_zero_point
    return np.clip(y, 0, 255).astype(np.uint8)
