"""A float GELU or sigmoid left between quantized layers (its output not quantized again, so no lookup
table) runs TVM's vectorizable erf/tanh/exp polynomial, not a libm call per element
(tvm_lowprec.quant.fast_math); within float rounding of ONNX's reference, as TVM's own operator with
``fast_math=False``."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec


def _dequantized(approximate: str):
    """u8 codes -> DequantizeLinear -> Gelu (opset 20; ``approximate`` "sigmoid": Sigmoid) -> a float output."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"]),
             helper.make_node("Sigmoid", ["d"], ["y"]) if approximate == "sigmoid" else
             helper.make_node("Gelu", ["d"], ["y"], approximate=approximate)]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 768])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("approximate", ["none", "tanh", "sigmoid"])
def test_a_float_activation_runs_the_polynomial_not_libm(approximate, rng):
    model = _dequantized(approximate)
    fast = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    exact = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", fast_math=False)
    call = {"none": "T.erf(", "tanh": "T.tanh(", "sigmoid": "T.sigmoid("}[approximate]
    scripts = lambda c: "".join(c._lowered[k.name].script() for k in c.kernels())  # noqa: E731
    assert call not in scripts(fast) and call in scripts(exact)
    x = rng.integers(0, 256, (1, 4, 4, 768)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for compiled in (fast, exact):
        np.testing.assert_allclose(compiled(x)[0], want, rtol=2e-6, atol=2e-6)
