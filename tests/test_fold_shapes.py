"""Shape folding at import (tvm_lowprec.frontend.fold_shapes): exports with dynamic axes and shape
subgraphs compile once the input shape is fixed, and a dimension left dynamic is named.

The model is a YOLOv8-style detector exported with dynamic batch, height and width (benchmarks/models/detector.py):
Conv+SiLU, a C2f block with Split and Concat, an SPPF max-pool pyramid, nearest Resize to computed
sizes, a DFL head with computed Reshapes, Transpose, Softmax and a 1x1 Conv, and anchor arithmetic
from Shape/Range. Its FP32 form and ONNX Runtime's quantize_static QDQ form are compared with ORT
running the graph as written.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.errors import DynamicShapeError, InputError
from tvm_lowprec.frontend.fold_shapes import fold_shapes

from benchmarks.models.detector import yolo_like
from models import fp32_and_qdq
from reference import cosine, kernel_calls, ort_session

SHAPE = (1, 3, 64, 64)


@pytest.fixture(scope="module")
def detectors():
    return fp32_and_qdq(yolo_like(), SHAPE)


@pytest.mark.parametrize("form,shape", [("fp32", SHAPE), ("fp32", (2, 3, 96, 128)), ("qdq", SHAPE)],
                         ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
def test_detector_with_dynamic_axes_compiles_and_matches_ort(detectors, form, shape, rng):
    model = detectors[form]
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"images": list(shape)}), target="native")
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    if form == "qdq":  # every convolution an integer kernel on the row's intrinsic (the DFL conv included;
        # convolutions of one shape share a kernel, their zero points parameters: counted in calls)
        calls = kernel_calls(compiled, rng.standard_normal(shape).astype(np.float32))
        assert sum(calls[k.name] for k in gemms) == sum(n.op_type == "Conv" for n in model.graph.node)
        assert all(k.intrinsic.startswith("lowprec_") for k in gemms)
    else:
        assert not gemms
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = compiled(x), ort_session(model, optimized=False).run(None, {"images": x})
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        assert cosine(g, w) >= 0.9999


def test_shape_subgraphs_fold_to_constants(detectors):
    model = detectors["qdq"]
    folded = fold_shapes(model, {"images": list(SHAPE)})
    ops = {n.op_type for n in folded.graph.node}
    # (the anchor grid's Unsqueeze and Expand stay: ORT put Q/DQ pairs on its constant values, which
    # this pass leaves to the integer rewrite; TVM's FoldConstant folds them after)
    assert not ops & {"Shape", "Gather", "Range", "ConstantOfShape", "Slice"}
    # quantize/dequantize pairs are left for the integer rewrite, weights included
    count = lambda m, op: sum(n.op_type == op for n in m.graph.node)  # noqa: E731
    assert count(folded, "DequantizeLinear") == count(model, "DequantizeLinear")
    assert count(folded, "QuantizeLinear") == count(model, "QuantizeLinear")
    reshapes = [n for n in folded.graph.node if n.op_type in ("Reshape", "Resize")]
    inits = {t.name for t in folded.graph.initializer}
    assert reshapes and all(n.input[-1] in inits for n in reshapes)  # target shapes and sizes are constants


def test_a_dynamic_dimension_is_named_with_the_fix(detectors):
    with pytest.raises(DynamicShapeError, match=r"'images' dimension 2 \(height\).*stem.conv.*--shape images="):
        tvm_lowprec.compile(tvm_lowprec.from_onnx(detectors["fp32"]), target="native")


def test_bad_shape_dict_is_named(detectors):
    model = detectors["fp32"]
    with pytest.raises(InputError, match="not an input.*images"):
        tvm_lowprec.from_onnx(model, shape_dict={"image": [1, 3, 64, 64]})
    with pytest.raises(InputError, match="rank 4"):
        tvm_lowprec.from_onnx(model, shape_dict={"images": [3, 64, 64]})
    static = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])]))
    with pytest.raises(InputError, match="contradicts"):
        tvm_lowprec.from_onnx(static, shape_dict={"x": [4, 8]})


def test_a_shape_chain_becomes_one_constant():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch exports flatten."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    model = helper.make_model(helper.make_graph(
        nodes, "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits), opset_imports=[helper.make_opsetid("", 17)])
    folded = fold_shapes(model, {"x": [3, 4, 5]})
    assert [n.op_type for n in folded.graph.node] == ["Reshape"]
    target = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}[folded.graph.node[0].input[1]]
    np.testing.assert_array_equal(target, [3, -1])
    assert fold_shapes(model) .graph.node[0].op_type == "Shape"  # without the shape nothing is folded


def test_cli_takes_shapes(detectors, tmp_path, capsys):
    from tvm_lowprec.cli import main

    path = tmp_path / "detector_qdq.onnx"
    onnx.save(detectors["qdq"], path)
    assert main(["run", str(path), "--shape", "images=1x3x64x64", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if "graph as written" in l)
    # boxes reach about 65: a step of an intermediate, times the stride 8 of the decode, is about 1
    assert max(float(v) for v in line.rsplit(":", 1)[1].split(",")) < 2.0
    assert main(["run", str(path), "--repeat", "2"]) == 2
    assert "--shape images=" in capsys.readouterr().err


def _conv_bn(rng, quantized_weights=False):
    """Conv(3x3, bias) -> BatchNormalization -> Relu, with non-trivial statistics."""
    c_in, c_out = 4, 6
    w = rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) / 6
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")]
    for name, value in (("scale", rng.uniform(0.5, 2, c_out)), ("beta", rng.standard_normal(c_out)),
                        ("mean", rng.standard_normal(c_out)), ("var", rng.uniform(0.2, 3, c_out))):
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["n"], epsilon=1e-3, name="bn"),
             helper.make_node("Relu", ["n"], ["y"])]
    return helper.make_model(helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits), opset_imports=[helper.make_opsetid("", 17)])


def test_batchnorm_after_a_convolution_is_folded_into_it(rng):
    from tvm_lowprec.frontend.fold_batchnorm import fold_batchnorm

    model = _conv_bn(rng)
    folded = fold_batchnorm(model)
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu"]
    assert {"scale", "beta", "mean", "var", "w", "b"}.isdisjoint(t.name for t in folded.graph.initializer)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort_session(model, optimized=False).run(None, {"x": x})[0]
    np.testing.assert_allclose(ort_session(folded, optimized=False).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert not any("batch_norm" in k.name for k in compiled.kernels())
    np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-4, atol=1e-4)
    # quantized: PTQ of the FP32 model quantizes the folded convolution (one integer kernel, no BN left)
    qmod = tvm_lowprec.quantize(tvm_lowprec.from_onnx(model), [rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
                                                              for _ in range(4)], progress=False)
    qcompiled = tvm_lowprec.compile(qmod, target="native")
    assert [k.op for k in qcompiled.kernels()].count("qgemm") == 1
    assert not any("batch_norm" in k.name for k in qcompiled.kernels())


def _padded_conv_qdq() -> onnx.ModelProto:
    """``Pad`` then ``Conv`` quantized as ONNX Runtime's quantize_static writes it (timm's efficientvit):
    the Pad's ``constant_value`` a DequantizeLinear of a uint8 constant."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             [("s", 0.05, np.float32), ("z", 128, np.uint8), ("pad_q", 128, np.uint8), ("ws", 0.01, np.float32),
              ("wz", 0, np.int8)]]
    inits += [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
              numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["pad_q", "s", "z"], ["pad_value"]),
             helper.make_node("Pad", ["xd", "pads", "pad_value"], ["p"], mode="constant"),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["pd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["out"])]
    graph = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_a_pads_dequantized_constant_value_is_folded_at_import(tmp_path, rng):
    """TVM's Pad converter needs its constant_value as a constant; the dequantize that ORT's quantizer
    writes there is evaluated at import (and only there: the other dequantizes stay for the rewrite)."""
    model = _padded_conv_qdq()
    folded = fold_shapes(model)
    assert "pad_value" in {t.name for t in folded.graph.initializer}
    assert sum(n.op_type == "DequantizeLinear" for n in folded.graph.node) == 4
    path = tmp_path / "pad.onnx"
    onnx.save(model, path)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native")
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want, = ort_session(model, optimized=False).run(None, {"x": x})
    steps = np.abs(compiled(x)[0] - want) / 0.05
    assert steps.max() <= 1.0 + 1e-3


def test_a_pads_constant_value_shared_with_other_operators_is_detached(tmp_path, rng):
    """torch's exporter shares one constant between a Pad's value and Where's (MobileBERT): the Pad gets
    the dequantized value as its own initializer, the Where keeps the DequantizeLinear; both match ORT."""
    model = _padded_conv_qdq()
    nodes = list(model.graph.node)
    nodes.insert(-2, helper.make_node("Less", ["xd", "pad_value"], ["negative"]))
    nodes.insert(-2, helper.make_node("Where", ["negative", "pad_value", "xd"], ["relu"]))
    nodes += [helper.make_node("QuantizeLinear", ["relu", "s", "z"], ["rq"]),
              helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["relu_out"])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.output.append(helper.make_tensor_value_info("relu_out", TensorProto.FLOAT, None))
    folded = fold_shapes(model)
    pad = next(n for n in folded.graph.node if n.op_type == "Pad")
    assert pad.input[2] in {t.name for t in folded.graph.initializer}
    assert any(n.op_type == "Where" and "pad_value" in n.input for n in folded.graph.node)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    for got, want in zip(compiled(x), ort_session(model, optimized=False).run(None, {"x": x})):
        assert (np.abs(got - want) / 0.05).max() <= 1.0 + 1e-3
