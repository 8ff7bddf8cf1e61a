"""Data movement between quantize/dequantize pairs with equal parameters stays in the integer domain."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.targets.x86 import X86_TARGETS

from reference import ort_session


def _model(op_nodes, out_scale=0.05, out_zp=128, shape=(2, 3, 8, 8)):
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.float32(out_scale), "s2"), numpy_helper.from_array(np.array(out_zp, np.uint8), "z2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), *op_nodes,
             helper.make_node("QuantizeLinear", ["m", "s2", "z2"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MOVES = {
    "transpose": [helper.make_node("Transpose", ["d"], ["m"], perm=[0, 2, 3, 1])],
    "maxpool": [helper.make_node("MaxPool", ["d"], ["m"], kernel_shape=[2, 2], strides=[2, 2])],
    "flatten": [helper.make_node("Flatten", ["d"], ["m"], axis=1)],
}


def _round_trip(kernel_name: str) -> bool:
    """A fused kernel that dequantizes and then quantizes again (a float round trip)."""
    ops = kernel_name.split("_")
    first_dq = next((i for i, op in enumerate(ops) if op.startswith("dequantize")), None)
    return first_dq is not None and any(op.startswith("quantize") for op in ops[first_dq:])


@pytest.mark.parametrize("name", list(MOVES))
def test_movement_runs_on_integers_and_matches_ort(name, rng):
    model = _model(MOVES[name])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    names = [k.name for k in compiled.kernels()]
    assert not any(_round_trip(n) for n in names), names
    x = (rng.standard_normal((2, 3, 8, 8)) * 3).astype(np.float32)
    np.testing.assert_array_equal(compiled(x)[0], ort_session(model, optimized=False).run(None, {"x": x})[0])


def test_different_parameters_are_a_requantization_and_stay(rng):
    """A requantization is not folded away: it stays a float round trip, or becomes a table lookup of
    the codes on a row whose lookup instruction takes a lone requantization (``min_ops`` 2: vpermi2b)."""
    model = _model(MOVES["transpose"], out_scale=0.07, out_zp=120)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert any(_round_trip(k.name) or (k.op == "lookup" and k.folded == 2) for k in compiled.kernels())
    x = (rng.standard_normal((2, 3, 8, 8)) * 3).astype(np.float32)
    np.testing.assert_array_equal(compiled(x)[0], ort_session(model, optimized=False).run(None, {"x": x})[0])


def test_a_split_with_qdq_on_every_output_splits_the_codes(rng):
    """``DequantizeLinear -> Split -> QuantizeLinear`` on each output with the input's parameters (a YOLO
    C2f block as ORT's quantizer writes it) splits the uint8 codes: no kernel splits float32 values or
    quantizes a split output again; exact against ONNX Runtime on the QDQ graph."""
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array([2, 6], np.int64), "sizes")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Split", ["d", "sizes"], ["a", "b"], axis=1)]
    for name in ("a", "b"):
        nodes += [helper.make_node("QuantizeLinear", [name, "s", "z"], [name + "q"]),
                  helper.make_node("DequantizeLinear", [name + "q", "s", "z"], [name + "y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("ay", "by")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    names = [k.name for k in compiled.kernels()]
    assert any("split" in n for n in names), names
    for n in names:  # the split's kernel splits codes: no dequantize before it (the input's quantize may fuse)
        ops = n.split("_")
        if "split" in ops:
            assert not any(op.startswith("dequantize") for op in ops[:ops.index("split")]), n
    assert not any(_round_trip(n) for n in names), names
    x = (rng.standard_normal((1, 8, 6, 6)) * 3).astype(np.float32)
    want = ort_session(model, optimized=False).run(None, {"x": x})
    for got, ref in zip(compiled(x), want):
        np.testing.assert_array_equal(got, ref)


def test_a_quantized_concatenation_copies_the_pieces_with_its_parameters(rng):
    """``Concat`` of three dequantized pieces, quantized: the piece with the output's parameters and the
    nearest-neighbour upsampled one (a YOLO FPN's ``Resize`` + ``Concat``) are copied as codes, the
    third is requantized on its own: no kernel dequantizes before the concatenation except that
    piece's requantization; exact against ONNX Runtime on the QDQ graph."""
    consts = {"s": np.float32(0.05), "z": np.array(128, np.uint8), "s3": np.float32(0.08), "z3": np.array(100, np.uint8),
              "scales": np.array([1, 1, 2, 2], np.float32)}
    nodes = []
    for i, (name, s, z) in enumerate((("a", "s", "z"), ("b", "s", "z"), ("c", "s3", "z3"))):
        nodes += [helper.make_node("QuantizeLinear", [name, s, z], [f"{name}q"]),
                  helper.make_node("DequantizeLinear", [f"{name}q", s, z], [f"{name}d"])]
    nodes += [helper.make_node("Resize", ["bd", "", "scales"], ["bu"], mode="nearest"),
              helper.make_node("QuantizeLinear", ["bu", "s", "z"], ["buq"]),
              helper.make_node("DequantizeLinear", ["buq", "s", "z"], ["bud"]),
              helper.make_node("Concat", ["ad", "bud", "cd"], ["cat"], axis=1),
              helper.make_node("QuantizeLinear", ["cat", "s", "z"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
              for n, shape in (("a", [1, 16, 8, 8]), ("b", [1, 16, 4, 4]), ("c", [1, 8, 8, 8]))]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    names = [k.name for k in compiled.kernels()]
    assert not any("resize2d" in n and "dequantize" in n.split("resize2d")[0] for n in names), names  # codes
    cat = [n.split("_") for n in names if "concatenate" in n]
    assert len(cat) == 1 and sum(op.startswith("dequantize") for op in cat[0]) <= 1, names  # c's requantization
    feed = {n: (rng.standard_normal(shape) * 3).astype(np.float32)
            for n, shape in (("a", (1, 16, 8, 8)), ("b", (1, 16, 4, 4)), ("c", (1, 8, 8, 8)))}
    want = ort_session(model, optimized=False).run(None, feed)[0]
    np.testing.assert_array_equal(compiled(*feed.values())[0], want)


def test_a_flattened_head_concatenation_requantizes_each_piece_on_its_own(rng):
    """A YOLO head's box outputs, flattened to [1, C, H*W] per level and concatenated along the anchors
    with Q/DQ pairs of other parameters: each level's requantization is a table lookup of its own
    codes (a function of one 8-bit tensor), the concatenation a copy; before, any rank but 4 kept
    the float requantization inside the concatenation (a division per element: 12% of the copy
    bandwidth for the detector's 1x16x8000). Exact against ONNX Runtime on the QDQ graph."""
    consts = {"s": np.float32(0.05), "z": np.array(121, np.uint8), "s1": np.float32(0.049), "z1": np.array(125, np.uint8),
              "s2": np.float32(0.0501), "z2": np.array(120, np.uint8)}
    nodes = []
    for name, s, z in (("a", "s1", "z1"), ("b", "s2", "z2")):
        nodes += [helper.make_node("QuantizeLinear", [name, s, z], [f"{name}q"]),
                  helper.make_node("DequantizeLinear", [f"{name}q", s, z], [f"{name}d"])]
    nodes += [helper.make_node("Concat", ["ad", "bd"], ["cat"], axis=2),
              helper.make_node("QuantizeLinear", ["cat", "s", "z"], ["y"])]
    shapes = {"a": [1, 16, 256], "b": [1, 16, 64]}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v) for n, v in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="x86-avx512-vnni")
    kernels = compiled.kernels()
    assert sorted(k.shape for k in kernels if k.op == "lookup") == [(16 * 64,), (16 * 256,)], kernels
    cat = [k.name for k in kernels if "concatenate" in k.name]
    assert len(cat) == 1 and "dequantize" not in cat[0] and "quantize" not in cat[0], kernels
    if compiled.execution == "none":
        return
    feed = {n: (rng.standard_normal(v) * 3).astype(np.float32) for n, v in shapes.items()}
    want = ort_session(model, optimized=False).run(None, feed)[0]
    np.testing.assert_array_equal(compiled(*feed.values())[0], want)


@pytest.mark.parametrize("target", [t.name for t in X86_TARGETS], ids=str)
def test_a_requantization_after_an_upsampling_runs_on_the_smaller_tensor(target, rng):
    """An FPN's pieces: a nearest x4 upsampled piece with other parameters than the concatenation's.
    Its requantization is done on the 4x4 input (a lookup kernel of 16x4x4 codes, on every row: however
    short the chain, as its reader is a resize), the concatenation then copies codes; exact against
    ONNX Runtime on the QDQ graph."""
    consts = {"s": np.float32(0.05), "z": np.array(128, np.uint8), "s2": np.float32(0.11), "z2": np.array(90, np.uint8),
              "scales": np.array([1, 1, 4, 4], np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["ad"]),
             helper.make_node("QuantizeLinear", ["b", "s2", "z2"], ["bq"]),
             helper.make_node("DequantizeLinear", ["bq", "s2", "z2"], ["bd"]),
             helper.make_node("Resize", ["bd", "", "scales"], ["bu"], mode="nearest"),
             helper.make_node("QuantizeLinear", ["bu", "s2", "z2"], ["buq"]),
             helper.make_node("DequantizeLinear", ["buq", "s2", "z2"], ["bud"]),
             helper.make_node("Concat", ["ad", "bud"], ["cat"], axis=1),
             helper.make_node("QuantizeLinear", ["cat", "s", "z"], ["y"])]
    shapes = {"a": [1, 16, 16, 16], "b": [1, 16, 4, 4]}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=target)
    kernels = compiled.kernels()
    assert any(k.op == "lookup" and k.shape == (16 * 4 * 4,) for k in kernels), kernels
    cat = [k.name for k in kernels if "concatenate" in k.name]
    assert len(cat) == 1 and "dequantize" not in cat[0], kernels  # both pieces are codes
    if compiled.execution == "none":
        return
    feed = {n: (rng.standard_normal(s) * 3).astype(np.float32) for n, s in shapes.items()}
    want = ort_session(model, optimized=False).run(None, feed)[0]
    np.testing.assert_array_equal(compiled(*feed.values())[0], want)
