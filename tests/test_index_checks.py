"""A Gather's run-time indices are checked (:mod:`tvm_lowprec.index_checks`): in range they give ORT's
result (negative ones wrapped as ONNX defines), out of range the call raises, naming the Gather and
its extent, and the process and the compiled model go on working."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

ROWS, WIDTH = 40, 16


def _embedding_model(rng, index_dtype=TensorProto.INT64):
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
                               helper.make_node("Relu", ["rows"], ["y"])], "embedding",
                              [helper.make_tensor_value_info("ids", index_dtype, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_indices_are_checked(index_dtype, rng):
    model = _embedding_model(rng, helper.np_dtype_to_tensor_dtype(np.dtype(index_dtype)))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert any(k.op == "check_indices" for k in compiled.kernels()), compiled.kernels()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    good = np.array([[0, 5, ROWS - 1], [-1, -ROWS, 7]], index_dtype)  # negative: from the end, as ONNX says
    np.testing.assert_array_equal(compiled(good)[0], session.run(None, {"ids": good})[0])
    for bad in (ROWS, ROWS + 1000, -ROWS - 1):
        ids = good.copy()
        ids[1, 2] = bad
        with pytest.raises(Exception, match=rf"Gather.*outside \[0, {ROWS}\)"):
            compiled(ids)
    np.testing.assert_array_equal(compiled(good)[0], session.run(None, {"ids": good})[0])  # still usable
