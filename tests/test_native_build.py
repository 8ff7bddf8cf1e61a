"""LLVM's back end runs in a child process (tvm_lowprec.native_build): a kernel LLVM aborts on becomes a
KernelBuildError naming it, in the library, in ``compile`` and in constant folding; the caller's process
lives on.

The aborting kernel is real: ``vpdpbusd zmm`` (an AVX-512 VNNI intrinsic) in a kernel built for an
AVX2-only CPU (``znver3``); LLVM's instruction selection stops with ``LLVM ERROR: Do not know how to
split the result of this operator!`` and SIGABRT, the message the YOLOv8n export of the zoo issue hit.
It only cross-compiles (nothing runs it), so it aborts the same way on every x86 or Arm host.
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import tirx as T

import tvm_lowprec
from tvm_lowprec import native_build
from tvm_lowprec.errors import KernelBuildError, LowPrecError
from tvm_lowprec.quant.fold_constants import fold_constants_module

pytestmark = pytest.mark.skipif(not native_build.isolated(), reason="needs os.fork and a C compiler (gcc)")

AVX2_ONLY = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "mtriple": "x86_64-linux-gnu"})


@T.prim_func(s_tir=True)
def vnni_on_avx2(a: T.Buffer((16,), "int32"), b: T.Buffer((64,), "uint8"), c: T.Buffer((64,), "int8"),
                 d: T.Buffer((16,), "int32")):
    T.func_attr({"global_symbol": "vnni_on_avx2", "tir.noalias": True})
    with T.sblock("dot"):  # a block, as every kernel Relax's legalization writes
        T.reads(a[0:16], b[0:64], c[0:64])
        T.writes(d[0:16])
        d[T.ramp(0, 1, 16)] = T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512",
                                                      a[T.ramp(0, 1, 16)], b[T.ramp(0, 1, 64)], c[T.ramp(0, 1, 64)])


@T.prim_func
def add_one(a: T.Buffer((16,), "int32"), d: T.Buffer((16,), "int32")):
    T.func_attr({"global_symbol": "add_one", "tir.noalias": True})
    for i in range(16):
        d[i] = a[i] + 1


def test_a_kernel_llvm_aborts_on_is_named_and_the_process_lives():
    mod = tvm.IRModule({"add_one": add_one, "vnni_on_avx2": vnni_on_avx2})
    with pytest.raises(KernelBuildError) as err:
        native_build.kernel_library(mod, AVX2_ONLY)
    message = str(err.value)
    assert "1 of 2 kernels" in message and "vnni_on_avx2: SIGABRT" in message
    assert "LLVM ERROR" in message  # LLVM's own words, from the child's standard error
    assert "add_one" not in message
    assert isinstance(err.value, LowPrecError)


def test_a_library_that_builds_is_loaded_from_the_childs_object_and_runs():
    llvm_module, loaded = native_build.kernel_library(tvm.IRModule({"add_one": add_one}), AVX2_ONLY)
    assert llvm_module.kind == "llvm" and loaded.kind == "library"  # machine code from the child's object
    a = np.arange(16, dtype="int32")
    d = tvm.runtime.tensor(np.zeros(16, "int32"))
    loaded["add_one"](tvm.runtime.tensor(a), d)
    np.testing.assert_array_equal(d.numpy(), a + 1)


def _relax_module(args_const: bool):
    """``main`` calling the aborting kernel: on the inputs, or on constants (constant folding's case)."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((16,), "int32"))
    with bb.function("main", [a]):
        gv = bb.add_func(vnni_on_avx2.with_attr("global_symbol", "vnni_on_avx2"), "vnni_on_avx2")
        if args_const:
            operands = [relax.const(np.ones(16, "int32")), relax.const(np.ones(64, "uint8")),
                        relax.const(np.ones(64, "int8"))]
        else:
            operands = [a, relax.const(np.ones(64, "uint8")), relax.const(np.ones(64, "int8"))]
        out = bb.emit(relax.call_tir(gv, operands, relax.TensorType((16,), "int32")))
        bb.emit_func_output(out)
    return bb.get()


def test_constant_folding_keeps_a_kernel_llvm_aborts_on():
    mod = _relax_module(args_const=True)
    with AVX2_ONLY:
        folded = fold_constants_module(mod)
    assert "vnni_on_avx2" in folded["main"].script()  # not folded: still called


def test_compile_of_a_module_with_an_aborting_kernel_raises_a_named_error():
    """The whole ``tvm_lowprec.compile`` on the x86-avx2 row (every x86-64 host of ours runs it natively,
    so its build takes the child-process path)."""
    if tvm_lowprec.execution_mode(tvm_lowprec.resolve_target("x86-avx2")) != "native":
        pytest.skip("this host does not run the x86-avx2 row natively")
    mod = _relax_module(args_const=False)
    mod["main"] = mod["main"].with_attr("lowprec.input_names", ["a"])
    with pytest.raises(KernelBuildError, match="vnni_on_avx2"):
        tvm_lowprec.compile(mod, target="x86-avx2")


def test_a_model_runs_on_the_loaded_library_and_still_shows_its_code(tmp_path):
    path = tmp_path / "relu.onnx"
    w = numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native")
    kinds = {m.kind for m in compiled._runnable.mod.imports}
    assert "library" in kinds and "llvm" not in kinds  # runs the child's machine code
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled(x=x)[0] if isinstance(compiled(x=x), list) else compiled(x=x), x, rtol=1e-6)
    assert "ret" in compiled.inspect_source("asm")  # the assembly, made in a child
    saved = tvm_lowprec.load(tvm_lowprec.save(compiled, tmp_path / "m.tlp"))
    out = saved(x=x)
    np.testing.assert_allclose(out[0] if isinstance(out, list) else out, x, rtol=1e-6)


def test_in_process_builds_on_request(monkeypatch):
    monkeypatch.setenv(native_build.IN_PROCESS_ENV, "1")
    assert not native_build.isolated()
    llvm_module, loaded = native_build.kernel_library(tvm.IRModule({"add_one": add_one}), AVX2_ONLY)
    assert loaded is llvm_module


def test_a_child_that_hangs_is_killed_at_the_timeout(monkeypatch, tmp_path):
    monkeypatch.setenv(native_build.TIMEOUT_ENV, "0.5")
    start = time.monotonic()
    ok, why = native_build.run_in_child(lambda: time.sleep(30), str(tmp_path))
    assert not ok and "killed after" in why
    assert time.monotonic() - start < 10


def test_a_python_error_in_the_child_is_reported(tmp_path):
    def fail():
        raise ValueError("no such kernel")

    ok, why = native_build.run_in_child(fail, str(tmp_path))
    assert not ok and "ValueError: no such kernel" in why
    assert os.getpid() > 0  # still here
