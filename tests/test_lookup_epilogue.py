"""A table lookup after an integer GEMM runs inside it (quant/lookup_epilogue, schedule/lookup_epilogue):
a convolution + SiLU quantized by ONNX Runtime becomes one kernel (``Compiled.kernels()``: a qgemm that
says what it folded, no lookup kernel left), with the row's lookup instruction in its assembly, the
lookup run on each task's rows (a narrow GEMM) or after the GEMM (B panels as tasks), and the codes of
the GEMM and the lookup run apart, bit for bit: at model level on the x86 rows (natively or emulated),
at kernel level on every CPU row (the AArch64 ones under qemu). The GEMM part is the qgemm PrimFunc it
was built from (what the default rule and tuning records schedule)."""

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec import pipeline
from tvm_lowprec.quant.lookup_epilogue import GEMM_NAME
from tvm_lowprec.schedule.lookup_epilogue import attach, gemm_part, is_fused

from conftest import TARGETS
from models import quantize_qdq
from reference import intrinsic_free_module

CPU_ROWS = [spec for spec in TARGETS if spec.device == "cpu" and spec.lookup_intrin is not None]
X86_ROWS = [spec for spec in CPU_ROWS if spec.name.startswith("x86")]
# output channels -> where the lookup runs: 16 (one B panel: row tiles are the tasks), 1024 (B panels are)
PLACEMENT = {16: "tasks", 1024: "after"}
SHAPE = (1, 8, 12, 12)


def _conv_silu(c_out: int, activations: str = "uint8") -> onnx.ModelProto:
    rng = np.random.default_rng(c_out)
    w = (rng.standard_normal((c_out, SHAPE[1], 3, 3)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(c_out) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "conv_silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from onnxruntime.quantization import QuantType

    kind = QuantType.QInt8 if activations == "int8" else QuantType.QUInt8
    return quantize_qdq(fp32, [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)], activation_type=kind)


@pytest.fixture(scope="module")
def models():
    return {**{c: _conv_silu(c) for c in PLACEMENT}, "int8": _conv_silu(16, "int8")}


def _compile(model, spec, fuse: bool, monkeypatch):
    if not fuse:
        monkeypatch.setattr(pipeline, "lookup_epilogue_module", lambda mod, spec=None: mod)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec, num_threads=2)
    monkeypatch.undo()
    return compiled


@pytest.mark.parametrize("c_out", list(PLACEMENT))
@pytest.mark.parametrize("spec", X86_ROWS, ids=lambda s: s.name)
def test_a_lookup_after_a_convolution_runs_inside_it(spec, c_out, models, monkeypatch, rng):
    fused = _compile(models[c_out], spec, True, monkeypatch)
    apart = _compile(models[c_out], spec, False, monkeypatch)
    kernels = fused.kernels()
    assert not [k for k in kernels if k.op == "lookup"] and [k for k in apart.kernels() if k.op == "lookup"]
    (gemm,) = [k for k in kernels if k.op == "qgemm"]
    assert gemm.folded == 6 and gemm.name.endswith("_lookup")  # DQ, Sigmoid, Q, DQ, Mul, Q
    placed = {gv.name_hint: str(f.attrs["lowprec.lookup_placed"]) for gv, f in fused._lowered.functions_items()
              if isinstance(f, tvm.tirx.PrimFunc) and "lowprec.lookup_placed" in f.attrs}
    assert placed == {gemm.name: PLACEMENT[c_out]}
    import re

    assert re.search(spec.lookup_intrin.asm, fused.inspect_source("asm"))
    x = rng.standard_normal(SHAPE).astype(np.float32) * 2
    got, want = fused(x)[0], apart(x)[0]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 30  # a real range of codes through the table


def _fill(rng, buffer, out_dtype="uint8"):
    shape, dtype = tuple(int(d) for d in buffer.shape), str(buffer.dtype)
    if buffer.name == "out_range":  # the requantization's zero point and clamp bounds: the output's whole range
        info = np.iinfo(out_dtype)
        return np.array([3, info.min, info.max], np.int32)
    if dtype == "float32":  # requantization multipliers: codes across the range, few clamped
        return rng.uniform(2e-4, 2e-3, shape).astype(np.float32)
    if dtype in ("uint8", "int8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    if dtype == "int16":  # weights widened at packing: int8 values
        return rng.integers(-127, 128, shape).astype(dtype)
    return rng.integers(-2000, 2000, shape).astype(dtype)


@pytest.mark.parametrize("c_out", [*PLACEMENT, "int8"])  # int8: int8 activations, 16 channels (in tasks)
@pytest.mark.parametrize("spec", CPU_ROWS, ids=lambda s: s.name)
def test_the_fused_kernel_is_the_gemm_then_the_table_on_every_cpu_row(spec, c_out, models, rng):
    with spec.tvm_target(2):
        mod = pipeline.fused_module(tvm_lowprec.from_onnx(models[c_out]), spec)
    (fused,) = [f for _, f in mod.functions_items() if is_fused(f)]
    gemm = gemm_part(fused)
    assert str(gemm.attrs["global_symbol"]) == str(fused.attrs[GEMM_NAME]) and len(gemm.params) == len(fused.params) - 1
    sch = pipeline.schedule_func(gemm, spec)
    one = attach(sch.mod["main"], fused, spec.lookup_intrin)
    assert str(one.attrs["lowprec.lookup_placed"]) == PLACEMENT.get(c_out, "tasks")
    assert str(gemm.params[-1].dtype) == ("int8" if c_out == "int8" else "uint8")
    libs = {name: tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=spec.tvm_target(2)).mod
            for name, f in (("fused", one), ("gemm", sch.mod["main"]))}
    out = gemm.params[-1]
    args = [_fill(rng, b, str(out.dtype)) for b in gemm.params[:-1]]
    entries = rng.integers(0, 256, 256).astype(np.uint8).view(str(out.dtype))  # entry of code i: entries[i]
    table = spec.lookup_intrin.pack(entries)  # as the row's instruction reads it
    results = {}
    for name, lib in libs.items():
        extra = [table] if name == "fused" else []
        tensors = [tvm.runtime.tensor(a) for a in args + extra] + [tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)))]
        intrinsic_free_module(lib, spec)["main"](*tensors)
        results[name] = tensors[-1].numpy()
    codes = results["gemm"]
    assert len(np.unique(codes)) > 100
    np.testing.assert_array_equal(results["fused"], entries[codes.view(np.uint8)])


def test_the_unscheduled_fused_function_is_a_whole_kernel(models, rng):
    """Run as written (TVM's loops, no rule), the fused function already applies the table."""
    spec = X86_ROWS[0]
    with spec.tvm_target(2):
        mod = pipeline.fused_module(tvm_lowprec.from_onnx(models[16]), spec)
    (fused,) = [f for _, f in mod.functions_items() if is_fused(f)]
    gemm = gemm_part(fused)
    assert tvm_ffi.structural_equal(gemm, _unfused_gemm(models[16], spec))  # what tuning records are keyed by
    lib, plain = (intrinsic_free_module(tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                                                    target=spec.tvm_target(2)).mod, spec) for f in (fused, gemm))
    out = gemm.params[-1]
    args = [_fill(rng, b, str(out.dtype)) for b in gemm.params[:-1]]
    table = spec.lookup_intrin.pack(np.arange(255, -1, -1).astype(str(out.dtype)))  # reverses the codes
    outs = [tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype))) for _ in range(2)]
    plain["main"](*[tvm.runtime.tensor(a) for a in args], outs[0])
    lib["main"](*[tvm.runtime.tensor(a) for a in args + [table]], outs[1])
    np.testing.assert_array_equal(outs[1].numpy(), 255 - outs[0].numpy())


def _unfused_gemm(model, spec):
    import unittest.mock

    with unittest.mock.patch.object(pipeline, "lookup_epilogue_module", lambda mod, spec=None: mod), spec.tvm_target(2):
        mod = pipeline.fused_module(tvm_lowprec.from_onnx(model), spec)
    (gemm,) = [f for _, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("lowprec.op", None) == "qgemm"]
    return gemm
