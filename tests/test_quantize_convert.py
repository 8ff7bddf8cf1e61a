"""A quantize on a CPU row (quant/legalize.legalize_quantize, kernels/qgemm.quantize_linear): clamped
to ``[qmin - zp, qmax - zp]``, converted in one instruction (``TargetSpec.round_to_int``, the row's
``vector_convert`` in its assembly, no separate rounding on x86), the zero point added to the integer;
the same codes as ONNX's ``clamp(rint(x / s) + zp)`` on every CPU row, ties, infinities, values far out
of range and NaN (to the zero point) included. Clamps a value cannot reach are left out."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax, te

from tvm_lowprec.kernels.qgemm import quantize_linear
from tvm_lowprec.quant.legalize import LEGALIZE
from tvm_lowprec.schedule import schedule_func

from conftest import TARGETS
from reference import intrinsic_free_module

CPU_ROWS = [spec for spec in TARGETS if spec.device == "cpu"]
SHAPE = (2, 8, 64)
PARAMS = {"uint8-zp128": (0.02, 128, "uint8"), "int8-zp-3": (0.37, -3, "int8"), "uint8-zp0": (1.0, 0, "uint8")}


def _quantize_func(spec, scale, zero_point, dtype):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        q = bb.emit(relax.op.quantize(x, relax.const(np.float32(scale)), relax.const(np.array(zero_point, dtype)),
                                      axis=-1, out_dtype=dtype))
        bb.emit_func_output(q)
    with spec.tvm_target(1):
        mod = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE)(bb.get())
    return next(f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)).with_attr("global_symbol", "main")


def _inputs(scale, rng):
    x = (rng.standard_normal(SHAPE) * 200 * scale).astype(np.float32)
    flat = x.reshape(-1)
    ties = (np.arange(-40, 40) + 0.5).astype(np.float32) * np.float32(scale)  # halves: rint to even
    flat[:80] = ties
    flat[80:88] = [np.inf, -np.inf, np.nan, 1e30, -1e30, 0.0, -0.0, 3e38]
    return x


def _reference(x, scale, zero_point, dtype):
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.clip(np.rint(x / np.float32(scale)) + zero_point, info.min, info.max)
    return np.where(np.isnan(x), info.min, q).astype(dtype)  # NaN: the lowest code, as ONNX Runtime


@pytest.mark.parametrize("params", list(PARAMS))
@pytest.mark.parametrize("spec", CPU_ROWS, ids=lambda s: s.name)
def test_a_quantize_converts_once_and_equals_onnx_on_every_cpu_row(spec, params, rng):
    scale, zero_point, dtype = PARAMS[params]
    func = _quantize_func(spec, scale, zero_point, dtype)
    assert spec.round_to_int in func.script()  # the conversion, not round + cast
    sch = schedule_func(func, spec)
    lib = tvm.compile(sch.mod if sch is not None else func, target=spec.tvm_target(1)).mod
    asm = lib.inspect_source("asm")
    assert any(re.search(rf"\b{op}\b", asm) for op in spec.vector_convert), spec.vector_convert
    if spec.name.startswith("x86"):
        assert not any(re.search(rf"\b{op}\b", asm) for op in spec.vector_round)  # no separate rounding
    x = _inputs(scale, rng)
    out = tvm.runtime.tensor(np.zeros(SHAPE, dtype))
    intrinsic_free_module(lib, spec)["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), _reference(x, scale, zero_point, dtype))


def _clamps(expr) -> list[str]:
    """The clamps in ``expr``'s script, in order (``T.min``: the upper end, ``T.max``: the lower)."""
    return [m.capitalize() for m in re.findall(r"T\.(min|max)\(", str(expr))]


def test_clamps_a_value_cannot_reach_are_left_out():
    y = te.var("y", "float32")
    # probabilities in [0, 1] to uint8 codes of scale 1/255: neither end reachable
    assert _clamps(quantize_linear(y, np.float32(1 / 255), 0, 0, 255, "uint8", "llvm.lrint", bounds=(0.0, 1.0))) == []
    # a zero point above qmin keeps the lower end out of reach; 1.01 / (1/255) rounds to 258 > 255
    assert _clamps(quantize_linear(y, np.float32(1 / 255), 0, 0, 255, "uint8", "llvm.lrint", bounds=(0.0, 1.01))) == ["Min"]
    # int8 with zero point -128: codes 0..255 above it; -0.1 rounds to 0 (no clamp), -0.6 to -1 (clamped)
    assert _clamps(quantize_linear(y, 1.0, -128, -128, 127, "int8", "llvm.lrint", bounds=(-0.1, 255.0))) == []
    assert _clamps(quantize_linear(y, 1.0, -128, -128, 127, "int8", "llvm.lrint", bounds=(-0.6, 255.0))) == ["Max"]
    assert sorted(_clamps(quantize_linear(y, 0.5, 3, 0, 255, "uint8"))) == ["Max", "Min"]  # unknown range: both
