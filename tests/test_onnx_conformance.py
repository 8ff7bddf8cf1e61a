"""ONNX's own conformance cases for the quantization operators, through from_onnx + compile.

Each case runs twice: as shipped (every operand a runtime input: the exact generic path) and with
every input but the first bound as an initializer (constant weights and parameters: the packed,
tensorized kernel). Both must give the expected outputs exactly, dtype and shape included.
"""

import numpy as np
import onnx
import pytest
from conformance import load_cases
from onnx import numpy_helper

import tvm_lowprec

CASES = load_cases()


def _bind_all_but_first(model, inputs):
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    names = [i.name for i in model.graph.input]
    keep = bound.graph.input[0]
    del bound.graph.input[1:]
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    for name, value in zip(names[1:], inputs[1:]):
        value = np.asarray(value)
        if value.dtype.name == "float4_e2m1fn":  # numpy_helper.from_array has no float4
            tensor = onnx.helper.make_tensor(name, types[name], value.shape, value.astype(np.float32).ravel().tolist())
        else:
            tensor = numpy_helper.from_array(value, name)
        bound.graph.initializer.append(tensor)
    assert bound.graph.input[0] == keep
    return bound, inputs[:1]


def _check(model, inputs, expected):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    got = compiled(*[np.asarray(x) for x in inputs])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)
    return compiled


def test_all_claimed_cases_exist():
    assert len(CASES) >= 14


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_as_shipped(case):
    inputs, expected = case.data_sets[0]
    _check(case.model, inputs, expected)


@pytest.mark.parametrize("case", [c for c in CASES if len(c.data_sets[0][0]) > 1], ids=lambda c: c.name)
def test_with_constant_weights(case):
    """Every input but the first bound as an initializer: weights, scales and zero points constant."""
    inputs, expected = case.data_sets[0]
    model, runtime_inputs = _bind_all_but_first(case.model, inputs)
    compiled = _check(model, runtime_inputs, expected)
    if "matmul" not in case.name and "conv" not in case.name:
        return  # Q/DQ: constant parameters, nothing more to check
    if np.asarray(inputs[3 if "qlinear" in case.name else 1]).ndim == 3:
        return  # a 3-D constant B is a batch of different weights: the generic exact path
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert all(k.name.startswith("qconv2d") == ("conv" in case.name) for k in gemms)
    assert gemms, "constant weights must take the tensorized integer kernel"
    assert all(k.intrinsic.startswith("lowprec_") for k in gemms)
