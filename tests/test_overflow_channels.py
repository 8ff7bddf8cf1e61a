"""Output channels whose bias does not fit int32 at ``s_x * s_w`` (near-zero weights, e.g. after
BatchNormalization folding, meeting a large bias): PTQ widens those channels' weight scales (as ONNX
Runtime's quantizer does) and says so; an imported QDQ model with such a channel keeps that layer in
its integer GEMM without the bias, which a float epilogue adds after the scale (as the QDQ graph does),
then the output's quantize (a depthwise convolution keeps the float QDQ arithmetic), instead of failing."""

import importlib
import logging

import numpy as np
import pytest
from models import fp32_cnn, fp32_linear, quantize_qdq
from onnx import TensorProto, helper, numpy_helper
from reference import ort_session

import tvm_lowprec
from tvm_lowprec.ptq import QuantConfig, accuracy_report, quantize
from tvm_lowprec.quant.zero_points import CorrectionOverflow, gemm_corrections

SHAPE = (1, 3, 16, 16)
quantize_module = importlib.import_module("tvm_lowprec.ptq.quantize")


def _set(model, name, array):
    for init in model.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
            return
    raise KeyError(name)


def _get(model, name):
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name).copy()


def _cnn_with_dead_channels():
    """fp32_cnn with output channel 2 of conv0 and channel 5 of the depthwise conv1 scaled to ~1e-9 and
    given biases 3.0 and 2.0: quantized at s_x * s_w, those biases need ~1e13 accumulator units."""
    model = fp32_cnn(SHAPE)
    for conv, channel, bias in (("0", 2, 3.0), ("1", 5, 2.0)):
        w, b = _get(model, f"W{conv}"), _get(model, f"b{conv}")
        w[channel] *= 1e-9
        b[channel] = bias
        _set(model, f"W{conv}", w)
        _set(model, f"b{conv}", b)
    return model


def _sqnr(ref, got):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2))


def test_gemm_corrections_name_the_overflowing_channels():
    b = np.ones((16, 4), np.int8)
    with pytest.raises(CorrectionOverflow, match=r"channel\(s\) \[1, 3\]"):
        gemm_corrections(b, 3, 0, 0, np.array([0, 2**31, 5, -(2**33)], np.int64))


def test_ptq_widens_the_dead_channels_and_matches_ort(rng, caplog, monkeypatch):
    model = _cnn_with_dead_channels()
    cal = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(8)]
    held = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    mod = tvm_lowprec.from_onnx(model)
    refs = np.stack([ort_session(model, optimized=False).run(None, {"x": x})[0] for x in held])
    with caplog.at_level(logging.WARNING):
        qmod = quantize(mod, cal, QuantConfig(), progress=False)  # 8-bit weights, like ORT
    compiled = tvm_lowprec.compile(qmod, target="native")
    kernels = [k.name for k in compiled.kernels()]
    assert sum(k.startswith(("qconv2d", "qdepthwise")) for k in kernels) == 4, kernels  # every conv integer
    ours = _sqnr(refs, np.stack([compiled(x)[0] for x in held]))
    ort_q = ort_session(quantize_qdq(model, cal), optimized=False)
    theirs = _sqnr(refs, np.stack([ort_q.run(None, {"x": x})[0] for x in held]))
    assert ours > 24.0 and ours >= theirs - 0.5, (ours, theirs)
    assert "'conv0': weight scale of output channel(s) [2]" in caplog.text
    assert "'conv1': weight scale of output channel(s) [5]" in caplog.text
    report = accuracy_report(mod, qmod, held, progress=False)
    assert sum("widened" in n for n in report.notes) == 2 and "widened" in report.table()

    # the other treatment: scales as calibrated, the two layers left in float QDQ arithmetic
    monkeypatch.setattr(quantize_module, "WIDEN_OVERFLOWING_BIAS", False)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        floaty = tvm_lowprec.compile(quantize(mod, cal, QuantConfig(), progress=False), target="native")
    kernels = [k.name for k in floaty.kernels()]
    assert sum(k.startswith(("qconv2d", "qdepthwise")) for k in kernels) < 4, "\n".join(kernels)
    # conv0 keeps its integer GEMM, the bias added in float after the scale; the depthwise conv1 stays float
    assert sum(k.startswith("qconv2d") and k.endswith("_float") for k in kernels) == 1, "\n".join(kernels)
    assert caplog.text.count("stays in float QDQ arithmetic") == 1
    # ... on the float32 depthwise kernel (its weights the dequantized constants), not TVM's scalar loops
    assert sum(k.startswith("fp32_depthwise") for k in kernels) == 1, "\n".join(kernels)
    float_bias = _sqnr(refs, np.stack([floaty(x)[0] for x in held]))
    print(f"SQNR vs FP32: widened scales {ours:.2f} dB, float-bias layers {float_bias:.2f} dB, ORT {theirs:.2f} dB")
    assert float_bias > 24.0


def _qdq_matmul_with_float_bias(k=32, n=8, dead=3):
    """x -> Q/DQ (uint8) -> MatMul with DQ(int8 per-column weights; column ``dead`` ~1e-9 with its own tiny
    scale) -> Add(float bias, 4.0 on the dead column) -> Q/DQ (uint8): the bias in accumulator units
    is ~1e12 on that column."""
    w = fp32_linear((4, k), n)
    wf = _get(w, "W0")
    wf[:, dead] *= 1e-9
    ws = (np.abs(wf).max(axis=0) / 127).astype(np.float32)
    wq = np.clip(np.rint(wf / ws), -127, 127).astype(np.int8)
    bias = _get(w, "b0")
    bias[dead] = 4.0
    inits = [numpy_helper.from_array(wq, "Wq"), numpy_helper.from_array(ws, "Ws"),
             numpy_helper.from_array(np.zeros(n, np.int8), "Wz"), numpy_helper.from_array(bias, "B"),
             numpy_helper.from_array(np.float32(8 / 255), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
             numpy_helper.from_array(np.float32(16 / 255), "ys"), numpy_helper.from_array(np.uint8(100), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=1),
             helper.make_node("MatMul", ["xd", "Wd"], ["mm"], name="matmul0"),
             helper.make_node("Add", ["mm", "B"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), wq, ws, bias


def test_imported_qdq_with_an_overflowing_bias_runs_exactly(rng, caplog):
    model, wq, ws, bias = _qdq_matmul_with_float_bias()
    xs = [(rng.standard_normal((4, 32)) * 2).astype(np.float32) for _ in range(4)]
    with caplog.at_level(logging.WARNING):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    # the integer GEMM without the bias, which its float epilogue adds after the scale (no float layer)
    assert "stays in float QDQ arithmetic" not in caplog.text
    assert [k.name for k in compiled.kernels() if k.op == "qgemm"] == ["qgemm_u8_4x8x32_float"]
    ort = ort_session(model, optimized=False)
    step = 16 / 255
    for x in xs:
        ours, theirs = compiled(x)[0], ort.run(None, {"x": x})[0]
        # numpy, the QDQ graph's arithmetic in float64
        xq = np.clip(np.rint(x / np.float32(8 / 255)) + 128, 0, 255)
        h = ((xq - 128) * np.float32(8 / 255)) @ (wq.astype(np.float64) * ws) + bias
        ref = (np.clip(np.rint(h / step) + 100, 0, 255) - 100) * step
        assert np.max(np.abs(ours - theirs)) <= step * 1.001  # at most one step apart (float rounding ties)
        assert np.max(np.abs(ours - ref)) <= step * 1.001
        assert np.mean(ours == theirs) > 0.95
        np.testing.assert_allclose(ours[:, 3], theirs[:, 3])  # the dead column: its bias, exactly
