"""ONNX CumSum (RoBERTa's position ids from its attention mask): TVM 0.27 legalizes ``relax.cumsum``
for no device, so a model with one stopped at VM codegen; it runs on :mod:`tvm_lowprec.kernels.scan`,
exactly as ONNX Runtime computes it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from reference import ort_session


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_matches_ort(dtype, axis, exclusive, reverse):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shape = [3, 7, 4]
    graph = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                              "cumsum", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape)],
                              [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).integers(-50, 50, shape).astype(dtype)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    want, = ort_session(model, optimized=False).run(None, {"x": x})
    np.testing.assert_array_equal(compiled(x)[0], want)
    assert [k.op for k in compiled.kernels()].count("cumsum") == 1


def test_position_ids_from_a_mask_as_roberta_computes_them(rng):
    """``cumsum(mask) * mask + padding_idx`` (transformers' create_position_ids_from_input_ids)."""
    nodes = [helper.make_node("CumSum", ["mask", "axis"], ["running"]),
             helper.make_node("Mul", ["running", "mask"], ["masked"]),
             helper.make_node("Add", ["masked", "pad"], ["positions"])]
    graph = helper.make_graph(nodes, "positions", [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 16])],
                              [helper.make_tensor_value_info("positions", TensorProto.INT64, [1, 16])],
                              [numpy_helper.from_array(np.array(1, np.int64), "axis"),
                               numpy_helper.from_array(np.array(1, np.int64), "pad")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mask = (rng.random((1, 16)) > 0.3).astype(np.int64)
    got = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")(mask)[0]
    np.testing.assert_array_equal(got, np.cumsum(mask, axis=1) * mask + 1)
