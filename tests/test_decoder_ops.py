"""ONNX Runtime's decoder operators as ORT GenAI's model builder writes them (issue: language models
with 4-bit weights): SimplifiedLayerNormalization (ONNX domain),
com.microsoft.SkipSimplifiedLayerNormalization, RotaryEmbedding and GroupQueryAttention (past and
present as separate tensors, rotary, packed QKV, softcap, local window), against a numpy reference of
ORT's definition or against ONNX Runtime itself."""

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
    model.graph.node.append(helper.make_node("MultiHeadAttention", ["y"], ["z"], domain="com.microsoft"))
    with pytest.raises(tvm_lowprec.UnsupportedOperatorError, match="com.microsoft::MultiHeadAttention"):
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


def _gqa_model(seq: int, past: int, packed: bool, rotary: bool, interleaved: int = 0, softcap: float = 0.0,
               window: int = -1, heads: int = 4, kv_heads: int = 2, head: int = 16, max_seq: int = 32):
    rng = np.random.default_rng(4)
    angles = rng.random((max_seq, head // 2)) * np.pi
    inits = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    f = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    kv_width = kv_heads * head
    inputs = [f("query", [1, seq, heads * head + (2 * kv_width if packed else 0)])]
    inputs += [] if packed else [f("key", [1, seq, kv_width]), f("value", [1, seq, kv_width])]
    inputs += [f("past_key", [1, kv_heads, past, head]), f("past_value", [1, kv_heads, past, head]),
               helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length"] + (["cos", "sin"] if rotary else [])
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary), rotary_interleaved=interleaved,
                            softcap=softcap, local_window_size=window)
    outputs = [f("out", [1, seq, heads * head]), f("present_key", [1, kv_heads, past + seq, head]),
               f("present_value", [1, kv_heads, past + seq, head])]
    graph = helper.make_graph([node], "gqa", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("seq,past,packed,rotary,interleaved,softcap,window", [
    (4, 3, False, True, 0, 0.0, -1),   # a few tokens after a past, rotary halves
    (1, 6, False, True, 1, 0.0, -1),   # one decode step, interleaved rotary
    (3, 4, True, False, 0, 0.0, -1),   # Q, K and V packed in the query input
    (2, 5, False, True, 0, 5.0, 3),    # softcap and a local window
], ids=["prefill-after-past", "decode-step", "packed-qkv", "softcap-window"])
def test_group_query_attention_matches_ort(seq, past, packed, rotary, interleaved, softcap, window):
    model = _gqa_model(seq, past, packed, rotary, interleaved, softcap, window)
    rng = np.random.default_rng(5)
    feed = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in model.graph.input if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    feed["seqlens_k"] = np.array([past + seq - 1], np.int32)
    feed["total_sequence_length"] = np.array(past + seq, np.int32)
    want = ort_session(model).run(None, feed)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    got = compiled(**feed)
    for name, g, w in zip(("out", "present_key", "present_value"), got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5, err_msg=name)
