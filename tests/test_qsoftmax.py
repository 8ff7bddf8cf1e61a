"""The softmax of 8-bit scores as one 8-bit-in, 8-bit-out kernel (tvm_lowprec.quant.qsoftmax): integer
row maximum, a 256-entry exponential table, float32 sum, division and QuantizeLinear rounding.
Compared with onnx.reference running DequantizeLinear -> Softmax -> QuantizeLinear as written."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec

ONNX_TYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def qdq_softmax(shape, in_dtype="uint8", scale=0.11, zero_point=131, out_dtype="uint8", axis=-1):
    zy, sy = (0, 1 / 256) if out_dtype == "uint8" else (-128, 1 / 256)
    inits = [numpy_helper.from_array(np.float32(scale), "sx"), numpy_helper.from_array(np.array(zero_point, in_dtype), "zx"),
             numpy_helper.from_array(np.float32(sy), "sy"), numpy_helper.from_array(np.array(zy, out_dtype), "zy")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("Softmax", ["xf"], ["p"], axis=axis),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "qsoftmax", [helper.make_tensor_value_info("x", ONNX_TYPE[in_dtype], shape)],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[out_dtype], shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])  # onnx.reference's DQ: 19+
    model.ir_version = 10
    return model


CASES = {
    "attention-scores": dict(shape=(1, 12, 16, 128)),
    "odd-row-length": dict(shape=(3, 37)),
    "int8-in-int8-out": dict(shape=(2, 9, 24), in_dtype="int8", zero_point=-5, out_dtype="int8"),
    "sharp": dict(shape=(4, 64), scale=0.9),  # most rows put nearly all mass on one entry
}


@pytest.mark.parametrize("name", list(CASES))
def test_quantized_softmax_is_one_kernel_within_one_step_of_onnx(name, rng):
    cfg = CASES[name]
    model = qdq_softmax(**cfg)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = compiled.kernels()
    assert [k.op for k in kernels] == ["qsoftmax"] and kernels[0].schedule == "default"
    info = np.iinfo(cfg.get("in_dtype", "uint8"))
    x = rng.integers(info.min, info.max + 1, cfg["shape"]).astype(info.dtype)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (diff.max(), (diff == 0).mean())
    assert len(np.unique(got)) > 5


def test_softmax_over_another_axis_stays_float():
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq_softmax((4, 8, 16), axis=1)), target="native")
    assert "qsoftmax" not in [k.op for k in compiled.kernels()]
