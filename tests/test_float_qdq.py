"""A quantize/dequantize pair inside a float chain rounds in float32 (:mod:`tvm_lowprec.quant.float_qdq`):
the same codes as the pair through 8-bit codes, ties to even included, exactly; pairs whose codes are
needed elsewhere, or whose input may be NaN, keep the codes."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
import tvm_lowprec.pipeline as pipeline

SHAPE = (1, 37, 48)  # NWC: a channel per innermost position


def _chain(codes_input: bool, second_reader: bool = False, seed: int = 0):
    """x -> [DQ] -> Mul(g) -> Q/DQ -> Mul(h) -> Q/DQ -> Mul(k) -> Q, per-channel constants (a group norm's
    affine steps quantized as ORT's QDQ files have them: float chains no integer rewrite takes).
    ``codes_input``: x is uint8 codes (bounded values; with ``g`` in {0.5, 1, 1.5} and the first pair's
    scale 0.25, odd codes land on ties); else float32 (a graph input: NaN possible). ``second_reader``:
    the first pair's codes are also an output."""
    rng = np.random.default_rng(seed)
    c = SHAPE[-1]
    consts = {"s_in": np.float32(0.5), "z_in": np.uint8(0),
              "g": rng.choice(np.float32([0.5, 1.0, 1.5]), c).astype(np.float32), "s1": np.float32(0.25), "z1": np.uint8(3),
              "h": (0.5 + rng.random(c)).astype(np.float32), "s2": np.float32(0.375), "z2": np.uint8(128),
              "k": (rng.random(c) * 2 - 1).astype(np.float32), "s3": np.float32(0.0625), "z3": np.uint8(128)}
    first = [helper.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["xf"])] if codes_input else \
        [helper.make_node("Identity", ["x"], ["xf"])]
    nodes = first + [
        helper.make_node("Mul", ["xf", "g"], ["m1"]),
        helper.make_node("QuantizeLinear", ["m1", "s1", "z1"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
        helper.make_node("Mul", ["d1", "h"], ["m2"]),
        helper.make_node("QuantizeLinear", ["m2", "s2", "z2"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["d2"]),
        helper.make_node("Mul", ["d2", "k"], ["m3"]),
        helper.make_node("QuantizeLinear", ["m3", "s3", "z3"], ["y"])]
    elem = TensorProto.UINT8 if codes_input else TensorProto.FLOAT
    outputs = [helper.make_tensor_value_info("y", TensorProto.UINT8, list(SHAPE))]
    if second_reader:
        outputs.append(helper.make_tensor_value_info("q1", TensorProto.UINT8, list(SHAPE)))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", elem, list(SHAPE))], outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def _input(codes_input, rng):
    if codes_input:
        return rng.integers(0, 256, SHAPE).astype(np.uint8)
    x = (rng.standard_normal(SHAPE) * 20).astype(np.float32)
    x.flat[::7] = (np.round(x.flat[::7]) + 0.5) * 0.25  # ties for the first quantize where g is 1
    return x


def _rounds_in_float(compiled) -> int:
    return sum(k.name.count("round") for k in compiled.kernels())


@pytest.mark.parametrize("codes_input", [True, False], ids=["codes", "float-input"])
def test_pairs_inside_a_float_chain_give_the_codes_of_the_graph(codes_input, rng, monkeypatch):
    model = _chain(codes_input)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    # codes in: both pairs are bounded; a float graph input may be NaN: its first pair keeps the codes
    # (ORT sends NaN to the lowest code), the one after it is bounded again
    assert _rounds_in_float(compiled) == (2 if codes_input else 1), [k.name for k in compiled.kernels()]
    x = _input(codes_input, rng)
    got = compiled(x)[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    monkeypatch.setattr(pipeline, "FINISH", tuple(p for p in pipeline.FINISH if p[0] != "float_qdq"))
    through_codes = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert _rounds_in_float(through_codes) == 0
    np.testing.assert_array_equal(got, through_codes(x)[0])


def test_ties_round_to_even(rng):
    """Odd codes times 0.5 x 1.5 / 0.25 are ties for the first quantize: rint, not half away."""
    model = _chain(True)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x = np.arange(256, dtype=np.uint8)[np.arange(int(np.prod(SHAPE))) % 256].reshape(SHAPE)
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_codes_another_operator_reads_stay_codes(rng):
    model = _chain(True, second_reader=True)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert _rounds_in_float(compiled) == 1  # the pair whose codes are an output keeps them
    x = _input(True, rng)
    got = compiled(x)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
