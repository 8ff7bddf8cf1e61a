"""The mean of a dequantized 8-bit tensor is an integer sum of its codes (:mod:`tvm_lowprec.quant.integer_mean`):
the pool reads the codes, and the result is the exact sum's arithmetic in float32, within one
quantization step of ONNX Runtime's float32 sum."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from reference import assert_within_one_step, ort_session

SHAPE = (1, 30, 20, 24)  # NHWC, as propagate_layout leaves a squeeze-excite pool


def _pool_model(dtype, zero_point, axes=(1, 2), scale=0.05, per_channel=False):
    """x -> Q/DQ -> ReduceMean over ``axes`` -> Q: a squeeze-excite block's pool (NHWC: H and W)."""
    elem = TensorProto.UINT8 if dtype == "uint8" else TensorProto.INT8
    s = np.full(SHAPE[-1], scale, np.float32) if per_channel else np.float32(scale)
    z = np.full(SHAPE[-1], zero_point, dtype) if per_channel else np.array(zero_point, dtype)
    consts = {"s": s, "z": z, "so": np.float32(0.013), "zo": np.array(3, dtype)}
    axis = {"axis": 3} if per_channel else {}
    pool = helper.make_node("ReduceMean", ["xd", "axes"], ["g"], keepdims=0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], **axis),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], **axis), pool,
             helper.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def _exact(codes, zero_point, scale, out_scale, out_zero, dtype):
    """The pass's arithmetic in numpy: the integer sum exact, then float32 as the kernel computes it."""
    n = codes.shape[1] * codes.shape[2]
    total = codes.astype(np.int64).sum(axis=(1, 2)) - n * zero_point
    mean = (total.astype(np.float32) * np.float32(scale)) / np.float32(n)
    info = np.iinfo(dtype)
    return np.clip(np.rint(mean / np.float32(out_scale)) + out_zero, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("dtype,zero_point", [("uint8", 128), ("uint8", 0), ("int8", -7)])
def test_a_pool_of_dequantized_codes_sums_the_codes(dtype, zero_point, rng):
    model = _pool_model(dtype, zero_point)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = compiled.kernels()
    full = int(np.prod(SHAPE))
    assert not any(k.op == "dequantize" for k in kernels), kernels
    (pool,) = [k for k in kernels if "sum" in k.name]
    assert pool.schedule != "none", pool  # the reduction rule took it (quant/integer_mean.py)
    x = (rng.standard_normal(SHAPE) * 3 + 1).astype(np.float32)
    got = compiled(x)[0]
    codes = ort_session(_codes_model(model), optimized=False).run(None, {"x": x})[0]
    want = _exact(codes, zero_point, 0.05, 0.013, 3, dtype)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    onnx_runtime = ort_session(model, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(got, onnx_runtime, 1.0)  # ORT sums float32 values: a step apart at most


def _codes_model(model):
    """The same model up to the quantized input (its codes)."""
    graph = helper.make_graph([model.graph.node[0]], "codes", list(model.graph.input),
                              [helper.make_tensor_value_info("xq", model.graph.output[0].type.tensor_type.elem_type, None)],
                              [i for i in model.graph.initializer if i.name in ("s", "z")])
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


@pytest.mark.parametrize("case", ["per-channel", "innermost"])
def test_others_keep_the_float_mean(case, rng):
    """Per-channel parameters, and a reduction along the innermost axis (a row reduction: no integer
    rule of ours), keep the float mean."""
    model = _pool_model("uint8", 128, per_channel=True) if case == "per-channel" else _pool_model("uint8", 128, axes=(2, 3))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert not any("sum" in k.name for k in compiled.kernels()), compiled.kernels()
    x = rng.standard_normal(SHAPE).astype(np.float32)
    assert_within_one_step(compiled(x)[0], ort_session(model, optimized=False).run(None, {"x": x})[0], 1.0)
