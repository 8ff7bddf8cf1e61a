"""The public API: calling conventions, the kernel report, and errors that name the problem."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec import InputError, QuantizationParameterError, UnsupportedOperatorError

from models import qlinear_matmul


def _renamed(model, new):
    """The same model with its input renamed (ONNX names need not be identifiers)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    old = m.graph.input[0].name
    m.graph.input[0].name = new
    for node in m.graph.node:
        node.input[:] = [new if x == old else x for x in node.input]
    return m


@pytest.fixture(scope="module")
def compiled():
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(_renamed(qlinear_matmul(4, 32, 16), "input:0")), target="native")


def test_three_calling_conventions_agree(compiled, rng):
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    by_position = compiled(a)[0]
    np.testing.assert_array_equal(by_position, compiled(**{"input:0": a})[0])
    np.testing.assert_array_equal(by_position, compiled({"input:0": a})[0])
    assert isinstance(compiled(a), list)


def test_wrong_dtype_names_the_input(compiled):
    with pytest.raises(InputError, match=r"'input:0'.*dtype uint8.*float32"):
        compiled(np.zeros((4, 32), np.float32))


def test_wrong_shape_names_the_input(compiled):
    with pytest.raises(InputError, match=r"'input:0'.*\[4, 32\].*\[4, 33\]"):
        compiled(np.zeros((4, 33), np.uint8))


def test_unknown_and_missing_names(compiled):
    with pytest.raises(InputError, match="unknown input"):
        compiled(x=np.zeros((4, 32), np.uint8))
    with pytest.raises(InputError, match="takes 1 input"):
        compiled()


@pytest.mark.host_dependent
def test_kernel_report_names_the_intrinsic(compiled):
    rows = compiled.kernels()
    gemm = [r for r in rows if r.op == "qgemm"]
    assert len(gemm) == 1
    assert gemm[0].shape == (4, 16, 32)
    # the kernel runs on one of the native row's recipes (an AVX2 or AVX-512BW host's bounded vpmaddubsw
    # where the weights allow it, else its exact GEMM), and reports that recipe's intrinsic
    by_intrinsic = {}
    for recipe in compiled.spec.recipes():
        for operand in recipe.intrin.a_operands.values():
            by_intrinsic.update({name: recipe.intrin for name in (operand.intrin, operand.intrin_wide_b) if name})
    assert gemm[0].intrinsic in by_intrinsic, (gemm[0].intrinsic, sorted(by_intrinsic))
    assert set(gemm[0].as_row()) == {"name", "op", "intrinsic", "shape", "schedule"}
    assert gemm[0].schedule == "default"  # no tuning records for this kernel
    mnemonic = by_intrinsic[gemm[0].intrinsic].name.split("_")[0]
    assert mnemonic in compiled.inspect_source("asm")


@pytest.mark.parametrize("target", ["x86-avx512-vnni", "x86-avx-vnni"])
def test_vnni_targets_emit_vpdpbusd_for_a_whole_model(target):
    """Code generation only: runs on hosts without VNNI too."""
    c = tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(16, 64, 32)), target=target)
    asm = c.inspect_source("asm")
    register = "zmm" if target == "x86-avx512-vnni" else "ymm"
    assert any("vpdpbusd" in line and register in line for line in asm.splitlines())
    if target == "x86-avx-vnni":  # AVX-VNNI CPUs have no EVEX: the VEX encoding or SIGILL
        assert all(line.split()[0] == "{vex}" for line in asm.splitlines() if "vpdpbusd" in line)
    operand = c.spec.gemm.operand("uint8")
    assert [r.intrinsic for r in c.kernels() if r.op == "qgemm"] in ([operand.intrin], [operand.intrin_wide_b])


def test_unsupported_operator_is_named_with_its_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], name="conv_7")
    node2 = helper.make_node("FancyOp", ["y"], ["z"], name="fancy", domain="com.example")
    graph = helper.make_graph([node, node2], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperatorError) as err:
        tvm_lowprec.from_onnx(model)
    assert "DeformConv" in str(err.value) and "conv_7" in str(err.value)
    assert "com.example::FancyOp" in str(err.value) and "fancy" in str(err.value)


def test_zero_scale_is_reported():
    model = qlinear_matmul(4, 32, 16)
    for init in model.graph.initializer:
        if init.name == "sb":
            init.CopyFrom(numpy_helper.from_array(np.float32(0.0), "sb"))
    with pytest.raises(QuantizationParameterError, match="scale must be finite and positive"):
        tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")


def test_missing_file_and_wrong_type():
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        tvm_lowprec.from_onnx("nope.onnx")
    with pytest.raises(TypeError, match="ModelProto or a path"):
        tvm_lowprec.from_onnx(42)


def test_bad_requant_mode():
    with pytest.raises(ValueError, match="requant_mode"):
        tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(4, 32, 16)), requant_mode="banker")


@pytest.mark.host_dependent
def test_profile_times_every_kernel(compiled, rng):
    if compiled.execution != "native":  # a simulated host whose row this CPU lacks (--host-features spr, ...)
        with pytest.raises(tvm_lowprec.LowPrecError, match="runs emulated on this host"):
            compiled.profile(rng.integers(0, 256, (4, 32)).astype(np.uint8), repeat=3)
        return
    rows = compiled.profile(rng.integers(0, 256, (4, 32)).astype(np.uint8), repeat=3)
    assert {r["name"] for r in rows} == {k.name for k in compiled.kernels()}
    assert all(r["ms"] > 0 for r in rows) and abs(sum(r["share"] for r in rows) - 1) < 1e-6
    # GEMM kernels count 2·M·N·K integer operations per call; the others have no GOPS
    for r in rows:
        info = next(k for k in compiled.kernels() if k.name == r["name"])
        if r["op"] == "qgemm":
            m, n, k = info.shape
            assert info.ops == 2 * m * n * k and r["gops"] == pytest.approx(info.ops * r["calls"] / r["ms"] / 1e6)
        else:
            assert info.ops is None and r["gops"] is None
    assert any(r["op"] == "qgemm" for r in rows)


def test_cli_runs_the_shipped_demo_model(capsys):
    from tvm_lowprec.cli import main

    assert main(["run", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "qgemm" in out and "onnxruntime" in out and "max |tvm-lowprec - onnxruntime, graph as written" in out
    line = next(l for l in out.splitlines() if "graph as written" in l)
    assert float(line.rsplit(":", 1)[1]) == 0.0  # the same numbers as ORT's unfused QDQ graph


def test_dynamic_dimension_is_reported_with_the_fix(rng):
    """A dynamic row count keeps the integer GEMM (its M known at run time); the warning names the
    fix for the kernels that need static shapes."""
    model = qlinear_matmul(4, 32, 16)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.warns(UserWarning, match=r"input 'a' has dynamic dimension.*shape_dict=\{'a'"):
        c = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    fixed = tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"a": [4, 32]}), target="native")
    assert [k.op for k in fixed.kernels()].count("qgemm") == 1 and [k.op for k in c.kernels()].count("qgemm") == 1
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    np.testing.assert_array_equal(c(a), fixed(a))


def test_clip_with_constant_bounds_imports_as_relax_clip(rng):
    """Constant Clip bounds become relax.clip (readable by the rewrite and calibration); a NaN bound
    (unbounded, in ONNX) keeps TVM's own form. Both compute ONNX's Clip."""
    import tvm
    from onnx import TensorProto, helper, numpy_helper
    from tvm import relax

    def model(lo, hi):
        inits = [numpy_helper.from_array(np.float32(lo), "lo"), numpy_helper.from_array(np.float32(hi), "hi")]
        graph = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "clip",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    x = (rng.standard_normal((4, 8)) * 5).astype(np.float32)
    for lo, hi, relax_clip in ((0.0, 6.0, True), (np.nan, 2.0, False)):
        mod = tvm_lowprec.from_onnx(model(lo, hi))
        ops = []
        relax.analysis.post_order_visit(mod["main"], lambda e: ops.append(e.op.name) if isinstance(e, relax.Call)
                                        and isinstance(e.op, tvm.ir.Op) else None)
        assert ("relax.clip" in ops) == relax_clip
        want = np.minimum(np.maximum(x, -np.inf if np.isnan(lo) else lo), hi)
        np.testing.assert_array_equal(tvm_lowprec.compile(mod)(x)[0], want)


@pytest.mark.host_dependent
def test_every_listed_kernel_runs(rng):
    """``Compiled.kernels()`` lists the kernels a model calls, no more: TVM's lowering turns a call of
    a reshape kernel into a view and leaves the kernel behind (``pipeline.drop_unused_kernels`` drops
    it, so LLVM no longer compiles it either). A quantized CNN with Flatten, Resize and Concat."""
    from models import fp32_block_net, quantize_qdq
    from reference import kernel_calls

    from tvm_lowprec.pipeline import drop_unused_kernels

    shape = (1, 8, 16, 16)
    qdq = quantize_qdq(fp32_block_net(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    if compiled.execution != "native":
        pytest.skip("kernel calls are counted by running the model natively")
    calls = kernel_calls(compiled, rng.standard_normal(shape).astype(np.float32))
    assert {k.name for k in compiled.kernels()} == set(calls)
    # the pass itself: a module whose main calls one of two kernels keeps that one
    import tvm
    from tvm.script import ir as I, relax as R, tirx as T

    @I.ir_module
    class Module:
        @T.prim_func
        def used(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
            for i in range(4):
                y[i] = x[i]

        @T.prim_func
        def unused(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
            for i in range(4):
                y[i] = x[i] + T.float32(1)

        @R.function
        def main(x: R.Tensor((4,), "float32")):
            cls = Module
            y = R.call_tir(cls.used, (x,), R.Tensor((4,), "float32"))
            return y

    kept = drop_unused_kernels(Module)
    assert {gv.name_hint for gv in kept.get_global_vars()} == {"main", "used"}
    assert isinstance(kept["used"], tvm.tirx.PrimFunc)
