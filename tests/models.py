"""Small ONNX models for tests, made here with fixed seeds (never downloaded, never committed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reference import for_ort


def fp32_linear(shape, n, *, op="matmul", act=None, seed=0, layers=1) -> onnx.ModelProto:
    """``layers`` x (MatMul+Add or Gemm) [+ Relu/Clip] on input ``x`` of ``shape`` (last dim = K)."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev, k = [], [], "x", shape[-1]
    for i in range(layers):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = (rng.standard_normal(n) * 0.1).astype(np.float32)
        out = f"h{i}"
        if op == "gemm":
            inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
            nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [out], transB=1, name=f"gemm{i}"))
        else:
            inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
            nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"mm{i}"], name=f"matmul{i}"))
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out], name=f"add{i}"))
        if act == "relu":
            nodes.append(helper.make_node("Relu", [out], [f"a{i}"], name=f"relu{i}"))
            out = f"a{i}"
        elif act == "clip":
            lo, hi = numpy_helper.from_array(np.float32(0), f"lo{i}"), numpy_helper.from_array(np.float32(6), f"hi{i}")
            inits += [lo, hi]
            nodes.append(helper.make_node("Clip", [out, f"lo{i}", f"hi{i}"], [f"a{i}"], name=f"clip{i}"))
            out = f"a{i}"
        prev, k = out, n
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fp32_linear_one_bad_layer() -> onnx.ModelProto:
    """A 3-layer 8x32 MLP whose input feature 0 (1000x the others in :func:`one_bad_feature_inputs`)
    meets a 1000x smaller weight row: the FP32 function is ordinary, but one per-tensor scale for
    matmul0's input wipes out the other 31 features."""
    model = fp32_linear((8, 32), 32, act="relu", layers=3)
    w0 = numpy_helper.to_array(model.graph.initializer[0]).copy()
    w0[0] *= 1e-3
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w0, model.graph.initializer[0].name))
    return model


def one_bad_feature_inputs(rng, n: int) -> list:
    """``n`` 8x32 normal inputs whose feature 0 is scaled by 1000."""
    out = []
    for _ in range(n):
        x = rng.standard_normal((8, 32)).astype(np.float32)
        x[:, 0] *= 1000
        out.append(x)
    return out


def quantize_qdq(model: onnx.ModelProto, samples, *, per_channel=True, reduce_range=False,
                 activation_type=None, quant_format=None) -> onnx.ModelProto:
    """ONNX Runtime's ``quantize_static`` (QDQ, int8 weights, MinMax; uint8 activations unless
    ``activation_type`` says otherwise, e.g. ``QuantType.QUInt16``)."""
    import tempfile
    import os

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: s} for s in samples])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "qdq.onnx")
        onnx.save(for_ort(model), src)
        quantize_static(
            src, dst, Reader(), quant_format=quant_format or QuantFormat.QDQ, per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=activation_type or QuantType.QUInt8, weight_type=QuantType.QInt8,
        )
        return onnx.load(dst)


def qlinear_matmul(m, k, n, *, a_dtype="uint8", b_dtype="int8", per_column=False, seed=0, batch=()) -> onnx.ModelProto:
    """One QLinearMatMul with a constant B whose parameters keep the output mostly unsaturated."""
    rng = np.random.default_rng(seed)
    ia, ib = np.iinfo(a_dtype), np.iinfo(b_dtype)
    b = rng.integers(ib.min, ib.max + 1, (k, n)).astype(b_dtype)
    sb = (rng.random(n) * 0.01 + 0.005).astype(np.float32) if per_column else np.float32(0.01)
    zb = np.zeros(n, b_dtype) if per_column else np.array(0 if b_dtype == "int8" else 128, b_dtype)
    za = np.array(3 if a_dtype == "uint8" else -2, a_dtype)
    sa = np.float32(0.02)
    sy = np.float32(np.sqrt(k) * 128 * 80 * 0.02 * 0.01 / 100)
    zy = np.array(128 if a_dtype == "uint8" else 0, a_dtype)
    inits = [
        numpy_helper.from_array(np.asarray(v), name)
        for name, v in [("sa", sa), ("za", za), ("B", b), ("sb", sb), ("zb", zb), ("sy", sy), ("zy", zy)]
    ]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "B", "sb", "zb", "sy", "zy"], ["y"], name="qlinear_matmul")
    elem = TensorProto.UINT8 if a_dtype == "uint8" else TensorProto.INT8
    graph = helper.make_graph(
        [node], "qmm",
        [helper.make_tensor_value_info("a", elem, [*batch, m, k])],
        [helper.make_tensor_value_info("y", elem, [*batch, m, n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def fp32_cnn(shape=(1, 3, 16, 16), seed=0) -> onnx.ModelProto:
    """Conv3x3+Relu -> depthwise Conv3x3+Relu -> Conv3x3 stride 2 + bias -> Conv1x1 -> Clip(0, 6)."""
    rng = np.random.default_rng(seed)
    c_in = shape[1]
    layers = [(8, 3, dict(pads=[1, 1, 1, 1]), "relu"), (8, 3, dict(pads=[1, 1, 1, 1], group=8), "relu"),
              (16, 3, dict(strides=[2, 2], pads=[0, 1, 1, 0]), None), (8, 1, {}, "clip")]
    nodes, inits, prev = [], [], "x"
    for i, (c_out, k, attrs, act) in enumerate(layers):
        fan_in = c_in // attrs.get("group", 1)
        w = (rng.standard_normal((c_out, fan_in, k, k)) / np.sqrt(fan_in * k * k)).astype(np.float32)
        b = (rng.standard_normal(c_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"W{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", **attrs))
        prev = f"c{i}"
        if act == "relu":
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
        elif act == "clip":
            inits += [numpy_helper.from_array(np.float32(0), f"lo{i}"), numpy_helper.from_array(np.float32(6), f"hi{i}")]
            nodes.append(helper.make_node("Clip", [prev, f"lo{i}", f"hi{i}"], [f"r{i}"], name=f"clip{i}"))
            prev = f"r{i}"
        c_in = c_out
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Graph:
    """A float ONNX graph written op by op: float32 initializers, nodes named after their output, and
    convolutions with random weights scaled to keep activations near unit variance."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, c_in, c_out, k, name, stride=1):
        w = self.const(f"{name}_w", self.rng.standard_normal((c_out, c_in, k, k)) / np.sqrt(c_in * k * k))
        b = self.const(f"{name}_b", self.rng.standard_normal(c_out) * 0.1)
        return self.node("Conv", [x, w, b], name, pads=[k // 2] * 4, strides=[stride, stride])

    def model(self, name, shape, opset=17) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                                  [helper.make_tensor_value_info(self.nodes[-1].output[0], TensorProto.FLOAT, None)],
                                  self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def fp32_block_net(shape=(1, 8, 16, 16), seed=0, classes=10) -> onnx.ModelProto:
    """The operators between a CNN's convolutions: Conv+SiLU (Sigmoid*Mul), a residual Add + Relu,
    MaxPool, Concat of two branches, nearest Resize x2, AveragePool, GlobalAveragePool, Flatten, Gemm."""
    g = _Graph(seed)
    node, conv, const = g.node, g.conv, g.const
    c = shape[1]
    a = conv("x", c, 16, 3, "conv0")
    a = node("Mul", [a, node("Sigmoid", [a], "sig0")], "silu0")
    r = node("Relu", [conv(a, 16, 16, 3, "conv1")], "relu1")
    a = node("Relu", [node("Add", [conv(r, 16, 16, 3, "conv2"), a], "res")], "relu2")
    p = node("MaxPool", [a], "pool", kernel_shape=[2, 2], strides=[2, 2])
    left, right = conv(p, 16, 8, 1, "conv3"), node("Relu", [conv(p, 16, 8, 3, "conv4")], "relu4")
    cat = node("Concat", [left, right], "cat", axis=1)
    up = node("Resize", [cat, "", const("scales", [1, 1, 2, 2])], "up", mode="nearest")
    a = node("AveragePool", [conv(up, 16, 16, 3, "conv5", stride=2)], "avg", kernel_shape=[2, 2], strides=[2, 2])
    flat = node("Flatten", [node("GlobalAveragePool", [a], "gap")], "flat", axis=1)
    w = const("fc_w", g.rng.standard_normal((classes, 16)) / 4)
    node("Gemm", [flat, w, const("fc_b", g.rng.standard_normal(classes) * 0.1)], "y", transB=1)
    return g.model("blocks", shape)


def qlinear_conv(x_shape, c_out, kernel, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), bias=True,
                 per_channel=True, x_dtype="uint8", group=1, seed=0) -> onnx.ModelProto:
    """One QLinearConv with constant weights (int8, per output channel) and an int32 bias."""
    rng = np.random.default_rng(seed)
    c_in = x_shape[1] // group
    w = rng.integers(-127, 128, (c_out, c_in, *kernel)).astype(np.int8)
    sw = (rng.random(c_out) * 0.01 + 0.005).astype(np.float32) if per_channel else np.float32(0.01)
    zw = np.zeros(c_out, np.int8) if per_channel else np.array(0, np.int8)
    sx, zx = np.float32(0.02), np.array(7 if x_dtype == "uint8" else -3, x_dtype)
    depth = c_in * kernel[0] * kernel[1]
    sy = np.float32(np.sqrt(depth) * 128 * 70 * 0.02 * 0.0075 / 90)
    zy = np.array(120 if x_dtype == "uint8" else 0, x_dtype)
    names = ["x", "sx", "zx", "W", "sw", "zw", "sy", "zy"]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names[1:], [sx, zx, w, sw, zw, sy, zy])]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-3000, 3000, c_out).astype(np.int32), "B"))
        names.append("B")
    node = helper.make_node("QLinearConv", names, ["y"], name="qconv", strides=list(strides), pads=list(pads),
                            dilations=list(dilations), kernel_shape=list(kernel), group=group)
    elem = TensorProto.UINT8 if x_dtype == "uint8" else TensorProto.INT8
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", elem, list(x_shape))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def fp32_and_qdq(fp32, shape, samples: int = 4) -> dict:
    """``{"fp32": fp32, "qdq": its ORT quantize_static form}``, calibrated on ``samples`` N(0, 1) inputs
    of ``shape`` (seed 0): the two forms the detector tests compile."""
    rng = np.random.default_rng(0)
    return {"fp32": fp32, "qdq": quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(samples)])}


def fp32_se_block(shape=(1, 8, 16, 16), seed=0) -> onnx.ModelProto:
    """EfficientNet's block as exporters write it: Conv + SiLU (Sigmoid, Mul), then squeeze-and-excitation
    (ReduceMean over H, W; 1x1 Conv + SiLU; 1x1 Conv + Sigmoid; Mul with the block's SiLU), then a 1x1
    projection Conv. The first SiLU's output is read by the mean and by the scaling Mul, not by a layer."""
    g = _Graph(seed)
    node, conv = g.node, g.conv
    c, squeezed = shape[1] * 2, max(2, shape[1] // 2)

    def silu(x, name):
        return node("Mul", [x, node("Sigmoid", [x], f"{name}_sig")], name)

    a = silu(conv("x", shape[1], c, 3, "conv0"), "silu0")
    axes = node("Constant", [], "axes", value=numpy_helper.from_array(np.array([2, 3], np.int64)))
    pooled = node("ReduceMean", [a, axes], "pool", keepdims=1)
    s = node("Sigmoid", [conv(silu(conv(pooled, c, squeezed, 1, "se_reduce"), "se_silu"), squeezed, c, 1, "se_expand")],
             "se_gate")
    conv(node("Mul", [a, s], "scaled"), c, shape[1], 1, "y")
    return g.model("se_block", shape, opset=18)
