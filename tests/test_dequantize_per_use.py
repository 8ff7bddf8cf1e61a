"""A dequantized tensor read by several operators is dequantized inside each of their kernels
(:mod:`tvm_lowprec.quant.dequantize_per_use`): no kernel writes it as float32."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from reference import assert_within_one_step, ort_session


def _squeeze_excite():
    """x -> Q/DQ -> (global average pool -> Q/DQ -> HardSigmoid -> Q/DQ) * x -> Q: the gate and the
    multiply read the same dequantized tensor, as in a MobileNetV3 block."""
    consts = {"s": np.float32(0.05), "z": np.array(128, np.uint8), "sg": np.float32(0.02), "zg": np.array(10, np.uint8),
              "sh": np.float32(1 / 255), "zh": np.array(0, np.uint8), "so": np.float32(0.04), "zo": np.array(120, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("GlobalAveragePool", ["xd"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "sg", "zg"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "sg", "zg"], ["gd"]),
             helper.make_node("HardSigmoid", ["gd"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "sh", "zh"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "sh", "zh"], ["hd"]),
             helper.make_node("Mul", ["xd", "hd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def test_a_squeeze_excite_block_reads_the_codes_twice(rng):
    model = _squeeze_excite()
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = compiled.kernels()
    full = 16 * 24 * 24
    # the gate's multiply reads the codes themselves (int32 fixed point on the codes of both operands,
    # quant/integer_binary.py); only the pool's input is written as float32 (a mean takes no fused
    # producer in TVM: see the pass)
    assert sum(k.writes is not None and k.writes > full for k in kernels) <= 1, kernels
    assert any("multiply" in k.name and "dequantize" not in k.name and k.reads <= full + 64 for k in kernels), kernels
    x = (rng.standard_normal((1, 16, 24, 24)) * 2).astype(np.float32)
    want = ort_session(model, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(compiled(x)[0], want, 1.0)  # codes; the pool's float sum in another order: a step at ties
