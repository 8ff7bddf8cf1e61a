"""4- and 2-bit integer tensors (carried as 8-bit ones) and blocked quantization, beyond the ONNX
conformance cases: models with int4 weights against ``onnx.reference``, and the errors."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from reference import assert_matches

import tvm_lowprec
from tvm_lowprec.errors import InputError, UnsupportedOperatorError


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _int4_tensor(name, values, dtype=TensorProto.INT4):
    return helper.make_tensor(name, dtype, list(np.shape(values)), np.asarray(values).ravel().tolist())


def _qdq_matmul_int4_weights(rng, k=48, n=24, block=0):
    """x -> Q/DQ (u8) -> MatMul with DQ(int4 W) -> Q/DQ (u8): per output channel, or per K block."""
    w = rng.integers(-8, 8, (k, n))
    if block:
        w_scale = rng.uniform(0.01, 0.05, (k // block, n)).astype(np.float32)
        dq_w = helper.make_node("DequantizeLinear", ["w", "w_scale"], ["wf"], axis=0, block_size=block)
    else:
        w_scale = rng.uniform(0.01, 0.05, (n,)).astype(np.float32)
        dq_w = helper.make_node("DequantizeLinear", ["w", "w_scale"], ["wf"], axis=1)
    inits = [_int4_tensor("w", w), numpy_helper.from_array(w_scale, "w_scale")]
    inits += [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in
              [("sx", 0.02, np.float32), ("zx", 120, np.uint8), ("sy", 0.05, np.float32), ("zy", 128, np.uint8)]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]), dq_w,
             helper.make_node("MatMul", ["xf", "wf"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, n])], inits)


def test_int4_weights_per_channel_take_the_integer_kernel(rng):
    model = _qdq_matmul_int4_weights(rng)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert [k for k in compiled.kernels() if k.op == "qgemm"], "int4 weights are int8 values: the integer GEMM"
    x = rng.standard_normal((8, 48)).astype(np.float32)
    assert_matches(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0], "one-step", model)


def test_int4_weights_blocked_along_k_match_the_reference(rng):
    model = _qdq_matmul_int4_weights(rng, block=16)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x = rng.standard_normal((8, 48)).astype(np.float32)
    assert_matches(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0], "one-step", model)


def _dq_uint4_input():
    return _model([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.UINT4, [6])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
                  [numpy_helper.from_array(np.array(0.5, np.float32), "s"), _int4_tensor("z", 3, TensorProto.UINT4)])


def test_uint4_inputs_as_ml_dtypes_or_carrier_values():
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_dq_uint4_input()), target="native")
    assert compiled.inputs[0].narrow == "uint4" and compiled.inputs[0].dtype == "uint8"
    x = np.array([0, 1, 3, 7, 14, 15], ml_dtypes.uint4)
    want = (x.astype(np.float32) - 3) * 0.5
    np.testing.assert_array_equal(compiled(x)[0], want)
    np.testing.assert_array_equal(compiled(x.astype(np.uint8))[0], want)
    with pytest.raises(InputError, match=r"uint4 values must lie in \[0, 15\]"):
        compiled(np.array([0, 1, 2, 3, 4, 16], np.uint8))
    with pytest.raises(InputError, match="expected dtype uint4"):
        compiled(np.zeros(6, np.float32))


def test_quantize_to_int2_saturates_to_its_range():
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                   [helper.make_tensor_value_info("y", TensorProto.INT2, [5])],
                   [numpy_helper.from_array(np.array(1.0, np.float32), "s"), _int4_tensor("z", 0, TensorProto.INT2)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    y = compiled(np.array([-100, -2, 0.4, 1, 100], np.float32))[0]
    assert y.dtype == ml_dtypes.int2
    np.testing.assert_array_equal(y.astype(np.int8), [-2, -2, 0, 1, 1])


def test_unsupported_narrow_forms_are_named():
    cast = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT4)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.INT4, [4])], [])
    with pytest.raises(UnsupportedOperatorError, match="Cast to int4"):
        tvm_lowprec.from_onnx(cast)
    blocked = _model([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4)],
                     [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 8])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                     [numpy_helper.from_array(np.ones((2, 3), np.float32), "s")])
    with pytest.raises(Exception, match=r"blocked scale: shape \[2, 3\] .* block_size 4 .*expected \[2, 2\]"):
        tvm_lowprec.from_onnx(blocked)


@pytest.mark.parametrize("zero_point", [0.0, 0.5, -1.5])
def test_quantize_to_float4_matches_the_reference_on_every_tie(zero_point, rng):
    """float4 e2m1 (carried as float8 e4m3fn): its grid's ties and neighbours, beyond +-6,
    infinities and NaN, with a float4 zero point added as ONNX defines."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    ties = (grid[1:] + grid[:-1]) / 2
    x = np.concatenate([grid, ties, np.nextafter(ties, np.float32(9)), np.nextafter(ties, np.float32(-1)),
                        rng.standard_normal(40).astype(np.float32) * 5, np.float32([7, 100, np.inf, -np.inf, np.nan])])
    x = np.concatenate([x, -x]).astype(np.float32)
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT4E2M1, [x.size])],
                   [numpy_helper.from_array(np.array(1.0, np.float32), "s"),  # x itself lands on the ties
                    helper.make_tensor("z", TensorProto.FLOAT4E2M1, [], [zero_point])])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    got = compiled(x)[0]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.dtype == ml_dtypes.float4_e2m1fn
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
