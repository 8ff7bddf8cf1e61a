"""ONNX's constant-mode Pad as Relax's ``nn.pad`` (frontend/converters.py), carried through the layout
pass in NHWC and folded onto the codes between a DequantizeLinear and a QuantizeLinear with the same
parameters (quant/fold_qdq.py): HGNetV2's stem pads before a max pool. Other modes keep TVM's form."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_lowprec

from models import _Graph, quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale


def _pad_model(opset, mode="constant", value=0.5, axes=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    pads = [0, 1, 2, 0, 0, 2, 1, 3] if axes is None else [1, 2, 2, 1]  # [begin..., end...]
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value")]
    inputs = ["x", "pads", "value" if mode == "constant" else ""]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    node = helper.make_node("Pad", inputs, ["y"], mode=mode)
    graph = helper.make_graph([node], "pad", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ops(mod):
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return names


@pytest.mark.parametrize("opset,mode,axes", [(13, "constant", None), (18, "constant", [2, 3]), (18, "reflect", None),
                                             (19, "edge", None)])
def test_pad_matches_onnx_runtime(opset, mode, axes, rng):
    model = _pad_model(opset, mode, axes=axes)
    mod = tvm_lowprec.from_onnx(model)
    assert ("relax.nn.pad" in _ops(mod)) == (mode == "constant")  # other modes: TVM's call_tir
    x = rng.standard_normal((1, 3, 5, 6)).astype(np.float32)
    got = tvm_lowprec.compile(mod, target="native")(x)[0]
    np.testing.assert_array_equal(got, ort_session(model).run(None, {"x": x})[0])


def _stem(shape=(1, 3, 16, 16), seed=0):
    """HGNetV2's stem: conv, then a pad of one row and column (zeros) before a 2x2 max pool (stride 1),
    concatenated with a conv branch, then a conv."""
    g = _Graph(seed)
    a = g.node("Relu", [g.conv("x", shape[1], 8, 3, "conv0")], "relu0")
    g.inits.append(numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "stem_pads"))
    p = g.node("Pad", [a, "stem_pads"], "pad")
    m = g.node("MaxPool", [p], "pool", kernel_shape=[2, 2], strides=[1, 1])
    b = g.node("Relu", [g.conv(a, 8, 8, 3, "conv1")], "relu1")
    cat = g.node("Concat", [m, b], "cat", axis=1)
    g.conv(cat, 16, 8, 1, "y")
    return g.model("stem", shape)


def test_a_quantized_pad_stays_on_the_codes_and_in_nhwc(rng):
    shape = (1, 3, 16, 16)
    qdq = quantize_qdq(_stem(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    names = [k.name for k in compiled.kernels()]
    assert len([n for n in names if "transpose" in n]) == 2, names  # the input's and the output's only
    assert not [n for n in names if "dequantize" in n and "pad" in n], names  # no float pad
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq), exact_fraction=0.9)
