"""Emulated execution of the rows this host lacks (tvm_lowprec.emulation), and proof it is not vacuous.

- Every target intrinsic's generic-IR semantics equals an independent numpy model of the documented
  instruction on random and extreme operands (int16 saturation of ``vpmaddubsw`` included), and,
  where this host has the instruction, the instruction itself.
- Whole models on both VNNI rows (the demo model, a conv network, attention, a quantize_dynamic
  model, the ONNX conformance cases) equal ``onnx.reference``, run natively or emulated.
- Each emulated build replaced as many calls as the real build has (and more than none), and a
  deliberately wrong semantics (the u8 operand sign-extended) is caught.
"""

import dataclasses
from importlib import resources

import numpy as np
import onnx
import pytest
import tvm
from onnx.reference import ReferenceEvaluator
from tvm.script import tirx as T

import tvm_lowprec
from tvm_lowprec.emulation import (
    EmulationError,
    emulated_executable,
    emulated_ir,
    execution_mode,
    known_semantics,
    load_emulated,
)
from tvm_lowprec.qemu import is_aarch64, unavailable_reason
from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, epilogue_params, pack_weights
from tvm_lowprec.quant.zero_points import gemm_corrections
from tvm_lowprec.schedule import schedule_func

from conformance import CLAIMED, load_cases
from conftest import TARGETS, kernel_module
from models import fp32_block_net, fp32_cnn, fp32_linear, qlinear_matmul, quantize_qdq
from reference import assert_matches

VNNI = [t for t in TARGETS if t.gemm.name.startswith("vpdpbusd")]
# LLVM intrinsic -> (semantics, the first row that calls it)
INTRINSICS = {name: (sem, spec) for spec in reversed(TARGETS) for r in spec.recipes() for name, sem in r.intrin.emulation.items()}


# ---------------------------------------------------------------- one instruction

def _numpy_semantics(sem, a, b, acc=None):
    """The documented instruction, independently of the IR generator: int64 products, sums of
    ``group``, the accumulator added, saturated or wrapped to the output width."""
    def widen(x, ext):
        bits = sem.in_bits
        x = x.astype(np.int64)
        return x % (1 << bits) if ext == "zext" else x

    prod = (widen(a, sem.a_ext) * widen(b, sem.b_ext)).reshape(sem.lanes, sem.group).sum(axis=1)
    if acc is not None:
        prod = prod + acc.astype(np.int64)
    lo, hi = -(1 << (sem.out_bits - 1)), (1 << (sem.out_bits - 1)) - 1
    if sem.saturate:
        return np.clip(prod, lo, hi)
    return (prod - lo) % (1 << sem.out_bits) + lo


def _probe(name, sem):
    """A PrimFunc applying the intrinsic once: ``out = name([acc,] a, b)``."""
    n, lanes = sem.lanes * sem.group, sem.lanes
    vin, vout, dt_in, dt_out = f"int{sem.in_bits}x{n}", f"int{sem.out_bits}x{lanes}", f"int{sem.in_bits}", f"int{sem.out_bits}"

    @T.prim_func
    def probe(a: T.Buffer((n,), dt_in), b: T.Buffer((n,), dt_in), acc: T.Buffer((lanes,), dt_out),
              out: T.Buffer((lanes,), dt_out)):
        T.func_attr({"global_symbol": "probe"})
        if sem.accumulate:
            out[T.ramp(0, 1, lanes)] = T.call_llvm_pure_intrin(vout, name, acc.vload([0], vout), a.vload([0], vin), b.vload([0], vin))
        else:
            out[T.ramp(0, 1, lanes)] = T.call_llvm_pure_intrin(vout, name, a.vload([0], vin), b.vload([0], vin))

    return probe


def _operand_sets(sem, rng):
    n, info = sem.lanes * sem.group, np.iinfo(f"int{sem.in_bits}")
    acc_info = np.iinfo(f"int{sem.out_bits}")
    rand = lambda: rng.integers(info.min, info.max + 1, n).astype(info.dtype)  # noqa: E731
    full = lambda v: np.full(n, v, info.dtype)  # noqa: E731
    acc = rng.integers(acc_info.min, acc_info.max + 1, sem.lanes).astype(acc_info.dtype)
    # -1 is 255 as u8: -1 x 127 pairs saturate vpmaddubsw; -32768^2 pairs wrap vpmaddwd; extreme accumulators wrap
    return [(rand(), rand(), acc), (full(-1), full(127), acc), (full(-1), full(info.min), acc),
            (full(info.min), full(info.min), np.full(sem.lanes, acc_info.max, acc_info.dtype))]


@pytest.mark.parametrize("name", sorted(INTRINSICS))
def test_semantics_equal_the_documented_instruction(name, rng):
    sem, spec = INTRINSICS[name]
    lib = tvm.compile(tvm.IRModule({"probe": _probe(name, sem)}), target=spec.tvm_target(1)).mod
    modules = {"emulated": kernel_module(lib, spec, emulate=True)}
    if execution_mode(spec) == "native":
        modules["native"] = lib
    for a, b, acc in _operand_sets(sem, rng):
        want = _numpy_semantics(sem, a, b, acc if sem.accumulate else None)
        for how, module in modules.items():
            args = [tvm.runtime.tensor(x) for x in (a, b, acc, np.zeros_like(acc))]
            module["probe"](*args)
            np.testing.assert_array_equal(args[-1].numpy(), want, err_msg=f"{name} {how}")


def test_a_row_without_semantics_is_refused_by_name():
    ll = "declare <4 x i32> @llvm.x86.made.up(<4 x i32>)\ndefine void @f() {\n  %x = call <4 x i32> @llvm.x86.made.up(<4 x i32> zeroinitializer)\n  ret void\n}\n"
    with pytest.raises(EmulationError, match="llvm.x86.made.up"):
        emulated_ir(ll)


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_every_row_runs_here(spec):
    if is_aarch64(spec) and unavailable_reason() is not None:
        pytest.skip(f"{spec.name} runs under qemu-aarch64: {unavailable_reason()}")
    assert execution_mode(spec) in ("native", "emulated", "qemu")


# ---------------------------------------------------------------- the counts, and a wrong semantics

def _vnni_kernel(spec, m=9, n=40, k=36):
    problem = QGemmProblem(m, n, k, "uint8", Epilogue("int32"))
    layout = GemmLayout.choose(problem, spec)
    lib = tvm.compile(schedule_func(build_qgemm(problem, layout), spec).mod, target=spec.tvm_target(2)).mod
    return problem, layout, lib


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
def test_replaced_calls_equal_the_instructions_in_the_real_assembly(spec):
    _, _, lib = _vnni_kernel(spec)
    _, report = load_emulated(lib)
    (name, count), = report.replaced.items()
    assert count == report.found[name] > 0
    asm = lib.inspect_source("asm")
    mnemonics = [line.split()[:2] for line in asm.splitlines() if line.startswith("\t")]
    assert count == sum(1 for words in mnemonics if "vpdpbusd" in words[:2])  # "{vex} vpdpbusd" on AVX-VNNI


def _broken(name):
    """The semantics table with ``name``'s u8 operand sign-extended (wrong for bytes >= 128)."""
    table = dict(known_semantics())
    table[name] = dataclasses.replace(table[name], a_ext="sext")
    return table


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
def test_wrong_semantics_is_caught_in_a_kernel(spec, rng):
    problem, layout, lib = _vnni_kernel(spec)
    a = rng.integers(0, 256, (problem.m, problem.k)).astype(np.uint8)
    b = rng.integers(-128, 128, (problem.k, problem.n)).astype(np.int8)
    corr = gemm_corrections(b, 0, 0, layout.a_offset)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, None)
    want = a.astype(np.int64) @ b.astype(np.int64)
    results = {}
    for label, semantics in (("right", None), ("wrong", _broken(next(iter(spec.gemm.emulation))))):
        module, _ = load_emulated(lib, semantics)
        args = [tvm.runtime.tensor(x) for x in (a, pack_weights(corr.b_signed, layout), *params, np.zeros(want.shape, np.int32))]
        module["qgemm"](*args)
        results[label] = args[-1].numpy()
    np.testing.assert_array_equal(results["right"], want)
    assert (results["wrong"] != want).mean() > 0.5


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
def test_wrong_semantics_is_caught_in_a_model(spec, rng):
    model = qlinear_matmul(16, 64, 48)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec, emulate=True)
    wrong, _ = emulated_executable(compiled._lowered, compiled.executable, spec.tvm_target(2),
                                   semantics=_broken(next(iter(spec.gemm.emulation))))
    a = rng.integers(0, 256, (16, 64)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"a": a})[0]
    np.testing.assert_array_equal(compiled(a)[0], want)
    got = tvm.relax.VirtualMachine(wrong, tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()
    assert (got != want).mean() > 0.5


# ---------------------------------------------------------------- whole models on the VNNI rows

def _compile(model, spec):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    assert compiled.execution == execution_mode(spec)
    if compiled.execution == "emulated":
        assert compiled.emulation.total > 0 and dict(compiled.emulation.replaced) == dict(compiled.emulation.found)
        asm = compiled.inspect_source("asm")  # what is inspected is still the real build
        assert "vpdpbusd" in asm
    assert any(k.intrinsic.startswith(f"lowprec_{spec.gemm.name}") for k in compiled.kernels())
    return compiled


def _qdq(fp32, shape, rng):
    return quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])


def _attention():
    from test_batched import _fp32_attention

    return _fp32_attention()


def _dynamic():
    from test_qdq_models import _quantize_dynamic

    return _quantize_dynamic(fp32_linear((6, 64), 40, op="matmul"))


def _demo():
    return onnx.load(str(resources.files("tvm_lowprec") / "data" / "demo_mlp_qdq.onnx"))


# name -> (model maker, input shape, comparison with onnx.reference)
MODELS = {
    "demo-mlp": (lambda rng: _demo(), (8, 128), "one-step"),
    "cnn": (lambda rng: _qdq(fp32_cnn((1, 3, 16, 16)), (1, 3, 16, 16), rng), (1, 3, 16, 16), "one-step"),
    "block-net": (lambda rng: _qdq(fp32_block_net((1, 8, 16, 16)), (1, 8, 16, 16), rng), (1, 8, 16, 16), "exact"),
    "attention": (lambda rng: _qdq(_attention(), (1, 32, 64), rng), (1, 32, 64), "one-step"),
    "quantize-dynamic": (lambda rng: _dynamic(), (6, 64), "close"),
}


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
@pytest.mark.parametrize("name", list(MODELS))
def test_model_on_vnni_row_matches_onnx_reference(spec, name, rng):
    make, shape, how = MODELS[name]
    model = make(rng)
    compiled = _compile(model, spec)
    reference = ReferenceEvaluator(onnx.version_converter.convert_version(model, 21))
    input_name = model.graph.input[0].name
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_matches(compiled(x)[0], reference.run(None, {input_name: x})[0], how, model)


# the cases whose kernels a target row changes: integer matmuls and convolutions, and the 8-bit
# Q/DQ (the other Q/DQ types are elementwise code that no row's intrinsic touches: test_onnx_conformance)
ROW_CASES = [c for c in load_cases() if "matmul" in c.name or "conv" in c.name
             or c.name in ("test_quantizelinear", "test_dequantizelinear", "test_dynamicquantizelinear")]


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: c.name)
def test_conformance_case_on_vnni_row(spec, case):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(case.model), target=spec)
    assert compiled.execution == execution_mode(spec)
    inputs, expected = case.data_sets[0]
    got = compiled(*[np.asarray(x) for x in inputs])
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
@pytest.mark.parametrize("case", [c for c in load_cases() if "matmul" in c.name or "conv" in c.name], ids=lambda c: c.name)
def test_conformance_case_with_constant_weights_on_vnni_row(spec, case):
    """Constant weights take the tensorized kernel: the emulated build must replace its calls."""
    from test_onnx_conformance import _bind_all_but_first

    inputs, expected = case.data_sets[0]
    model, runtime_inputs = _bind_all_but_first(case.model, inputs)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    if compiled.execution == "emulated" and any(k.op == "qgemm" for k in compiled.kernels()):
        assert compiled.emulation.total > 0
    for g, e in zip(compiled(*[np.asarray(x) for x in runtime_inputs]), expected):
        np.testing.assert_array_equal(g, np.asarray(e))


def test_claimed_conformance_cases_are_loaded():
    assert len(load_cases()) == len(CLAIMED)


# ---------------------------------------------------------------- the API around it

def test_native_and_emulated_models_agree_on_a_native_row(rng):
    model = qlinear_matmul(37, 100, 70, a_dtype="int8")
    native = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    emulated = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", emulate=True)
    assert (native.execution, emulated.execution) == ("native", "emulated")
    a = rng.integers(-128, 128, (37, 100)).astype(np.int8)
    np.testing.assert_array_equal(native(a)[0], emulated(a)[0])
    with pytest.raises(tvm_lowprec.LowPrecError, match="emulated"):
        emulated.benchmark(a)


def test_a_row_the_host_lacks_refuses_to_run_without_emulation(rng):
    avx2 = tvm_lowprec.registered_targets()["x86-avx2"]
    foreign = dataclasses.replace(avx2, name="x86-avx2-plus-imaginary", features=("avx2", "imaginary-feature"))
    assert execution_mode(foreign) == "emulated"
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(4, 32, 16)), target=foreign, emulate=False)
    assert compiled.execution == "none"
    with pytest.raises(tvm_lowprec.LowPrecError, match="imaginary-feature"):
        compiled(rng.integers(0, 256, (4, 32)).astype(np.uint8))


def test_cli_targets_says_how_each_row_runs_here(capsys):
    from tvm_lowprec.cli import main

    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for spec in TARGETS:
        line = next(l for l in out.splitlines() if l.startswith(spec.name + " "))
        assert execution_mode(spec) in line.split()


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_cli_runs_the_demo_model_on_every_row(spec, capsys):
    from tvm_lowprec.cli import main

    assert main(["run", "--target", spec.name, "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert any(f"{r.intrin.name}_" in out for r in spec.recipes())  # the intrinsic column (prefix dropped)
    if is_aarch64(spec):  # a cross-compiled model runs on a board (qemu or real), not in this process
        assert "compiled only" in out and "export_library" in out
        return
    line = next(l for l in out.splitlines() if "graph as written" in l)
    assert float(line.rsplit(":", 1)[1]) == 0.0  # the same numbers as ORT's unfused QDQ graph
    assert ("no timing" in out) == (execution_mode(spec) == "emulated")
