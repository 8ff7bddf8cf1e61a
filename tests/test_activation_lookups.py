"""Single-input activations, as ONNX writes them, become one 256-entry table between a dequantize
and a quantize (:mod:`tvm_lowprec.quant.lookup_tables`).

Each row of :data:`ACTIVATIONS` is one ONNX node with its attributes: the FP32 model is
``x -> MatMul (or Conv) -> <activation> -> MatMul``, quantized by ONNX Runtime's ``quantize_static``
(QDQ, uint8 activations), so the activation's input and output are 8-bit tensors. Compiled for the
native row, the activation must be a table lookup (a lookup kernel, or the lookup folded into the
GEMM's epilogue: a kernel with ``folded`` set) with no float kernel of it left, and the outputs must be
within one quantization step of ONNX Runtime running the same QDQ file as written
(``ORT_DISABLE_ALL``). The importer's forms differ (``relax.nn.gelu``, ``gelu_tanh``,
``leakyrelu``, ``prelu`` with a one-element slope, compositions of ``exp``/``log``/``where``...):
the rows cover each. A per-channel PRelu slope is not one table (the function depends on the
channel) and stays float; GELU followed by an exporter's Reshape (the Reshape, not the GELU, carries
the quantize) is one table too.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from reference import assert_within_one_step, for_ort, ort_session, output_scale


def _row(name, op, opset=20, consts=(), layer="matmul", inputs="normal", **attrs):
    """``consts``: (name, value) initializers after the activation's input (PRelu's slope, Clip's
    bounds); ``inputs="positive"``: the activation's input kept > 0 (Log, Sqrt, Reciprocal)."""
    return pytest.param(dict(op=op, opset=opset, consts=consts, layer=layer, inputs=inputs, attrs=attrs), id=name)


ACTIVATIONS = [
    _row("gelu", "Gelu"),
    _row("gelu-tanh", "Gelu", approximate="tanh"),
    _row("gelu-conv", "Gelu", layer="conv"),
    _row("hardswish", "HardSwish"),
    _row("hardsigmoid", "HardSigmoid", alpha=0.25, beta=0.4),
    _row("mish", "Mish"),
    _row("softplus", "Softplus"),
    _row("softsign", "Softsign"),
    _row("elu", "Elu", alpha=0.8),
    _row("selu", "Selu"),
    _row("celu", "Celu", alpha=1.5),
    _row("leakyrelu", "LeakyRelu", alpha=0.1),
    _row("thresholdedrelu", "ThresholdedRelu", alpha=0.3),
    _row("prelu-scalar", "PRelu", consts=(("slope", np.float32(0.2)),)),
    _row("prelu-one-element", "PRelu", consts=(("slope", np.array([0.3], np.float32)),)),
    _row("prelu-one-element-conv", "PRelu", consts=(("slope", np.full((1, 1, 1), 0.3, np.float32)),), layer="conv"),
    _row("swish", "Swish", opset=24, alpha=1.5),
    _row("tanh", "Tanh"),
    _row("sigmoid", "Sigmoid"),
    _row("exp", "Exp"),
    _row("log", "Log", inputs="positive"),
    _row("sqrt", "Sqrt", inputs="positive"),
    _row("reciprocal", "Reciprocal", inputs="positive"),
    _row("neg", "Neg"),
    _row("abs", "Abs"),
    _row("clip", "Clip", consts=(("lo", np.float32(-0.5)), ("hi", np.float32(1.0)))),
    _row("relu", "Relu"),
    _row("erf", "Erf"),
    _row("sin", "Sin"),
    _row("cos", "Cos"),
    # after a convolution: the activations the layout pass does not know keep a transpose before them
    # (NHWC -> NCHW), which the table's codes then take instead of the floats
    _row("leakyrelu-conv", "LeakyRelu", layer="conv", alpha=0.2),
    _row("gelu-tanh-conv", "Gelu", layer="conv", approximate="tanh"),
    _row("mish-conv", "Mish", layer="conv"),
    _row("hardswish-conv", "HardSwish", layer="conv"),
    _row("sin-conv", "Sin", layer="conv"),
]

SHAPE = {"matmul": (1, 64, 32), "conv": (1, 4, 8, 8)}
# tokens of a kernel name that mean a float activation (or a piece of one) still runs
FLOAT_TOKENS = {"gelu", "tanh", "sigmoid", "erf", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "leaky", "relu", "prelu",
                "softplus", "silu", "clip", "divide", "multiply", "add", "subtract", "maximum", "minimum", "negative",
                "abs", "greater", "where", "power", "cast"}


def _fp32(op, opset, consts, layer, inputs, attrs, per_channel_slope=None):
    rng = np.random.default_rng(0)
    positive = inputs == "positive"
    inits, nodes = [], []
    if layer == "conv":  # [1, 4, 8, 8] -> Conv 3x3 -> [1, 8, 8, 8]; the MatMul after reads the last axis (8)
        w = rng.uniform(0.05, 1, (8, 4, 3, 3)) / 6 if positive else rng.standard_normal((8, 4, 3, 3)) / 6
        inits.append(numpy_helper.from_array(w.astype(np.float32), "W1"))
        nodes.append(helper.make_node("Conv", ["x", "W1"], ["h"], pads=[1, 1, 1, 1]))
        width = 8
    else:  # [1, 64, 32] -> MatMul -> [1, 64, 48]
        w = rng.uniform(0.05, 1, (32, 48)) / 6 if positive else rng.standard_normal((32, 48)) / np.sqrt(32)
        inits.append(numpy_helper.from_array(w.astype(np.float32), "W1"))
        nodes.append(helper.make_node("MatMul", ["x", "W1"], ["h"]))
        width = 48
    inits += [numpy_helper.from_array(np.asarray(v), name) for name, v in consts]
    nodes.append(helper.make_node(op, ["h", *(name for name, _ in consts)], ["a"], **attrs))
    inits.append(numpy_helper.from_array((rng.standard_normal((width, 16)) / np.sqrt(width)).astype(np.float32), "W2"))
    nodes.append(helper.make_node("MatMul", ["a", "W2"], ["y"]))
    graph = helper.make_graph(nodes, op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE[layer]))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _inputs(rng, layer, inputs, n):
    if inputs == "positive":
        return [rng.uniform(0.5, 1.5, SHAPE[layer]).astype(np.float32) for _ in range(n)]
    return [(rng.standard_normal(SHAPE[layer]) * 1.5).astype(np.float32) for _ in range(n)]


def quantize_qdq(model, samples):
    """ONNX Runtime's ``quantize_static`` as ``models.quantize_qdq`` calls it (QDQ, MinMax, uint8
    activations, int8 per-channel weights), keeping Relu and Clip: by default it drops them where the
    quantized range after them does their work, and there would be nothing left to look up."""
    import os
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": s} for s in samples])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "qdq.onnx")
        onnx.save(for_ort(model), src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        extra_options={"QDQKeepRemovableActivations": True})
        return onnx.load(dst)


def _quantized(row):
    rng = np.random.default_rng(1)
    model = _fp32(row["op"], row["opset"], row["consts"], row["layer"], row["inputs"], row["attrs"])
    qdq = quantize_qdq(model, _inputs(rng, row["layer"], row["inputs"], 8))
    (act,) = [n for n in qdq.graph.node if n.op_type == row["op"]]
    # its input and its output quantized: it reads a DequantizeLinear, a QuantizeLinear reads it
    assert _producer(qdq, act.input[0]) == "DequantizeLinear", [n.op_type for n in qdq.graph.node]
    assert _readers(qdq, act.output[0]) == ["QuantizeLinear"], [n.op_type for n in qdq.graph.node]
    return qdq


def _producer(model, name):
    return next(n.op_type for n in model.graph.node if name in n.output)


def _readers(model, name):
    return [n.op_type for n in model.graph.node if name in n.input]


def _float_kernels(compiled):
    """The kernels whose name says a float activation still runs (``fused_dequantize_gelu_quantize``)."""
    out = []
    for k in compiled.kernels():
        tokens = {t.rstrip("0123456789") for t in k.name.split("_")}
        if k.folded is None and tokens & FLOAT_TOKENS:
            out.append(k.name)
    return out


def _tables(compiled):
    """The kernels that run a table: lookup kernels, and GEMMs with a lookup in their epilogue."""
    return [k for k in compiled.kernels() if k.folded is not None]


def _check_against_ort(compiled, qdq, layer, inputs):
    rng = np.random.default_rng(2)
    session = ort_session(qdq, optimized=False)
    for x in _inputs(rng, layer, inputs, 3):
        got, want = compiled(x)[0], session.run(None, {"x": x})[0]
        assert got.shape == want.shape
        assert_within_one_step(got, want, output_scale(qdq))


@pytest.mark.parametrize("row", ACTIVATIONS)
def test_activation_is_one_table_and_matches_ort(row):
    qdq = _quantized(row)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    kernels = [(k.name, k.op, k.folded) for k in compiled.kernels()]
    assert len(_tables(compiled)) == 1, kernels
    assert not _float_kernels(compiled), kernels
    _check_against_ort(compiled, qdq, row["layer"], row["inputs"])


def test_per_channel_prelu_slope_is_not_a_table():
    """A slope per channel makes the function depend on the channel: no single table, the float
    chain stays (and is still right)."""
    row = dict(op="PRelu", opset=20, consts=(("slope", np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], np.float32)
                                                .reshape(8, 1, 1)),), layer="conv", inputs="normal", attrs={})
    qdq = _quantized(row)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    kernels = [(k.name, k.op, k.folded) for k in compiled.kernels()]
    assert not _tables(compiled), kernels
    assert any("prelu" in name for name in _float_kernels(compiled)), kernels
    _check_against_ort(compiled, qdq, "conv", "normal")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_before_an_exporters_reshape_is_one_table(approximate):
    """The exporter's ``Reshape -> Gemm -> Reshape -> Gelu -> Reshape -> Gemm`` (a Linear on a 4-D
    tensor): ``quantize_static`` quantizes the Reshape after the GELU, not the GELU, so the float
    chain is ``dequantize -> gelu -> reshape -> quantize``; the reshape keeps the elements' order, so
    it is still one table (it ran as ``fused_dequantize_gelu_reshape_quantize`` before)."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((32, 48)) / np.sqrt(32)).astype(np.float32)
    w2 = (rng.standard_normal((48, 16)) / np.sqrt(48)).astype(np.float32)
    shapes = {"to2d": [-1, 32], "to4d": [1, 8, 8, 48], "to2d_b": [-1, 48]}
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items()]
    nodes = [helper.make_node("Reshape", ["x", "to2d"], ["x2"]), helper.make_node("Gemm", ["x2", "W1"], ["h2"]),
             helper.make_node("Reshape", ["h2", "to4d"], ["h"]), helper.make_node("Gelu", ["h"], ["a"], approximate=approximate),
             helper.make_node("Reshape", ["a", "to2d_b"], ["a2"]), helper.make_node("Gemm", ["a2", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "linear4d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    qdq = quantize_qdq(model, [rng.standard_normal((1, 8, 8, 32)).astype(np.float32) for _ in range(8)])
    (gelu,) = [n for n in qdq.graph.node if n.op_type == "Gelu"]
    assert _readers(qdq, gelu.output[0]) == ["Reshape"]  # the GELU's own output is not quantized
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    kernels = [(k.name, k.op, k.folded) for k in compiled.kernels()]
    assert len(_tables(compiled)) == 1 and not _float_kernels(compiled), kernels
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal((1, 8, 8, 32)).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq))


def _transposed_chain(same_order: bool):
    """``q(d * sigmoid(t))`` with ``d = dequantize(x)`` and ``t`` its transpose (a function of each
    element only if both factors are in the same order: ``t * sigmoid(t)``), as Relax."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((4, 4), "uint8"))
    scale, zp = relax.const(np.float32(0.05)), relax.const(np.uint8(128))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.dequantize(x, scale, zp, -1, "float32"))
            t = bb.emit(relax.op.permute_dims(d, [1, 0]))
            s = bb.emit(relax.op.sigmoid(t))
            m = bb.emit(relax.op.multiply(t if same_order else d, s))
            out = bb.emit_output(relax.op.quantize(m, scale, zp, -1, "uint8"))
        bb.emit_func_output(out)
    return bb.get()["main"]


@pytest.mark.parametrize("same_order", [True, False])
def test_transposed_values_meet_only_in_the_same_order(same_order):
    """A transpose on the chain is replayed on the table's codes; ``d * sigmoid(transpose(d))`` pairs
    different elements (not a function of one element) and is not a table."""
    from tvm_lowprec.quant.lookup_tables import find_chains

    chains, _ = find_chains(_transposed_chain(same_order), min_ops=2)
    if same_order:
        (chain,) = chains
        assert chain.transposes == (((4, 4), (1, 0)),) and chain.shape == (4, 4)
    else:
        assert not chains
