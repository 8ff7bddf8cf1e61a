"""1-D convolutions (Whisper's, wav2vec2's, TCNs') on the integer kernels: as 2-D convolutions of height
one (tvm_lowprec/frontend/conv1d.py), exact against ONNX Runtime's QDQ graph and the FP32 model's values."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.frontend.conv1d import conv1d_as_conv2d

from models import quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale

# (name, channels in, length, [(out channels, kernel, stride, pad, dilation, group)...]): Whisper's
# front end (k3, then k3 stride 2, GELU between), a dilated TCN layer, a grouped one, a pointwise one
CASES = [
    ("whisper", 16, 40, [(32, 3, 1, 1, 1, 1), (32, 3, 2, 1, 1, 1)]),
    ("dilated", 8, 33, [(16, 3, 1, 2, 2, 1)]),
    ("pointwise", 24, 17, [(8, 1, 1, 0, 1, 1)]),
    ("depthwise", 16, 20, [(16, 5, 1, 2, 1, 16)]),
]


def conv1d_model(channels, length, layers, seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, cur, c = [], [], "x", channels
    for i, (out, k, stride, pad, dilation, group) in enumerate(layers):
        w = (rng.standard_normal((out, c // group, k)) / np.sqrt(c // group * k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(rng.standard_normal(out).astype(np.float32) * 0.1, f"b{i}")]
        nodes += [helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k], strides=[stride],
                                   pads=[pad, pad], dilations=[dilation], group=group),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        cur, c = f"r{i}", out
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name, channels, length, layers", CASES, ids=[c[0] for c in CASES])
def test_a_quantized_conv1d_runs_on_the_integer_kernels(name, channels, length, layers, rng):
    fp32 = conv1d_model(channels, length, layers)
    shape = (1, channels, length)
    qdq = quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    kernels = compiled.kernels()
    integer = [k for k in kernels if k.name.startswith(("qconv2d", "qdepthwise", "qgemm"))]
    assert len(integer) >= len(layers), [k.name for k in kernels]
    assert not any("conv1d" in k.name for k in kernels), [k.name for k in kernels]
    session = ort_session(qdq, optimized=False)
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq))


def test_the_rewrite_keeps_the_graphs_values(rng):
    """FP32: the rewritten graph computes what the original does (ONNX Runtime on both)."""
    fp32 = conv1d_model(16, 40, CASES[0][3])
    rewritten = conv1d_as_conv2d(fp32)
    assert [n.op_type for n in rewritten.graph.node].count("Conv") == 2
    inits = {t.name: t for t in rewritten.graph.initializer}
    assert all(len(inits[n.input[1]].dims) == 4 for n in rewritten.graph.node if n.op_type == "Conv")
    x = rng.standard_normal((1, 16, 40)).astype(np.float32)
    want, = ort_session(fp32).run(None, {"x": x})
    got, = ort_session(rewritten).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
