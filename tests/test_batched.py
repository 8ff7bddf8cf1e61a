"""Matmuls whose both operands are activations (attention's Q·Kᵀ, P·V): the weights are packed at run
time (pack_b) and fed to the batched integer kernel. Exact against onnx.reference; QDQ attention from
quantize_static against ONNX Runtime's unfused graph."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from models import quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale


def _qlinear_matmul_runtime_b(a_shape, b_shape, b_dtype, zb):
    k = a_shape[-1]
    params = [("sa", np.float32(0.02)), ("za", np.array(3, np.uint8)), ("sb", np.float32(0.03)),
              ("zb", np.array(zb, b_dtype)), ("sy", np.float32(0.02 * 0.03 * np.sqrt(k) * 6400 / 60)),
              ("zy", np.array(128, np.uint8))]
    elem = TensorProto.UINT8 if b_dtype == "uint8" else TensorProto.INT8
    graph = helper.make_graph(
        [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], name="qmm")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a_shape)),
         helper.make_tensor_value_info("b", elem, list(b_shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in params],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(
    "a_shape,b_shape,b_dtype,zb",
    [((12, 32, 64), (12, 64, 32), "uint8", 131), ((2, 3, 17, 40), (2, 3, 40, 9), "int8", 0),
     ((5, 33), (33, 20), "uint8", 128), ((1, 1, 64), (1, 64, 48), "int8", -3), ((3, 21, 40), (3, 40, 5), "int8", 2),
     ((1, 4, 24, 32), (1, 1, 32, 16), "uint8", 130), ((2, 3, 8, 16), (2, 1, 16, 24), "int8", 0),
     ((4, 10, 16), (16, 12), "int8", 1)],
    # five: a row's narrow recipe; multi-query: one K/V for every head, B's batch dims of 1 broadcast
    ids=["heads-u8", "4d-odd-s8", "2d-runtime-b", "gemv-s8-zp", "five-columns", "multi-query", "grouped-query",
         "3d-by-2d"],
)
def test_runtime_weights_take_the_packed_kernel_exactly(a_shape, b_shape, b_dtype, zb, rng):
    from onnx.reference import ReferenceEvaluator

    model = _qlinear_matmul_runtime_b(a_shape, b_shape, b_dtype, zb)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    ops = {k.op for k in compiled.kernels()}
    assert {"pack_b", "qgemm"} <= ops
    info = np.iinfo(b_dtype)
    a = rng.integers(0, 256, a_shape).astype(np.uint8)
    b = rng.integers(info.min, info.max + 1, b_shape).astype(b_dtype)
    got = compiled(a, b)[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0])
    assert len(np.unique(got)) > 20


@pytest.mark.parametrize("k,expected", [(64, "float32"), (4096, "float")])
def test_runtime_operands_requantize_in_float32_where_every_value_keeps_it_exact(k, expected, rng):
    """Both operands at run time: float32's fused multiply-add where ``K * max|a - za| * max|b - zb|``
    stays below 2^24 (attention's score GEMM, K = 64), float64 beyond; exact against onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    model = _qlinear_matmul_runtime_b((2, 16, k), (2, k, 32), "uint8", 131)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    gemm = [f for gv, f in compiled._lowered.functions.items() if gv.name_hint.startswith("qgemm")]
    assert [str(f.attrs["lowprec.requant"]) for f in gemm] == [expected]
    a = rng.integers(0, 256, (2, 16, k)).astype(np.uint8)
    b = rng.integers(0, 256, (2, k, 32)).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a, b)[0], ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0])


def test_a_large_score_gemm_takes_its_row_sums_from_the_graph_and_stays_exact(rng):
    """An accumulator past ROWSUM_INPUT_BYTES with a short K (attention's scores at long lengths): the row
    sums are an input of the kernel (its epilogue then runs per tile), the result still exact."""
    from onnx.reference import ReferenceEvaluator

    from tvm_lowprec.quant.qdq_to_integer import ROWSUM_INPUT_BYTES

    a_shape, b_shape = (2, 1100, 64), (2, 64, 1000)
    assert 2 * 1100 * 1000 * 4 > ROWSUM_INPUT_BYTES
    model = _qlinear_matmul_runtime_b(a_shape, b_shape, "uint8", 131)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    gemm = [f for gv, f in compiled._lowered.functions.items() if gv.name_hint.startswith("qgemm")]
    assert len(gemm) == 1 and "rowsum" in [p.name for p in gemm[0].params]
    assert 'T.sblock("rowsum")' not in gemm[0].script()  # no pass of its own over A inside the kernel
    a = rng.integers(0, 256, a_shape).astype(np.uint8)
    b = rng.integers(0, 256, b_shape).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a, b)[0], ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0])


@pytest.mark.parametrize("a_shape,b_shape", [((2, 24, 64), (2, 64, 1500)), ((3, 37, 64), (3, 64, 120)), ((2, 40, 64), (2, 64, 1012))],
                         ids=["whisper-columns", "120-columns", "1012-columns"])
def test_a_gemm_whose_columns_no_vector_divides_ends_on_an_overlapping_vector(a_shape, b_shape, rng):
    """N that no vector divides (Whisper's 1500 positions): where the last panel has a whole vector of
    real columns, the epilogue's last vector starts at ``N - lanes``, overlapping the one before it,
    instead of a per-lane predicate that kept the whole epilogue scalar; exact against onnx.reference.
    B's zero point 128 has no row term: the epilogue joins the tiles at any size."""
    from onnx.reference import ReferenceEvaluator

    model = _qlinear_matmul_runtime_b(a_shape, b_shape, "uint8", 128)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (gemm,) = [f for gv, f in compiled._lowered.functions.items() if gv.name_hint.startswith("qgemm")]
    n, lanes, nr = b_shape[-1], int(gemm.attrs["lowprec.vector"][0]), int(gemm.attrs["lowprec.tile"][1])
    overlaps = n % lanes != 0 and not 0 < n % (lanes * nr) < lanes
    assert (f", {n - lanes}) + " in gemm.script()) == overlaps, (lanes, nr)  # the vector's start: min(start, N - lanes)
    a = rng.integers(0, 256, a_shape).astype(np.uint8)
    b = rng.integers(0, 256, b_shape).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a, b)[0], ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0])


def test_the_overlapping_column_vector_applies_to_whisper_scores_on_every_x86_row():
    """The rewrite's condition from each x86 row's data (lanes, the layout's column groups) on Whisper's
    6x1500x1500x64 scores: it applies on every row that has one, whatever this host is."""
    from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm
    from tvm_lowprec.schedule import schedule_func
    from tvm_lowprec.schedule.column_tail import overlap_column_tail

    from conftest import TARGETS

    problem = QGemmProblem(1500, 1500, 64, "uint8", Epilogue("requant", "uint8", zero_point=3), row_term=True, batch=6,
                           requant_f32=True, rowsum_input=True)
    rows = [spec for spec in TARGETS if spec.name.startswith("x86")]
    assert rows
    for spec in rows:
        layout = GemmLayout.choose(problem, spec, None)
        scheduled = schedule_func(build_qgemm(problem, layout, "scores"), spec).mod["main"]
        epilogue = overlap_column_tail(scheduled).script().split('sblock("epilogue")')[1]
        where = next((line for line in epilogue.splitlines() if "T.where(" in line), "")
        column = next(line for line in epilogue.splitlines() if line.strip().startswith("v_i2 ="))
        # the column: min(start, N - lanes) + lane; the predicate: rows only (no lane in it)
        assert f", {1500 - layout.lanes}) + " in column and column.split(" + ")[-1].rstrip(")") not in where, (spec.name, column, where)
    from tvm_lowprec.targets import registered_targets

    for spec in registered_targets("cuda").values():  # a GPU layout keeps its epilogue as scheduled
        scheduled = schedule_func(build_qgemm(problem, GemmLayout.choose(problem, spec, None), "scores"), spec).mod["main"]
        assert overlap_column_tail(scheduled).same_as(scheduled), spec.name


def _fp32_attention(seq=32, d=64, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), n) for n in ("Wq", "Wk", "Wv")]
    inits.append(numpy_helper.from_array(np.float32(1 / np.sqrt(d)), "scale"))
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"]), helper.make_node("MatMul", ["x", "Wk"], ["k"]),
        helper.make_node("MatMul", ["x", "Wv"], ["v"]), helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantize_static_attention_matches_ort(rng):
    shape = (1, 32, 64)
    qdq = quantize_qdq(_fp32_attention(), [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    names = [k.name for k in compiled.kernels()]
    assert sum(n.startswith("qgemm_batched") for n in names) == 2  # Q·Kᵀ and P·V
    # the three projections (one shape, their output zero points a parameter): one kernel
    assert sum(n.startswith("qgemm_u8") for n in names) == 1
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq))


def test_fast_math_only_changes_the_float_operators(rng):
    """The quantized attention's softmax is the 8-bit kernel either way (no float exp left to approximate);
    the FP32 model's softmax takes TVM's fast form with fast_math and stays within float rounding."""
    shape = (1, 32, 64)
    qdq = quantize_qdq(_fp32_attention(), [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    x = rng.standard_normal(shape).astype(np.float32)
    quantized = [tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native", fast_math=f) for f in (True, False)]
    for compiled in quantized:
        assert "qsoftmax" in [k.op for k in compiled.kernels()] and not any("fast_" in k.name for k in compiled.kernels())
    np.testing.assert_array_equal(quantized[0](x)[0], quantized[1](x)[0])
    fp32 = tvm_lowprec.from_onnx(_fp32_attention())
    fast = tvm_lowprec.compile(fp32, target="native")
    exact = tvm_lowprec.compile(fp32, target="native", fast_math=False)
    assert any("fast_softmax" in k.name for k in fast.kernels())
    assert not any("fast_" in k.name for k in exact.kernels())
    np.testing.assert_allclose(fast(x)[0], exact(x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k,n", [(250, 64), (64, 250), (50, 64)])
def test_the_runtime_packing_of_every_cpu_row_is_exact_and_partitions_its_border(k, n, rng):
    """``pack_b`` in each CPU row's packed layout (the layout is data: every row's function runs here,
    on this host's target), scheduled by :class:`~tvm_lowprec.schedule.qgemm.PackBRule`, matches the
    function as written; the loops over K-groups and column groups carry the partition hint (the padded
    border split off), and so does the column sums' loop over vectors."""
    import tvm

    from tvm_lowprec.kernels.pack_b import build_pack_b
    from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem
    from tvm_lowprec.schedule.qgemm import PackBRule
    from tvm_lowprec.targets import registered_targets, resolve_target

    native = resolve_target("native")
    b = rng.integers(0, 256, (3, k, n), dtype=np.uint8)
    problem = QGemmProblem(40, n, k, "uint8", Epilogue("requant", "uint8", zero_point=3), row_term=True, batch=3)
    checked = set()
    for spec in registered_targets("cpu").values():
        layout = GemmLayout.choose(problem, spec, None)
        if layout.packed_shape in checked:
            continue
        checked.add(layout.packed_shape)
        func = build_pack_b(3, k, n, "uint8", layout, 7, -5, "pack")
        sch = PackBRule().apply(func, native)
        outs = []
        for f in (func, sch.mod["main"]):
            lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=native.tvm_target(1))
            args = [tvm.runtime.tensor(b), tvm.runtime.tensor(np.zeros((3,) + layout.packed_shape, layout.b_storage)),
                    tvm.runtime.tensor(np.zeros((3, layout.np_), np.int32))]
            lib.mod["main"](*args)
            outs.append([a.numpy() for a in args[1:]])
        for want, got in zip(*outs):
            np.testing.assert_array_equal(got, want, err_msg=spec.name)
        # the pack's K-group and column-group loops; and the column sums' vector loop where the columns take
        # more than one vector (its padded tail split off)
        byte_lanes = native.gemm.vector_bits // 8
        lanes = byte_lanes if layout.np_ % byte_lanes == 0 else native.gemm.vector_bits // 32
        split = layout.np_ > lanes and layout.np_ % lanes == 0
        assert str(sch.trace).count("pragma_loop_partition_hint") == 2 + split, spec.name
    assert len(checked) >= 2  # more than one layout among the rows
