"""Float functions of one 8-bit tensor become 256-entry tables (:mod:`tvm_lowprec.quant.lookup_tables`).

Each model takes an 8-bit tensor holding every value of its dtype, dequantizes it, applies a float
chain written the way exporters write it, and quantizes the result; the compiled model must equal
``onnx.reference`` on all 256 inputs and contain a table lookup instead of the float operators.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec

ONNX_DTYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _qdq(name, value_in, value_out, scale, zp_name):
    return [helper.make_node("QuantizeLinear", [value_in, scale, zp_name], [f"{name}_q"]),
            helper.make_node("DequantizeLinear", [f"{name}_q", scale, zp_name], [value_out])]


# name -> nodes from "d" (the dequantized input) to "f" (the float result); constants in CONSTS
CHAINS = {
    "sigmoid": [helper.make_node("Sigmoid", ["d"], ["f"])],
    "tanh": [helper.make_node("Tanh", ["d"], ["f"])],
    # SiLU as quantize_static leaves it: the sigmoid quantized on its own, then x * sigmoid(x)
    "silu": [helper.make_node("Sigmoid", ["d"], ["s"]), *_qdq("sig", "s", "sd", "s_mid", "z_mid"),
             helper.make_node("Mul", ["d", "sd"], ["f"])],
    # GELU as BERT exporters write it: x * 0.5 * (1 + erf(x / sqrt(2)))
    "gelu-erf": [helper.make_node("Div", ["d", "sqrt2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["d", "p"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["f"])],
}
CONSTS = {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5),
          "s_mid": np.float32(1 / 255), "z_mid": np.uint8(0)}


def _model(chain_nodes, dtype, in_scale=0.04, out_scale=0.02, in_axis_scale=None):
    zp_in = np.array(0 if dtype == "int8" else 128, dtype)
    zp_out = np.array(-20 if dtype == "int8" else 100, dtype)
    scale = np.float32(in_scale) if in_axis_scale is None else np.asarray(in_axis_scale, np.float32)
    zp = zp_in if in_axis_scale is None else np.full(scale.shape, zp_in, dtype)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in CONSTS.items()]
    inits += [numpy_helper.from_array(scale, "s_in"), numpy_helper.from_array(zp, "z_in"),
              numpy_helper.from_array(np.float32(out_scale), "s_out"), numpy_helper.from_array(zp_out, "z_out")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["d"], axis=0), *chain_nodes,
             helper.make_node("QuantizeLinear", ["f", "s_out", "z_out"], ["y"])]
    shape = [256 // 16, 16] if in_axis_scale is None else [len(in_axis_scale), 256 // len(in_axis_scale)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", ONNX_DTYPE[dtype], shape)],
                              [helper.make_tensor_value_info("y", ONNX_DTYPE[dtype], shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _all_values(dtype, shape):
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype).reshape(shape)


def _kernel_names(compiled):
    return " ".join(k.name for k in compiled.kernels())


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_is_a_table_and_exact_on_every_input(name, dtype):
    model = _model(CHAINS[name], dtype)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    names = _kernel_names(compiled)
    assert "take" in names and not any(op in names for op in ("sigmoid", "tanh", "erf", "divide")), names
    x = _all_values(dtype, (16, 16))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 20  # a real function of the input, not a clamped constant


def test_cheap_chain_stays_arithmetic():
    """A plain requantization with a clamp is vector arithmetic, cheaper than a gather."""
    model = _model([helper.make_node("Relu", ["d"], ["f"])], "uint8")
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert "take" not in _kernel_names(compiled)
    x = _all_values("uint8", (16, 16))
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_per_channel_parameters_keep_the_float_chain():
    """With a per-channel input scale the function depends on the position: no single table."""
    model = _model(CHAINS["sigmoid"], "uint8", in_axis_scale=[0.01, 0.02, 0.04, 0.08])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert "take" not in _kernel_names(compiled)
    x = _all_values("uint8", (4, 64))
    got, want = compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_function_of_two_tensors_is_not_a_table(rng):
    """x * sigmoid(y) with two different inputs: the chain has two 8-bit leaves."""
    model = _model(CHAINS["sigmoid"], "uint8")
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("x2", TensorProto.UINT8, [16, 16]))
    graph.node.insert(1, helper.make_node("DequantizeLinear", ["x2", "s_in", "z_in"], ["d2"]))
    graph.node[-1].input[0] = "g"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Mul", ["f", "d2"], ["g"]))
    onnx.checker.check_model(model)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x, x2 = _all_values("uint8", (16, 16)), rng.integers(0, 256, (16, 16)).astype(np.uint8)
    got, want = compiled(x, x2)[0], ReferenceEvaluator(model).run(None, {"x": x, "x2": x2})[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    # the inner Q(sigmoid(DQ(x))) has no quantize of its own here, so no table either
    assert "take" not in _kernel_names(compiled)
