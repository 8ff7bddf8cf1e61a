"""The constant folder (tvm_lowprec/quant/fold_constants.py): constant kernels evaluated once, built by
``tvm.compile`` for the model's own target (never Relax FoldConstant's generic-LLVM build, which can
abort the process), to the values Relax's folder gives."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_lowprec.quant import fold_constants as fc
from tvm_lowprec.quant.legalize import LEGALIZE
from tvm_lowprec.targets import resolve_target


def _anchor_module():
    """A YOLO-style anchor grid from constants alone (range, cast to float64 and back, +0.5, times the
    stride, quantized), an int64 product, and one value that reads the input (kept)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2100,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            grid = bb.emit(relax.op.arange(0, 2100, 1, "int64"))
            wide = bb.emit(relax.op.astype(grid, "float64"))
            centre = bb.emit(relax.op.astype(relax.op.add(wide, relax.const(0.5, "float64")), "float32"))
            scaled = bb.emit(relax.op.multiply(centre, relax.const(np.float32(8.0))))
            q = bb.emit(relax.op.quantize(scaled, relax.const(np.float32(70.0)), relax.const(np.uint8(0)), -1, "uint8"))
            big = bb.emit(relax.op.multiply(grid, relax.const(np.int64(1 << 33), "int64")))
            out = bb.emit_output(relax.Tuple([relax.op.add(x, scaled), q, big]))
        bb.emit_func_output(out)
    return bb.get()


def _constants(mod):
    return [b.value.value.numpy() for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, tvm.ir.expr.Constant)]


def test_constant_kernels_fold_to_their_values_keeping_their_dtypes():
    spec = resolve_target("native")
    with spec.tvm_target(1):
        legalized = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE)(_anchor_module())
        ours = fc.fold_constants_module(legalized)
    folded = {(str(a.dtype), a.shape): a for a in _constants(ours)}
    grid = np.arange(2100, dtype=np.int64)
    scaled = ((grid.astype(np.float64) + 0.5).astype(np.float32) * np.float32(8.0)).astype(np.float32)
    want = {"int64": grid * (1 << 33), "float64": grid.astype(np.float64) + 0.5,  # the last of each dtype
            "uint8": np.clip(np.rint(scaled / np.float32(70.0)), 0, 255).astype(np.uint8)}
    for dtype, value in want.items():
        np.testing.assert_array_equal(folded[(dtype, (2100,))], value)
    # what reads the input stays a kernel call
    calls = [b.value for b in ours["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.same_as(fc.CALL_TIR)]
    assert len(calls) == 1


def test_constant_kernels_are_built_for_the_models_target(monkeypatch):
    """Built (tvm.tirx.build, machine code in a child: native_build.kernel_library) for the target in scope
    (the row's CPU and features), not a generic llvm."""
    spec = resolve_target("native")
    targets = []
    build = fc.kernel_library
    monkeypatch.setattr(fc, "kernel_library", lambda mod, target: targets.append(target) or build(mod, target))
    with spec.tvm_target(1) as scope:
        legalized = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE)(_anchor_module())
        fc.fold_constants_module(legalized)
        expected = tvm.target.Target.current()
    assert targets and all(str(t) == str(expected) for t in targets)
    assert "mcpu" in str(expected) or expected.attrs.get("mcpu")


def test_a_kernel_that_does_not_build_is_kept(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise RuntimeError("no build here")

    spec = resolve_target("native")
    with spec.tvm_target(1):
        legalized = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE)(_anchor_module())
        monkeypatch.setattr(fc, "kernel_library", refuse)
        kept = fc.fold_constants_module(legalized)
    assert len(_constants(kept)) == len(_constants(legalized))  # nothing folded, nothing raised
    assert tvm_ffi.structural_equal(kept["main"], legalized["main"])


@pytest.mark.parametrize("row", ["cuda-sm80"])
def test_a_gpu_rows_constants_are_built_for_its_host(row):
    spec = resolve_target(row)
    with spec.tvm_target(1) if hasattr(spec, "tvm_target") else tvm.target.Target(spec.target):
        target = fc.evaluation_target()
    assert target.kind.name == "llvm"
