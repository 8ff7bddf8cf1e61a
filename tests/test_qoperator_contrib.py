"""ONNX Runtime's QOperator format: ``quantize_static(..., QuantFormat.QOperator)`` writes QLinearConv
and its ``com.microsoft`` contrib operators around it (QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSoftmax, QGemm), which
frontend/qoperator.py rewrites into the Q/DQ form: compiled, they match ONNX Runtime running the same
file within one step (its contrib kernels round some products in float32 where ours keep the Q/DQ
graph's order)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.frontend.qoperator import CONTRIB_REWRITES

from models import quantize_qdq
from reference import ort_session


def _contrib_cnn(rng):
    """conv -> SiLU (Sigmoid, Mul) -> + residual -> LeakyRelu -> [avg pool | global pool broadcast]
    concat -> conv -> softmax over channels."""
    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w1", (8, 3, 3, 3)), w("b1", (8,)), w("w2", (8, 16, 1, 1)), w("b2", (8,)), w("fc", (10, 8)), w("fcb", (10,))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["silu"]),
        helper.make_node("Add", ["silu", "c1"], ["res"]),
        helper.make_node("LeakyRelu", ["res"], ["lr"], alpha=0.1),
        helper.make_node("AveragePool", ["lr"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("GlobalAveragePool", ["lr"], ["gp"]),
        helper.make_node("Mul", ["lr", "gp"], ["scaled"]),
        helper.make_node("Concat", ["ap", "scaled"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["c2"]),
        helper.make_node("Softmax", ["c2"], ["y"], axis=-1),
        helper.make_node("GlobalAveragePool", ["c2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_qoperator_contrib_model_matches_onnx_runtime(activations, rng):
    from onnxruntime.quantization import QuantFormat, QuantType

    samples = [rng.standard_normal((1, 3, 12, 12)).astype(np.float32) for _ in range(8)]
    act = QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8
    # 7-bit weights: ORT runs a QOperator file's QLinearConv/QGemm with its own kernels even unoptimized, and its
    # u8s8 kernel saturates pairs of full-range weight products on CPUs without VNNI (AVX2: 11 steps off)
    model = quantize_qdq(_contrib_cnn(rng), samples, quant_format=QuantFormat.QOperator, activation_type=act,
                         reduce_range=True)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat"} <= contrib, contrib
    assert contrib <= set(CONTRIB_REWRITES)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert any(k.name.startswith("qconv2d") for k in compiled.kernels())
    assert "QGemm" in contrib
    session = ort_session(model, optimized=False)
    steps = []
    for name in ("y", "logits"):
        (last,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == name]
        steps.append(float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last.input[1]))))
    for _ in range(3):
        x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
        for got, want, step in zip(compiled(x), session.run(None, {"x": x}), steps):
            assert got.shape == want.shape and len(np.unique(want)) > 5
            assert np.abs(got - want).max() <= step * 1.001 and (got == want).mean() > 0.9  # exact on Zen 4


def test_a_contrib_operator_without_an_onnx_form_is_named():
    """A channels-last pool has no ONNX counterpart: kept, and the importer names it."""
    from tvm_lowprec.errors import UnsupportedOperatorError

    inits = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.array(3, np.uint8), "z")]
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                            channels_last=1, name="gap_nhwc")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperatorError, match="gap_nhwc"):
        tvm_lowprec.from_onnx(model)


def test_a_malformed_contrib_node_is_named_not_rewritten():
    """A QGemm with its scales missing is not a model we can rewrite: named, never an internal error."""
    from tvm_lowprec.errors import UnsupportedOperatorError

    node = helper.make_node("QGemm", ["a"], ["y"], domain="com.microsoft", name="broken_gemm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperatorError, match="broken_gemm"):
        tvm_lowprec.from_onnx(model)
