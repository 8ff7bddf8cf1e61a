"""4-bit (and 8-bit) weight-only models from ONNX Runtime's own ``MatMulNBitsQuantizer``: its
``com.microsoft.MatMulNBits`` (QOperator) and its QDQ form (a blocked ``uint4``/``int4``
DequantizeLinear before a MatMul), against ORT on the same model and against a numpy model of the
weights ORT defines."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.errors import UnsupportedOperatorError
from tvm_lowprec.frontend.matmul_nbits import unpack

quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")


def _fp32_model(rng, m=5, k=96, n=40, bias=False):
    w = rng.standard_normal((k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm" if bias else "y"])]
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["y"]))
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _quantized(model, block, symmetric, qdq=False, bits=4):
    from onnxruntime.quantization import QuantFormat

    q = quantizer.MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=symmetric,
                                       quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
    q.process()
    return q.model.model


def _ort(model, x):
    """ORT as written: graph optimizations off, or it fuses the QDQ form's DequantizeLinear + MatMul
    into a MatMulNBits that quantizes the activations to int8 (measured: 0.13 off at K = 96)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _numpy_weights(model):
    """W [K, N] as ORT's contrib operator defines it: ``(q - zp) * scale`` per block, in float32."""
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = attrs["K"], attrs["N"], attrs.get("bits", 4), attrs["block_size"]
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kb = -(-k // block)
    q = unpack(consts[node.input[1]].reshape(n, kb, -1), bits, block).reshape(n, -1)[:, :k].astype(np.float32)
    scale = consts[node.input[2]].reshape(n, kb).repeat(block, axis=1)[:, :k]
    if len(node.input) > 3 and node.input[3]:
        zp = unpack(consts[node.input[3]].reshape(n, -1), bits, kb).astype(np.float32)
    else:
        zp = np.full((n, kb), 2 ** (bits - 1), np.float32)
    return ((q - zp.repeat(block, axis=1)[:, :k]) * scale).T


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("form", ["MatMulNBits", "QDQ"])
def test_ort_quantized_model_matches_ort_and_the_numpy_model(block, symmetric, form, rng):
    model = _quantized(_fp32_model(rng, k=256 if block == 128 else 96, bias=True), block, symmetric, qdq=form == "QDQ")
    assert any(n.op_type == ("MatMulNBits" if form == "MatMulNBits" else "DequantizeLinear") for n in model.graph.node)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    for _ in range(2):
        x = rng.standard_normal((5, 256 if block == 128 else 96)).astype(np.float32)
        got, want = compiled(x)[0], _ort(model, x)
        # float32 sums in another order: the difference is a few ulps of the sum of |x w| terms
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        if form == "MatMulNBits":
            b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "b"))
            exact = x.astype(np.float64) @ _numpy_weights(model).astype(np.float64) + b
            np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4)


def test_eight_bit_blocks_and_unpacking(rng):
    model = _quantized(_fp32_model(rng), 32, False, bits=8)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x = rng.standard_normal((5, 96)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], _ort(model, x), rtol=1e-5, atol=1e-4)
    packed = np.array([[0x21, 0x43, 0xF5]], np.uint8)
    np.testing.assert_array_equal(unpack(packed, 4, 5), [[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(unpack(packed, 8, 2), [[0x21, 0x43]])


def test_runtime_weights_are_refused_with_the_node_named(rng):
    model = _quantized(_fp32_model(rng), 32, True)
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    node = next(n for n in bad.graph.node if n.op_type == "MatMulNBits")
    weights = next(t for t in bad.graph.initializer if t.name == node.input[1])
    bad.graph.input.append(helper.make_tensor_value_info(weights.name, TensorProto.UINT8, list(weights.dims)))
    bad.graph.initializer.remove(weights)
    with pytest.raises(UnsupportedOperatorError, match="MatMulNBits .*must be initializers"):
        tvm_lowprec.from_onnx(bad)
