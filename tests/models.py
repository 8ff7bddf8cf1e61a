"""Small ONNX models for tests, made here with fixed seeds (never downloaded, never committed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


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


def quantize_qdq(model: onnx.ModelProto, samples, *, per_channel=True, reduce_range=False) -> onnx.ModelProto:
    """ONNX Runtime's ``quantize_static`` (QDQ, uint8 activations, int8 weights, MinMax)."""
    import tempfile
    import os

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": s} for s in samples])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "qdq.onnx")
        onnx.save(model, src)
        quantize_static(
            src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel, reduce_range=reduce_range,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
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
