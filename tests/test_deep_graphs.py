"""Graphs as deep as real exports: no walk of ours is bounded by Python's stack.

Real exports (torchvision's deeplabv3, timm's ghostnet, ultralytics' detectors) have 500-3000 nodes after
ONNX Runtime's quantizer; a pass that recursed once per producer stopped them with ``RecursionError``.
These models are written directly in the form ORT's quantizer gives (a Q/DQ pair after every operator),
deeper than any real export, and compiled under Python's default recursion limit.
"""

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_lowprec
from tvm_lowprec.quant.patterns import reads_an_input

from reference import assert_within_one_step, ort_session

DEFAULT_RECURSION_LIMIT = 1000


def _qdq(nodes, name, scale="s", zero="z"):
    nodes += [helper.make_node("QuantizeLinear", [name, scale, zero], [name + "_q"]),
              helper.make_node("DequantizeLinear", [name + "_q", scale, zero], [name + "_dq"])]
    return name + "_dq"


def _model(nodes, inits, x_shape, out, name):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def qdq_chain(n_nodes: int, width: int = 16) -> onnx.ModelProto:
    """``x`` through alternating per-channel Add and Mul, a Q/DQ pair after each, then ``Concat`` with
    the quantized input and a last Q/DQ pair: ``n_nodes`` ONNX nodes (a bias add's integer form at every
    Add, the concatenation's requantization folded onto its two pieces)."""
    rng = np.random.default_rng(0)
    nodes = []
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")]
    cur, i = _qdq(nodes, "x"), 0
    while len(nodes) < n_nodes - 3:
        add = i % 2 == 0
        c = rng.uniform(-0.2, 0.2, width) if add else rng.uniform(0.8, 1.2, width)
        inits.append(numpy_helper.from_array(c.astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node("Add" if add else "Mul", [cur, f"c{i}"], [f"h{i}"]))
        cur, i = _qdq(nodes, f"h{i}"), i + 1
    nodes.append(helper.make_node("Concat", [cur, "x_dq"], ["cat"], axis=1))
    return _model(nodes, inits, (4, width), _qdq(nodes, "cat"), "chain")


def qdq_layers(layers: int, width: int = 32, rows: int = 8) -> onnx.ModelProto:
    """``layers`` x (MatMul by an int8 per-column weight, Q/DQ, Relu, Q/DQ), as ORT's quantizer writes them."""
    rng = np.random.default_rng(0)
    nodes = []
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             [("s", 0.05, np.float32), ("z", 0, np.uint8), ("sx", 0.05, np.float32), ("zx", 128, np.uint8)]]
    cur = _qdq(nodes, "x", "sx", "zx")
    for i in range(layers):
        # weight scales keep each layer's output about as wide as its input (sx's range)
        ws = rng.uniform(0.5, 1.5, width) * 2.0 / (127 * width**0.5)
        inits += [numpy_helper.from_array(rng.integers(-127, 128, (width, width)).astype(np.int8), f"w{i}"),
                  numpy_helper.from_array(ws.astype(np.float32), f"ws{i}"),
                  numpy_helper.from_array(np.zeros(width, np.int8), f"wz{i}")]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"w{i}_dq"], axis=1))
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}_dq"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [_qdq(nodes, f"m{i}", "sx", "zx")], [f"r{i}"]))
        cur = _qdq(nodes, f"r{i}")
    return _model(nodes, inits, (rows, width), cur, "layers")


@pytest.fixture
def default_recursion_limit():
    """Python's default limit, whatever the test runner set."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(old)


def test_reads_an_input_walks_a_chain_far_deeper_than_the_stack(default_recursion_limit):
    """5000 producers between the function's parameter and the value asked about."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            for _ in range(5000):
                value = bb.emit(relax.op.add(value, relax.const(1.0)))
            constant = bb.emit(relax.op.add(relax.const(np.ones(4, np.float32)), relax.const(1.0)))
            out = bb.emit_output(relax.Tuple([value, constant]))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    table = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    assert reads_an_input(value, table.get)
    assert not reads_an_input(constant, table.get)


@pytest.mark.parametrize("name, model, x_shape", [
    ("chain of 3000 nodes", lambda: qdq_chain(3000), (4, 16)),
    ("300 layers", lambda: qdq_layers(300), (8, 32)),
])
def test_a_graph_deeper_than_any_export_compiles_under_the_default_limit(name, model, x_shape, tmp_path,
                                                                         default_recursion_limit):
    model = model()
    path = tmp_path / "deep.onnx"
    onnx.save(model, path)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native")
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    got, = compiled(x)
    want, = ort_session(model, optimized=False).run(None, {"x": x})
    assert_within_one_step(got, want, 0.05)
