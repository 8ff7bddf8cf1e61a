"""How ``relax.quantize`` is lowered (``quant/legalize.py``): without a division where the corrected
reciprocal product is proven to round as the division does, with it elsewhere; NaN to the zero point."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.quant import legalize
from tvm_lowprec.quant.legalize import CHECK_ULPS, _quotient, division_free_reciprocal
from tvm_lowprec.targets.x86 import X86_TARGETS

F32 = np.float32
SCALES = (F32(0.040776152163743973), F32(1 / 255), F32(0.0173))


@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_the_corrected_product_rounds_as_the_division_on_every_float_of_a_range(scale):
    """Every float32 x with x / s in [100.25, 140.75] and its negative (about two million inputs, forty
    rounding boundaries): round(corrected product) == round(x / s) exactly. (Run once over the whole
    range |x / s| in [0.25, 300] for the first two scales and 1/255: 170 million inputs each, none
    differ.)"""
    r = F32(1) / scale
    lo, hi = F32(100.25 * scale).view(np.int32), F32(140.75 * scale).view(np.int32)
    bits = np.arange(lo, hi, dtype=np.int32)
    for sign in (F32(1), F32(-1)):
        x = bits.view(F32) * sign
        np.testing.assert_array_equal(np.round(_quotient(x, scale, r)), np.round(x / scale))


def test_the_proof_declines_scales_it_cannot_use():
    for bad in (0.0, -0.5, float("inf"), float("nan"), 1e-39, 1e-45):
        assert division_free_reciprocal(bad, 128, 0, 255) is None, bad
    assert division_free_reciprocal(0.05, 128, 0, 255) == float(F32(1) / F32(0.05))


def _boundary_inputs(scale, zero_point):
    """Every x within CHECK_ULPS ulps of a rounding boundary that reaches the codes, and specials."""
    k = np.arange(-zero_point - 2, 256 - zero_point + 2) + 0.5
    centre = (k * np.float64(scale)).astype(F32).view(np.int32)
    steps = np.arange(-CHECK_ULPS, CHECK_ULPS + 1, dtype=np.int32)
    x = (centre[:, None] + np.where(centre[:, None] < 0, -steps, steps)).reshape(-1).view(F32)
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, -3e38, 1e-42, 1e30], F32)
    return np.concatenate([x, specials, np.random.default_rng(0).standard_normal(4096).astype(F32) * 8])


def _quantize_model(n, scale, zero_point):
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [n])],
        [numpy_helper.from_array(np.array(scale, F32), "s"), numpy_helper.from_array(np.array(zero_point, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def _reference(x, scale, zero_point):
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.clip(np.round(x / scale) + zero_point, 0, 255)
    return np.where(np.isnan(x), zero_point, q).astype(np.uint8)


@pytest.mark.parametrize("target", [t.name for t in X86_TARGETS], ids=str)
def test_a_quantize_kernel_has_no_division_and_gives_the_divisions_codes(target):
    """An image's QuantizeLinear on every x86 row: no vdivps in the kernel, fused multiply-adds in vectors,
    and on every input near a rounding boundary (and infinities, NaN, signed zeros, huge and tiny
    values) the codes of the division, NaN to the zero point."""
    scale, zero_point = SCALES[0], 131
    x = _boundary_inputs(scale, zero_point)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_quantize_model(x.size, scale, zero_point)), target=target)
    asm = compiled.inspect_source("asm")
    assert "vdivps" not in asm and "vdivss" not in asm
    assert len(re.findall(r"\tvfn?madd\d+ps\t", asm)) >= 2  # the residual and the correction, in vectors
    if compiled.execution == "none":
        return
    np.testing.assert_array_equal(compiled(x)[0], _reference(x, scale, zero_point))


def test_a_scale_the_proof_declines_keeps_the_division(monkeypatch):
    monkeypatch.setattr(legalize, "division_free_reciprocal", lambda *args: None)
    scale, zero_point = SCALES[1], 0
    x = _boundary_inputs(scale, zero_point)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_quantize_model(x.size, scale, zero_point)), target="x86-avx2")
    assert "vdivps" in compiled.inspect_source("asm")
    if compiled.execution != "none":
        np.testing.assert_array_equal(compiled(x)[0], _reference(x, scale, zero_point))
