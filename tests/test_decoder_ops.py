"""ONNX Runtime's decoder operators as ORT GenAI's model builder writes them (issue: language models
with 4-bit weights): SimplifiedLayerNormalization (ONNX domain),
com.microsoft.SkipSimplifiedLayerNormalization and com.microsoft.RotaryEmbedding, against a numpy
reference of ORT's definition and against ONNX Runtime itself."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from reference import ort_session

H = 64
EPS = 1e-6


def _rms(x, gamma):
    """ORT's definition: x / sqrt(mean(x^2 over the last axis) + epsilon) * gamma, in float64 here."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS) * gamma.astype(np.float64)


def _model(bias: bool):
    rng = np.random.default_rng(0)
    gamma = rng.standard_normal(H).astype(np.float32)
    beta = (rng.standard_normal(H) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(gamma, "gamma")] + ([numpy_helper.from_array(beta, "bias")] if bias else [])
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["normed"], axis=-1, epsilon=EPS, stash_type=1),
        helper.make_node("SkipSimplifiedLayerNormalization", ["normed", "skip", "gamma"] + (["bias"] if bias else []),
                         ["y", "", "", "residual"], domain="com.microsoft", epsilon=EPS),
    ]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 5, H])  # noqa: E731
    graph = helper.make_graph(nodes, "rms", [value("x"), value("skip")], [value("y"), value("residual")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model, gamma, beta if bias else np.zeros(H, np.float32)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_rms_norms_match_ort_definition_and_ort(bias):
    model, gamma, beta = _model(bias)
    rng = np.random.default_rng(1)
    x, skip = (rng.standard_normal((2, 5, H)).astype(np.float32) for _ in range(2))
    y, residual = (np.asarray(o) for o in tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")(x, skip))

    normed = _rms(x, gamma)
    want_residual = normed + skip + beta
    np.testing.assert_allclose(residual, want_residual, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, _rms(want_residual, gamma), rtol=1e-5, atol=1e-5)

    ort_y, ort_residual = ort_session(model).run(None, {"x": x, "skip": skip})
    np.testing.assert_allclose(y, ort_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(residual, ort_residual, rtol=1e-5, atol=1e-5)


def test_another_contrib_operator_is_still_named():
    model, _, _ = _model(True)
    model.graph.node.append(helper.make_node("GroupQueryAttention", ["y"], ["z"], domain="com.microsoft"))
    with pytest.raises(tvm_lowprec.UnsupportedOperatorError, match="com.microsoft::GroupQueryAttention"):
        tvm_lowprec.from_onnx(model)


def _rotary_model(shape, positions_shape, interleaved: int, rotary_dim: int, heads: int, max_seq: int = 32):
    rng = np.random.default_rng(2)
    half = (rotary_dim or (shape[-1] // heads if len(shape) == 3 else shape[-1])) // 2
    angles = rng.random((max_seq, half)) * np.pi
    caches = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
              numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rotary_dim, num_heads=heads)  # ORT wants num_heads
    node = helper.make_node("RotaryEmbedding", ["x", "positions", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "rotary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                                                 helper.make_tensor_value_info("positions", TensorProto.INT64, list(positions_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], caches)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("shape,positions,interleaved,rotary_dim", [
    ((2, 5, 4 * 16), (2, 5), 0, 0),   # 3-D [batch, seq, heads * head], halves rotated
    ((2, 5, 4 * 16), (2, 5), 1, 0),   # neighbours rotated
    ((1, 3, 5, 16), (1, 5), 0, 8),    # 4-D [batch, heads, seq, head], half the head rotated
    ((1, 7, 2 * 16), (1,), 1, 0),     # one start position (a decode step's offset)
], ids=["3d-halves", "3d-interleaved", "4d-partial", "start-position"])
def test_rotary_embedding_matches_ort(shape, positions, interleaved, rotary_dim):
    heads = shape[1] if len(shape) == 4 else shape[-1] // 16
    model = _rotary_model(shape, positions, interleaved, rotary_dim, heads)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    seq = shape[1] if len(shape) == 3 else shape[2]
    pos = (np.array([9]) if positions == (1,) else rng.integers(0, 32 - seq, positions)).astype(np.int64)
    got = np.asarray(tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")(x, pos)[0])
    want = ort_session(model).run(None, {"x": x, "positions": pos})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
