"""Softmax and layer norm of 8-bit tensors as 8-bit-in, 8-bit-out kernels (tvm_lowprec.quant.row_ops).
Softmax: integer row maximum, exponentials computed in the lanes (or, on a row with a register
permute, from two 16-entry tables), float32 sum, division and QuantizeLinear rounding. Layer norm: exact integer sums of the row and its squares, float64 row statistics, float32
per element. Compared with onnx.reference running DequantizeLinear -> op -> QuantizeLinear as written."""

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec.emulation import execution_mode, load_emulated

from conftest import TARGETS, kernel_module

ONNX_TYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _qdq_model(op_node, extra_inits, shape, in_dtype, scale, zero_point, out_dtype, sy, zy):
    inits = [numpy_helper.from_array(np.float32(scale), "sx"), numpy_helper.from_array(np.array(zero_point, in_dtype), "zx"),
             numpy_helper.from_array(np.float32(sy), "sy"), numpy_helper.from_array(np.array(zy, out_dtype), "zy")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]), op_node,
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "row_op", [helper.make_tensor_value_info("x", ONNX_TYPE[in_dtype], shape)],
                              [helper.make_tensor_value_info("y", ONNX_TYPE[out_dtype], shape)], inits + extra_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])  # onnx.reference's DQ: 19+
    model.ir_version = 10
    return model


def qdq_softmax(shape, in_dtype="uint8", scale=0.11, zero_point=131, out_dtype="uint8", axis=-1):
    zy = 0 if out_dtype == "uint8" else -128
    node = helper.make_node("Softmax", ["xf"], ["p"], axis=axis)
    return _qdq_model(node, [], shape, in_dtype, scale, zero_point, out_dtype, 1 / 256, zy)


def qdq_layer_norm(shape, in_dtype="uint8", scale=0.05, zero_point=120, out_dtype="uint8", out_scale=0.03,
                   out_zero_point=128, axis=-1, seed=0):
    rng = np.random.default_rng(seed)
    n = shape[axis:]  # LayerNormalization normalizes over axis..last
    inits = [numpy_helper.from_array((1 + 0.3 * rng.standard_normal(n)).astype(np.float32), "gamma"),
             numpy_helper.from_array((0.2 * rng.standard_normal(n)).astype(np.float32), "beta")]
    node = helper.make_node("LayerNormalization", ["xf", "gamma", "beta"], ["p"], axis=axis, epsilon=1e-5)
    return _qdq_model(node, inits, shape, in_dtype, scale, zero_point, out_dtype, out_scale, out_zero_point)


CASES = {
    "softmax-attention-scores": (qdq_softmax, dict(shape=(1, 12, 16, 128))),
    "softmax-odd-row-length": (qdq_softmax, dict(shape=(3, 37))),
    "softmax-int8-in-int8-out": (qdq_softmax, dict(shape=(2, 9, 24), in_dtype="int8", zero_point=-5, out_dtype="int8")),
    "softmax-sharp": (qdq_softmax, dict(shape=(4, 64), scale=0.9)),  # nearly all mass on one entry per row
    "softmax-axis1": (qdq_softmax, dict(shape=(4, 8, 16), axis=1)),  # along an outer axis: vectors along the last
    "softmax-dfl-bins": (qdq_softmax, dict(shape=(1, 16, 4, 200), axis=1, scale=0.3)),  # a DFL head's 16 bins
    "layernorm-encoder-rows": (qdq_layer_norm, dict(shape=(1, 16, 768))),
    "layernorm-odd-row-length": (qdq_layer_norm, dict(shape=(5, 33), zero_point=3, scale=0.2)),
    "layernorm-int8": (qdq_layer_norm, dict(shape=(2, 4, 96), in_dtype="int8", zero_point=-7, out_dtype="int8",
                                            out_zero_point=0)),
}
OP = {qdq_softmax: "qsoftmax", qdq_layer_norm: "qlayernorm"}


@pytest.mark.parametrize("name", list(CASES))
def test_row_operator_is_one_8bit_kernel_within_one_step_of_onnx(name, rng):
    make, cfg = CASES[name]
    model = make(**cfg)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = compiled.kernels()
    assert [k.op for k in kernels] == [OP[make]] and kernels[0].schedule == "default"
    info = np.iinfo(cfg.get("in_dtype", "uint8"))
    x = rng.integers(info.min, info.max + 1, cfg["shape"]).astype(info.dtype)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (diff.max(), (diff == 0).mean())
    assert len(np.unique(got)) > 5


def test_a_layer_norm_over_other_axes_stays_float():
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq_layer_norm((4, 8, 16), axis=1)), target="native")
    assert not {"qsoftmax", "qlayernorm"} & {k.op for k in compiled.kernels()}


def test_a_softmax_of_a_transposed_dequantize_transposes_the_codes(rng):
    """DequantizeLinear -> Transpose -> Softmax(axis=1) -> QuantizeLinear (a YOLO DFL head: the bins
    moved to axis 1): the 8-bit codes are transposed, then one 8-bit softmax along axis 1; no float
    tensor is made."""
    model = qdq_softmax((1, 4, 16, 50), axis=1, scale=0.3)
    graph = model.graph
    dq = graph.node[0]
    dq.output[0] = "xf0"
    graph.node.insert(1, helper.make_node("Transpose", ["xf0"], ["xf"], perm=[0, 2, 1, 3]))
    graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.UINT8, (1, 16, 4, 50)))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 4, 16, 50)))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    ops = [k.op for k in compiled.kernels()]
    assert "qsoftmax" in ops and not [k.name for k in compiled.kernels() if "dequantize" in k.name or "softmax" in k.name
                                      and k.op != "qsoftmax"], ops
    x = rng.integers(0, 256, (1, 16, 4, 50)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    diff = np.abs(compiled(x)[0].astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (diff.max(), (diff == 0).mean())


def test_an_ort_quantized_encoder_runs_its_row_operators_on_8_bits(rng):
    """ONNX Runtime's quantize_static also quantizes layer norm's gamma (and beta): dequantized constants,
    taken as such; the encoder's softmax and both layer norms become the 8-bit kernels."""
    from benchmarks.models.encoder import EncoderConfig, make_encoder

    from models import quantize_qdq
    from reference import assert_within_one_step, ort_session, output_scale

    shape = (1, 16, 64)
    fp32 = make_encoder(cfg=EncoderConfig(layers=1, d_model=64, heads=4, d_ff=128, seq=16))
    qdq = quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    norms = [n for n in qdq.graph.node if n.op_type == "LayerNormalization"]
    producers = {o: n.op_type for n in qdq.graph.node for o in n.output}
    assert len(norms) == 2 and producers[norms[0].input[1]] == "DequantizeLinear"
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    ops = [k.op for k in compiled.kernels()]
    assert ops.count("qlayernorm") == 2 and ops.count("qsoftmax") == 1
    assert not [k.name for k in compiled.kernels() if "layer_norm" in k.name or "softmax" in k.name and k.op != "qsoftmax"]
    session = ort_session(qdq, optimized=False)
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq))


def test_a_softmax_along_an_outer_axis_computes_its_exponentials_in_vectors():
    """No table, no gather: the exponentials are computed in the lanes like every other block, vectors
    along the innermost axis."""
    from tvm_lowprec.kernels.qsoftmax import build_qsoftmax
    from tvm_lowprec.schedule.rows import RowOpRule
    from tvm_lowprec.targets import resolve_target
    import tvm

    func = build_qsoftmax((1, 4, 4, 64), "uint8", 0.3, "uint8", 1 / 256, 0, 0, 255, axis=1)
    assert len(func.params) == 2  # x and y: no exponential table
    sch = RowOpRule().apply(func, resolve_target("native"))
    kinds = {name: [sch.get(l).kind for l in sch.get_loops(sch.get_sblock(name))] for name in ("exp", "row_max", "out")}
    assert all(kinds[name][-1] == tvm.tirx.ForKind.VECTORIZED for name in kinds), kinds


@pytest.mark.parametrize("n", [128, 48, 37])
def test_a_row_softmax_reduces_in_vector_partials_where_a_vector_divides_the_row(n):
    """Along the last axis the row maximum and sum are partial results in V lanes (rfactor), then V
    scalars; the exponentials and the output are vectors; a row no vector width divides stays scalar."""
    from tvm_lowprec.kernels.qsoftmax import build_qsoftmax
    from tvm_lowprec.schedule.rows import _LANES, RowOpRule
    from tvm_lowprec.targets import resolve_target
    import tvm

    sch = RowOpRule().apply(build_qsoftmax((2, 3, n), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255), resolve_target("native"))
    lanes = next((v for v in _LANES if n % v == 0), None)
    blocks = {name for name in ("row_max_rf", "row_sum_rf") if name in sch.mod["main"].script()}
    vectorized = lambda name: sch.get(sch.get_loops(sch.get_sblock(name))[-1]).kind == tvm.tirx.ForKind.VECTORIZED  # noqa: E731
    if lanes is None:
        assert "row_sum_rf" not in blocks and not vectorized("out")
        return
    assert blocks == {"row_max_rf", "row_sum_rf"}
    for name in ("row_max_rf", "row_sum_rf", "exp", "out"):
        assert vectorized(name), name
        assert int(sch.get(sch.get_loops(sch.get_sblock(name))[-1]).extent) == lanes


@pytest.mark.parametrize("scale", [1e-3, 0.011, 0.11, 0.3, 1.0, 3.7, 10.0])
def test_the_computed_exponential_is_within_two_ulp_of_numpy(scale):
    """``neg_exp`` against ``numpy.exp`` of the same float32 ``t = -scale * d`` on all 256 steps ``d``:
    2 ulp at most where the result is a normal float32; 0 (or numpy's subnormal) below 2^-126."""
    from tvm import te

    from tvm_lowprec.kernels.qsoftmax import neg_exp
    from tvm_lowprec.targets import resolve_target
    import tvm

    d = te.placeholder((256,), "int32", name="d")
    e = te.compute((256,), lambda i: neg_exp(d[i], scale), name="e")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([d, e]).with_attr("global_symbol", "main")}),
                      target=resolve_target("native").tvm_target(1))
    steps = np.arange(256, dtype=np.int32)
    got = tvm.runtime.tensor(np.zeros(256, np.float32))
    lib["main"](tvm.runtime.tensor(steps), got)
    got = got.numpy()
    want = np.exp(-(np.float32(scale) * steps.astype(np.float32))).astype(np.float32)
    normal = want >= np.finfo(np.float32).tiny
    ulps = np.abs(got[normal].view(np.int32).astype(np.int64) - want[normal].view(np.int32).astype(np.int64))
    assert ulps.max() <= 2, (ulps.max(), steps[normal][ulps.argmax()])
    assert np.all((got[~normal] == 0) | (np.abs(got[~normal] - want[~normal]) <= np.finfo(np.float32).tiny))


@pytest.mark.parametrize("scale", [1e-3, 0.011, 0.0625, 0.11, 0.3, 1.0, 3.7, 10.0])
def test_the_exponential_tables_are_within_two_ulp_of_the_exact_exponential(scale):
    """``H[d >> 4] * L[d & 15]`` in float32 against ``exp(-s d)`` in float64, rounded, on all 256
    steps: 2 ulp at most down to 2^-60; 0 or below 2^-60 where the exact value is."""
    from tvm_lowprec.kernels.qsoftmax import exp_tables

    high, low = exp_tables(scale)
    d = np.arange(256)
    got = (high[d >> 4] * low[d & 15]).astype(np.float32)
    want = np.exp(-float(np.float32(scale)) * d).astype(np.float32)
    kept = want >= 2.0 ** -60
    ulps = np.abs(got[kept].view(np.int32).astype(np.int64) - want[kept].view(np.int32).astype(np.int64))
    assert ulps.max() <= 2, (ulps.max(), d[kept][ulps.argmax()])
    assert np.all(got[~kept] < 2.0 ** -60)
    assert np.all((got == 0) | (got >= np.finfo(np.float32).tiny))  # no subnormal product


def _softmax_reference(x, axis, scale, out_scale, zero_point, qmin, qmax):
    """The float softmax of the dequantized codes (float64), quantized: what every kernel is within one
    step of."""
    f = x.astype(np.float64) * float(np.float32(scale))
    p = np.exp(f - f.max(axis=axis, keepdims=True))
    p /= p.sum(axis=axis, keepdims=True)
    return np.clip(np.rint(p / out_scale) + zero_point, qmin, qmax)


PERMUTE_ROWS = [spec for spec in TARGETS if getattr(spec, "register_permute", None) is not None]
SOFTMAX_SHAPES = {"dfl-bins": ((1, 16, 4, 64), 1, 0.3), "attention-row": ((2, 3, 128), -1, 0.11), "two-axes-out": ((3, 4, 2, 32), 2, 0.05),
                  # rows no vector divides (ViT's 197 tokens, Whisper's 250 frames at the zoo's size): the
                  # last vector overlaps the one before it
                  "vit-row": ((1, 3, 197), -1, 0.11), "whisper-row": ((16, 250), -1, 0.3),
                  # rows over 64 vectors, the loop form: Whisper's 1500 frames (a tail vector), 1024 tokens
                  "whisper-full-row": ((4, 1500), -1, 1.0), "long-row": ((2, 2, 1024), -1, 1.5)}


@pytest.mark.parametrize("in_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("case", list(SOFTMAX_SHAPES))
@pytest.mark.parametrize("spec", PERMUTE_ROWS, ids=lambda s: s.name)
def test_a_row_with_a_register_permute_takes_the_softmax_exponentials_from_its_tables(spec, case, in_dtype, rng):
    """Every row with a register permute (the row's data: ``vpermps`` zmm or ymm): the softmax is the
    vector kernel, the permute is in the assembly, and the results equal the scheduled kernel's (the
    polynomial exponentials) but where an exponential 2 ulp apart crosses a rounding boundary, within
    one step of the float softmax everywhere; run natively and emulated (the row's semantics)."""
    from tvm_lowprec.kernels.qsoftmax import build_qsoftmax
    from tvm_lowprec.schedule import schedule_func
    from tvm_lowprec.schedule.rows import RowOpRule

    shape, axis, scale = SOFTMAX_SHAPES[case]
    func = build_qsoftmax(shape, in_dtype, scale, "uint8", 1 / 256, 0, 0, 255, axis=axis)
    vectors = schedule_func(func, spec).mod["main"]
    assert vectors.attrs["lowprec.exp"] == f"table_{spec.register_permute.name}"
    lib = tvm.compile(tvm.IRModule({"main": vectors}), target=spec.tvm_target(2)).mod
    assert re.search(spec.register_permute.asm, lib.inspect_source("asm"))
    scheduled = tvm.compile(RowOpRule().apply(func, spec).mod, target=spec.tvm_target(2)).mod
    info = np.iinfo(in_dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(in_dtype)
    x.reshape(-1)[:256] = np.arange(info.min, info.max + 1)  # every code, every step below a maximum
    want = _softmax_reference(x, axis, scale, 1 / 256, 0, 0, 255)
    runs = [False, True] if execution_mode(spec) == "native" else [True]
    outputs = []
    for emulate in runs:
        plain = load_emulated(scheduled)[0] if emulate else scheduled  # no target intrinsic to replace
        for module in (kernel_module(lib, spec, emulate=emulate), plain):
            args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros(shape, "uint8"))]
            module["main"](*args)
            outputs.append(args[1].numpy().astype(int))
    for got in outputs:
        assert np.abs(got - want).max() <= 1
    for k in range(0, len(outputs), 2):
        assert np.mean(outputs[k] != outputs[k + 1]) < 1e-3
    assert len(np.unique(outputs[0])) >= min(20, len(np.unique(want)))  # not a degenerate output
    assert len(np.unique(want)) > 10


def test_a_row_without_a_register_permute_or_a_shape_the_vectors_do_not_fit_keeps_the_scheduled_softmax():
    """The Arm rows (no ``register_permute``), and on an x86 row a row shorter than a vector (5) or more
    than 64 bins along an outer axis: the row rule's kernel, exponentials computed. A row of more than 64
    vectors (1025) takes the loop form."""
    from tvm_lowprec.kernels.qsoftmax import build_qsoftmax
    from tvm_lowprec.schedule.softmax_vectors import VectorSoftmaxRule

    fits = build_qsoftmax((2, 3, 128), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255)
    for spec in TARGETS:
        if spec.device != "cpu":
            continue
        taken = VectorSoftmaxRule().apply(fits, spec) is not None
        assert taken == (spec.register_permute is not None), spec.name
    short = build_qsoftmax((2, 3, 5), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255)
    many_bins = build_qsoftmax((1, 65, 4, 32), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255, axis=1)
    long_row = build_qsoftmax((2, 3, 1025), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255)
    for spec in PERMUTE_ROWS:
        assert VectorSoftmaxRule().apply(short, spec) is None and VectorSoftmaxRule().apply(many_bins, spec) is None
        loops = VectorSoftmaxRule().apply(long_row, spec).mod["main"]
        assert loops.attrs["lowprec.exp"] == f"table_{spec.register_permute.name}"
        assert "for k" in loops.script(), "the long row is not in loop form"
    tail = build_qsoftmax((2, 3, 37), "uint8", 0.1, "uint8", 1 / 256, 0, 0, 255)  # 37 = 2 x 16 + 5: overlapping
    assert all(VectorSoftmaxRule().apply(tail, spec) is not None for spec in PERMUTE_ROWS)
    assert PERMUTE_ROWS, "no x86 row has a register permute"
