"""Adds, subtractions and multiplies of two 8-bit quantized tensors on their codes, in int32 fixed point
(:mod:`tvm_lowprec.quant.integer_binary`): against ``onnx.reference``, exhaustively over every pair of
codes, and the cases that keep the float graph."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec.quant.integer_binary import TIE_BAND, _exact, _float_graph, _integer, integer_form

ONNX_TYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def qdq_binary(op, a_shape, b_shape, a=(0.05, 128, "uint8"), b=(0.02, 100, "uint8"), y=(0.07, 120, "uint8"),
               b_constant=None):
    """DequantizeLinear(a), DequantizeLinear(b) -> Add, Sub or Mul (numpy broadcasting) -> QuantizeLinear."""
    inits = []
    for name, (scale, zp, dtype) in {"a": a, "b": b, "y": y}.items():
        inits += [numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                  numpy_helper.from_array(np.array(zp, dtype=dtype), f"{name}_z")]
    inputs = [helper.make_tensor_value_info("a", ONNX_TYPE[a[2]], list(a_shape))]
    if b_constant is None:
        inputs.append(helper.make_tensor_value_info("b", ONNX_TYPE[b[2]], list(b_shape)))
    else:
        inits.append(numpy_helper.from_array(b_constant.astype(b[2]), "b"))
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    nodes = [helper.make_node("DequantizeLinear", ["a", "a_s", "a_z"], ["af"]),
             helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["bf"]),
             helper.make_node(op, ["af", "bf"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    graph = helper.make_graph(nodes, "binary", inputs, [helper.make_tensor_value_info("y", ONNX_TYPE[y[2]], list(out_shape))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _codes(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


CASES = {
    "residual-add": ("Add", (1, 16, 16, 8), (1, 16, 16, 8), {}),
    "fpn-add-int8": ("Add", (1, 8, 8, 24), (1, 8, 8, 24), dict(a=(0.3, -3, "int8"), b=(0.45, 10, "int8"),
                                                               y=(0.63, 0, "int8"))),
    "box-subtract-int8": ("Sub", (1, 2, 400), (1, 2, 400), dict(a=(0.25, -7, "int8"), b=(0.2, 4, "int8"),
                                                                 y=(0.35, 2, "int8"))),
    "se-gate-multiply": ("Mul", (1, 12, 12, 16), (1, 1, 1, 16), dict(a=(0.04, 110, "uint8"), b=(1 / 255, 0, "uint8"),
                                                                     y=(0.025, 105, "uint8"))),
    "multiply-saturating": ("Mul", (4, 64), (4, 64), dict(a=(0.5, 128, "uint8"), b=(0.5, 128, "uint8"),
                                                          y=(0.01, 128, "uint8"))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_binary_op_of_two_8bit_tensors_runs_on_the_codes_within_one_step_of_onnx(name, rng):
    op, a_shape, b_shape, params = CASES[name]
    model = qdq_binary(op, a_shape, b_shape, **params)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (kernel,) = compiled.kernels()
    source = compiled._lowered[kernel.name].script()
    assert "float32" not in source and "right_shift" in kernel.name, kernel.name  # no float computed
    a_dtype, b_dtype = params.get("a", (0, 0, "uint8"))[2], params.get("b", (0, 0, "uint8"))[2]
    session = ReferenceEvaluator(model)
    for _ in range(3):
        a, b = _codes(rng, a_shape, a_dtype), _codes(rng, b_shape, b_dtype)
        want = session.run(None, {"a": a, "b": b})[0]
        got = compiled(a, b)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, (diff.max(), (diff == 0).mean())
    if name == "multiply-saturating":
        assert {0, 255} <= set(np.unique(got))  # both ends reached, not wrapped


@pytest.mark.parametrize("kind", ["add", "subtract", "multiply"])
def test_the_integer_form_matches_the_float_graph_on_every_pair_of_codes_but_ties(kind):
    """Random scales and zero points: every accepted form gives the float graph's code on all 65536
    pairs except pairs whose exact value lies within TIE_BAND of a tie, and those by one step."""
    rng = np.random.default_rng(7)
    accepted = 0
    for _ in range(25):
        sa, sy = np.exp(rng.uniform(-5, 0, 2))
        sb = rng.uniform(1 / 300, 1 / 200) if kind == "multiply" else np.exp(rng.uniform(-5, 0))
        za, zb, zy = (int(z) for z in rng.integers(0, 256, 3))
        form = integer_form(kind, "uint8", sa, za, "uint8", sb, zb, "uint8", sy, zy)
        if form is None:
            continue
        accepted += 1
        a, b = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
        want = _float_graph(kind, a, b, sa, za, sb, zb, sy, zy, 0, 255)
        got = _integer(form, a, b)
        differ = got != want
        assert int(differ.sum()) == form.ties
        exact = _exact(kind, a, b, sa, za, sb, zb, sy, zy)[differ]
        assert np.all(np.abs(exact - np.floor(exact) - 0.5) <= TIE_BAND)
        assert np.abs(got - want).max() <= 1
    assert accepted >= 20  # the realistic scales all fit int32


def test_the_integer_form_declines_what_int32_cannot_hold():
    # sa / sy = 1e6 leaves 3 fractional bits in int32 for the other operand's 12.3: off by steps
    assert integer_form("add", "uint8", 1000.3, 7, "uint8", 0.0123, 100, "uint8", 0.001, 3) is None
    # powers of two are exact at any shift
    assert integer_form("add", "uint8", 2.0**10, 0, "uint8", 1.0, 0, "uint8", 2.0**-10, 0).ties == 0


def test_a_constant_operand_or_per_channel_parameters_keep_the_float_graph(rng):
    constant = qdq_binary("Mul", (1, 4, 4, 8), (1, 1, 1, 8), b_constant=rng.integers(0, 256, (1, 1, 1, 8)))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(constant), target="native")
    assert not any("right_shift" in k.name for k in compiled.kernels())
    model = qdq_binary("Add", (1, 4, 4, 8), (1, 4, 4, 8))
    scale = next(i for i in model.graph.initializer if i.name == "a_s")
    scale.CopyFrom(numpy_helper.from_array(np.linspace(0.01, 0.08, 8).astype(np.float32), "a_s"))
    zero = next(i for i in model.graph.initializer if i.name == "a_z")
    zero.CopyFrom(numpy_helper.from_array(np.full(8, 128, np.uint8), "a_z"))
    model.graph.node[0].attribute.append(helper.make_attribute("axis", 3))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert not any("right_shift" in k.name for k in compiled.kernels())
    a, b = rng.integers(0, 256, (1, 4, 4, 8)).astype(np.uint8), rng.integers(0, 256, (1, 4, 4, 8)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
    assert np.abs(compiled(a, b)[0].astype(int) - want.astype(int)).max() <= 1


def _bias_model(bias, x_shape, x=(0.05, 128, "uint8"), y=(0.07, 120, "uint8"), quantized_bias=None):
    """DequantizeLinear(x) + bias -> QuantizeLinear: the bias a float32 constant, or (``quantized_bias``:
    int8 values, scale, zero point) the DequantizeLinear of one, as ONNX Runtime quantizes an Add's bias."""
    inits = [numpy_helper.from_array(np.float32(x[0]), "x_s"), numpy_helper.from_array(np.array(x[1], x[2]), "x_z"),
             numpy_helper.from_array(np.float32(y[0]), "y_s"), numpy_helper.from_array(np.array(y[1], y[2]), "y_z")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["xf"])]
    if quantized_bias is None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "bias"))
    else:
        q, s, z = quantized_bias
        inits += [numpy_helper.from_array(q, "bq"), numpy_helper.from_array(np.float32(s), "b_s"),
                  numpy_helper.from_array(np.array(z, q.dtype), "b_z")]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "b_s", "b_z"], ["bias"]))
    nodes += [helper.make_node("Add", ["xf", "bias"], ["yf"]), helper.make_node("QuantizeLinear", ["yf", "y_s", "y_z"], ["y"])]
    graph = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", ONNX_TYPE[x[2]], list(x_shape))],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[y[2]], list(x_shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("bias_kind", ["float", "quantized"])
def test_a_constant_bias_after_a_quantized_tensor_runs_on_the_codes(bias_kind, rng):
    """A GEMM's output, quantized, then a per-channel float bias added and quantized again (BERT's
    projections as ONNX Runtime quantizes them): ``(A x + C[channel]) >> F`` in int32, no float."""
    shape = (1, 16, 64)
    if bias_kind == "float":
        model = _bias_model((rng.standard_normal(64) * 0.8).astype(np.float32), shape)
    else:
        model = _bias_model(None, shape, quantized_bias=(rng.integers(-127, 128, 64).astype(np.int8), 0.006, 0))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (kernel,) = compiled.kernels()
    source = compiled._lowered[kernel.name].script()
    assert "float32" not in source and "right_shift" in kernel.name, kernel.name
    x = _codes(rng, shape, "uint8")
    x.reshape(-1)[:256] = np.arange(256)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.999
    assert len(np.unique(got)) > 100


def test_the_bias_form_matches_the_float_graph_on_every_code_and_bias_value_but_ties():
    from tvm_lowprec.quant.integer_binary import bias_form

    rng = np.random.default_rng(11)
    accepted = 0
    for _ in range(25):
        sx, sy = np.exp(rng.uniform(-5, 0, 2))
        zx, zy = (int(z) for z in rng.integers(0, 256, 2))
        v = (rng.standard_normal(48) * sy * 40).astype(np.float32)
        form = bias_form("uint8", sx, zx, v, "uint8", sy, zy)
        if form is None:
            continue
        accepted += 1
        x = np.arange(256)[:, None]
        fx = (x - zx).astype(np.float32) * np.float32(sx)
        want = np.clip(np.rint((fx + v[None, :]) / np.float32(sy)) + zy, 0, 255)
        got = np.clip((form.a * x + form.c.astype(np.int64)[None, :]) >> form.shift, 0, 255)
        differ = got != want
        assert int(differ.sum()) == form.ties
        exact = ((sx * (x - zx) + v[None, :].astype(np.float64)) / sy + zy)[differ]
        assert np.all(np.abs(exact - np.floor(exact) - 0.5) <= TIE_BAND) and np.abs(got - want).max() <= 1
    assert accepted >= 20
