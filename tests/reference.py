"""ONNX Runtime as the reference for QDQ models, and the one-quantization-step comparison."""

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper


# helper.make_model stamps the installed onnx's IR version (14 with onnx 1.23), which an older ONNX
# Runtime refuses ("Unsupported model IR version: 14, max supported IR version: 13", ORT 1.30); the
# test models use nothing newer than IR 10 (ORT >= 1.17) has
ORT_IR_VERSION = 10


def for_ort(model):
    """A copy of ``model`` with its IR version lowered to :data:`ORT_IR_VERSION` where it is newer."""
    copy = type(model)()
    copy.CopyFrom(model)
    copy.ir_version = min(copy.ir_version, ORT_IR_VERSION)
    return copy


def ort_session(model, optimized=True):
    """ORT on one thread; ``optimized=False`` runs the graph as written (float QDQ semantics)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(for_ort(model).SerializeToString(), so, providers=["CPUExecutionProvider"])


def output_scale(model) -> float:
    """The scale of the model's last DequantizeLinear: one quantization step of its output."""
    inits = {t.name: t for t in model.graph.initializer}
    last_dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float(numpy_helper.to_array(inits[last_dq.input[1]]))


def assert_within_one_step(got, want, scale, exact_fraction=0.95):
    """At most one quantization step apart everywhere, and nearly all exactly equal."""
    steps = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)) / scale
    assert steps.max() <= 1.0 + 1e-3, f"{steps.max():.2f} steps apart"
    assert (steps < 1e-3).mean() >= exact_fraction, f"only {(steps < 1e-3).mean():.3f} exact"


def assert_matches(got, want, how, model):
    """``how``: ``"exact"``, ``"close"`` (float outputs, 1e-5) or ``"one-step"`` (quantized outputs, at
    most one step of the model's output scale apart, nearly all exact)."""
    if how == "exact":
        np.testing.assert_array_equal(got, want)
    elif how == "close":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert_within_one_step(got, want, output_scale(model))


def kernel_calls(compiled, *args) -> dict:
    """Calls of each kernel in one run of ``compiled`` on ``args`` (layers of one shape share a kernel)."""
    return {row["name"]: row["calls"] for row in compiled.profile(*args, repeat=1)}


def cosine(a, b) -> float:
    """Cosine similarity of two outputs, flattened, in float64."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def intrinsic_free_module(lib, spec):
    """A compiled kernel library without tensor intrinsics (shuffles, maxima), runnable for ``spec``:
    the library itself on a native row, under qemu on an Arm row, the emulated build elsewhere (the
    same IR for this host: nothing to replace); skips naming what is missing otherwise."""
    import pytest

    from tvm_lowprec.emulation import execution_mode, load_emulated
    from tvm_lowprec.qemu import QemuModule, unavailable_reason

    mode = execution_mode(spec)
    if mode == "native":
        return lib
    if mode == "qemu":
        return QemuModule(lib, cpu=spec.qemu_cpu)
    if mode == "emulated":
        return load_emulated(lib)[0]
    pytest.skip(f"{spec.name} cannot run here: {unavailable_reason()}")


def benchmark_module(relative: str):
    """A module of ``benchmarks/`` loaded by its path (``"models/llm.py"``): the suite's own ``models``
    module has the name ``benchmarks/models`` would take."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / relative
    name = "tvm_lowprec_bench_" + relative.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
