"""Bilinear resize as two 1-D passes over tables (kernels/resize.py, legalized in quant/legalize.py,
scheduled by schedule/resize.py): against ONNX Runtime on float models for every coordinate mode it
takes, and on the Q/DQ pattern of a segmentation head (DeepLabV3's 8x upsampling of its logits)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.kernels.resize import MODES, OP, axis_tables

from reference import ort_session


def _resize_model(shape, out_hw, mode, qdq=False):
    """x -> [Q/DQ ->] Resize(linear, sizes) [-> Q/DQ] -> y, NCHW."""
    sizes = np.array([*shape[:2], *out_hw], np.int64)
    inits = [numpy_helper.from_array(sizes, "sizes"), numpy_helper.from_array(np.float32(0.02), "s"),
             numpy_helper.from_array(np.array(100, np.uint8), "z")]
    nodes, src, out = [], "x", "y"
    if qdq:
        nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"])]
        src, out = "xd", "r"
    nodes.append(helper.make_node("Resize", [src, "", "", "sizes"], [out], mode="linear",
                                  coordinate_transformation_mode=mode))
    if qdq:
        nodes += [helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
                  helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


CASES = {
    "upsample-8x": ((1, 5, 20, 20), (160, 160)),
    "upsample-2x-rect": ((2, 3, 7, 9), (14, 18)),
    "fractional-up": ((1, 4, 10, 12), (33, 17)),
    "downsample": ((1, 2, 30, 24), (11, 8)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_resize_matches_onnx_runtime(case, mode, rng):
    shape, out_hw = CASES[case]
    model = _resize_model(shape, out_hw, mode)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert [k.op for k in compiled.kernels()].count(OP) == 1
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort_session(model, optimized=False).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.shape == want.shape
    # ONNX Runtime computes the source coordinate in another order (align_corners: x * (in - 1) / (out - 1)
    # against TVM's (in - 1) / (out - 1) * x): an ulp of a coordinate moves a value by up to 1e-5 here,
    # a pixel's worth of error would move it by about 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-5)


def test_quantized_upsampling_within_one_step_of_onnx_runtime(rng):
    """The rounding of float32 interpolation may put a value on the other side of a quantization
    boundary than ONNX Runtime's formula does: one step, on a few values."""
    model = _resize_model((1, 21, 20, 20), (160, 160), "half_pixel", qdq=True)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert OP in [k.op for k in compiled.kernels()]
    x = rng.standard_normal((1, 21, 20, 20)).astype(np.float32)
    want = ort_session(model, optimized=False).run(None, {"x": x})[0]
    steps = np.abs(compiled(x)[0] - want) / np.float32(0.02)
    assert steps.max() <= 1.0001 and (steps > 0.5).mean() < 0.05


@pytest.mark.parametrize("mode", MODES)
def test_axis_tables_follow_the_onnx_coordinate_formula(mode):
    """Indices and weights against ONNX's definition in float64 (within float32's rounding)."""
    in_n, out_n = 7, 19
    i0, i1, w0, w1 = axis_tables(in_n, out_n, mode)
    o = np.arange(out_n, dtype=np.float64)
    ratio = in_n / out_n
    c = {"half_pixel": (o + 0.5) * ratio - 0.5, "pytorch_half_pixel": (o + 0.5) * ratio - 0.5,
         "align_corners": o * (in_n - 1) / (out_n - 1), "asymmetric": o * ratio}[mode]
    base = np.floor(c)
    np.testing.assert_array_equal(i0, np.clip(base, 0, in_n - 1))
    np.testing.assert_array_equal(i1, np.clip(base + 1, 0, in_n - 1))
    np.testing.assert_allclose(w1, c - base, atol=1e-6)
    np.testing.assert_array_equal(w0, np.float32(1) - w1)
