"""Symbolic dimensions (issue 26): a model whose inputs keep named dynamic dimensions compiles once
and runs at every size; the integer GEMMs take their rows (M) at run time, padded to whole row tiles
inside the kernel; the kernels that need constant extents are scheduled by the rules that accept
symbolic ones (the generic rule), never by a rule that would tile a variable by a constant."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te

import tvm_lowprec
from models import quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale
from tvm_lowprec.schedule import DEFAULT_RULES, GenericRule, has_symbolic_shape, schedule_func
from tvm_lowprec.targets import resolve_target

SPEC = resolve_target("native")
LENGTHS = (1, 7, 33)


def _row_intrinsics() -> set:
    """The GEMM intrinsics of the native row's recipes (from the row's data, not from this host)."""
    recipes = (*SPEC.recipes(), *([SPEC.narrow] if SPEC.narrow is not None else []))
    return {name for recipe in recipes for op in recipe.intrin.a_operands.values()
            for name in (op.intrin, op.intrin_wide_b) if name}


def _mlp(width=64, hidden=128, out=32, seed=0):
    """MatMul -> Relu -> MatMul over ``[batch, seq, width]``, both leading dimensions named."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((width, hidden)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, out)).astype(np.float32), "W2")
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", out])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float_model_with_named_dimensions_compiles_once_for_every_size(rng):
    model = _mlp()
    w1, w2 = (numpy_helper.to_array(t) for t in model.graph.initializer)
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = len(compiled.kernels())
    for batch, seq in ((1, 1), (2, 7), (3, 33)):
        x = rng.standard_normal((batch, seq, 64)).astype(np.float32)
        want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
        np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-4, atol=1e-3)
    assert len(compiled.kernels()) == kernels  # no kernel added by a new size


@pytest.fixture(scope="module")
def qdq_mlp():
    rng = np.random.default_rng(1)
    return quantize_qdq(_mlp(), [rng.standard_normal((1, 5, 64)).astype(np.float32) for _ in range(4)])


def test_the_integer_gemms_take_their_rows_at_run_time_and_match_onnx_runtime(qdq_mlp, rng):
    """The QDQ MLP: both GEMMs on the row's intrinsic with a symbolic M (named ``M``), within a step of ONNX
    Runtime running the same file as written at every size, and exactly the model compiled for one size."""
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq_mlp), target="native")
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert len(gemms) == 2 and all("_Mx" in k.name for k in gemms)
    assert {k.intrinsic for k in gemms} <= _row_intrinsics()
    session = ort_session(qdq_mlp, optimized=False)  # the graph as written: ORT's optimized u8s8 kernels saturate
    for seq in LENGTHS:  # pairs of full-range weight products on CPUs without VNNI (AVX2: 24 steps off)
        x = rng.standard_normal((2, seq, 64)).astype(np.float32)
        # exact integer sums against the graph's float ones: equal on Zen 3; within a step wherever a float
        # sum's order moves a rounding
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq_mlp), exact_fraction=0.99)
    fixed = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq_mlp, shape_dict={"x": (2, 7, 64)}), target="native")
    x = rng.standard_normal((2, 7, 64)).astype(np.float32)
    np.testing.assert_array_equal(compiled(x), fixed(x))


def test_a_symbolic_kernel_is_offered_only_to_rules_that_accept_symbolic_extents():
    class Refuses:
        def apply(self, func, spec):
            raise AssertionError("a rule without symbolic = True was asked to schedule a symbolic kernel")

    n = tvm.tirx.Var("n", "int64")
    x = te.placeholder((n, 64), "float32", name="x")
    y = te.compute((n, 64), lambda i, j: x[i, j] * 2.0, name="y")
    func = te.create_prim_func([x, y])
    assert has_symbolic_shape(func)
    sch = schedule_func(func, SPEC, rules=(Refuses(), GenericRule()))
    assert sch is not None and "T.parallel" in sch.mod["main"].script()
    assert [type(r).__name__ for r in DEFAULT_RULES if getattr(r, "symbolic", False)]  # some rule takes them


def test_a_torchscript_bert_with_dynamic_axes_compiles_once_and_matches(rng, tmp_path):
    """transformers' BERT (2 layers, hidden 64) exported by TorchScript with dynamic batch and sequence,
    quantized by ONNX Runtime: one compile runs 1, 5 and 40 tokens within one step of ONNX Runtime on
    the same file, and gives the numbers of the model compiled for 16 tokens exactly."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch)")
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")
    import onnx

    cfg = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    path = tmp_path / "bert.onnx"
    torch.onnx.export(Hidden(), (torch.randint(0, 256, (1, 9)),), str(path), input_names=["ids"], output_names=["h"],
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}}, opset_version=17, dynamo=False)
    model = quantize_qdq(onnx.load(str(path)), [rng.integers(0, 256, (1, 12)).astype(np.int64) for _ in range(4)])
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert [k for k in compiled.kernels() if k.op == "qgemm" and k.intrinsic in _row_intrinsics()]
    session, scale = ort_session(model, optimized=False), output_scale(model)  # as written (see above)
    for seq in (1, 5, 40):
        ids = rng.integers(0, 256, (1, seq)).astype(np.int64)
        assert_within_one_step(compiled(ids)[0], session.run(None, {"ids": ids})[0], scale, exact_fraction=0.9)
    fixed = tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"ids": (1, 16)}), target="native")
    ids = rng.integers(0, 256, (1, 16)).astype(np.int64)
    np.testing.assert_array_equal(compiled(ids), fixed(ids))


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_a_4bit_matmul_takes_its_rows_at_run_time(activations, rng):
    """ORT's MatMulNBits (block 32) over ``[seq, 96]``: one compile on the 4-bit kernel (named ``M``)
    serves 1, 5 and 37 rows. With int8 activations (integer block sums) each row is what the kernel
    compiled for that many rows gives exactly; with float ones the row tile differs (a GEMV form for
    one row), so the float sums' order does: within float rounding."""
    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    w = numpy_helper.from_array(rng.standard_normal((96, 40)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 40])], [w])
    q = quantizer.MatMulNBitsQuantizer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                                       bits=4, block_size=32, is_symmetric=True)
    q.process()
    model = q.model.model
    config = tvm_lowprec.WeightOnlyConfig(activations=activations)
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", weight_only=config)
    assert [k.name for k in compiled.kernels() if k.op == "nbits_gemm"] == [f"nbits_gemm_{activations}_Mx40x96_b32"]
    for seq in (1, 5, 37):
        x = rng.standard_normal((seq, 96)).astype(np.float32)
        fixed = tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"x": (seq, 96)}), target="native",
                                    weight_only=config)
        if activations == "int8":
            np.testing.assert_array_equal(compiled(x)[0], fixed(x)[0])
        else:
            np.testing.assert_allclose(compiled(x)[0], fixed(x)[0], rtol=1e-5, atol=1e-4)


def test_shape_dict_pins_a_dimension_by_its_name_or_keeps_it_symbolic_under_a_name():
    model = _mlp()
    pinned = tvm_lowprec.from_onnx(model, shape_dict={"batch": 2})  # every input dimension named batch
    (x,) = pinned["main"].params
    assert int(x.ty.shape[0]) == 2 and not isinstance(x.ty.shape[1], tvm.tirx.IntImm)
    named = tvm_lowprec.from_onnx(model, shape_dict={"x": (1, "tokens", 64)})
    (x,) = named["main"].params
    assert int(x.ty.shape[0]) == 1 and str(x.ty.shape[1]) == "tokens"
    with pytest.raises(tvm_lowprec.InputError, match=r"not an input.*\['batch', 'seq'\]"):
        tvm_lowprec.from_onnx(model, shape_dict={"sequence": 4})
    with pytest.raises(tvm_lowprec.InputError, match="positive or a name"):
        tvm_lowprec.from_onnx(model, shape_dict={"x": (0, "tokens", 64)})


def test_attention_scores_with_symbolic_queries_take_the_float_matmul_rule(rng):
    """A prompt's scores against a cache of constant length, ``[1, 2, 7, M, 64] x [1, 2, 1, 64, 256]``
    then a scale, with M symbolic: the float matmul rule's register tile (the last row tile
    predicated), not the generic schedule; the same values as numpy at 37 and 128 rows."""
    from tvm_lowprec.schedule.fp32_matmul import Fp32MatmulRule

    if getattr(SPEC, "fma", None) is None:
        pytest.skip(f"the {SPEC.name} row has no FMA recipe")
    m = tvm.tirx.Var("m", "int64")
    a = te.placeholder((1, 2, 7, m, 64), "float32", name="a")
    b = te.placeholder((1, 2, 1, 64, 256), "float32", name="b")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((1, 2, 7, m, 256), lambda x, h, g, i, j: te.sum(a[x, h, g, i, k] * b[x, h, 0, k, j], axis=k), name="c")
    d = te.compute(c.shape, lambda *i: c[i] * 0.125, name="d")
    func = te.create_prim_func([a, b, d])
    sch = schedule_func(func, SPEC)
    assert sch is not None and Fp32MatmulRule().apply(func, SPEC) is not None
    script = sch.mod["main"].script()
    assert "T.vectorized" in script and "T.parallel" in script
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=SPEC.tvm_target(2))
    for rows in (37, 128):
        x = rng.standard_normal((1, 2, 7, rows, 64)).astype(np.float32)
        y = rng.standard_normal((1, 2, 1, 64, 256)).astype(np.float32)
        out = tvm.runtime.tensor(np.zeros((1, 2, 7, rows, 256), np.float32))
        lib(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
        np.testing.assert_allclose(out.numpy(), (x.astype(np.float64) @ y) * 0.125, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", ["symbolic", 128])
def test_scores_against_keys_as_stored_take_the_float_matmul_rule(rows, rng):
    """``Q @ K^T`` with K read as stored (``[.., total, head]``: a prompt's scores against the KV cache,
    which the generic schedule ran at 24 ms a layer for 128 queries on Zen 4): the rule copies each
    head's keys transposed once (``[head, total]``) and runs its register tile over the copy; the same
    values as numpy, at 37 and 128 rows where M is symbolic."""
    from tvm_lowprec.schedule.fp32_matmul import Fp32MatmulRule

    if getattr(SPEC, "fma", None) is None:
        pytest.skip(f"the {SPEC.name} row has no FMA recipe")
    m = tvm.tirx.Var("m", "int64") if rows == "symbolic" else rows
    a = te.placeholder((1, 2, 7, m, 64), "float32", name="a")
    b = te.placeholder((1, 2, 1, 256, 64), "float32", name="b")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((1, 2, 7, m, 256), lambda x, h, g, i, j: te.sum(a[x, h, g, i, k] * b[x, h, 0, j, k], axis=k), name="c")
    func = te.create_prim_func([a, b, te.compute(c.shape, lambda *i: c[i] * 0.125, name="d")])
    sch = Fp32MatmulRule().apply(func, SPEC)
    assert sch is not None and "b_global" in sch.mod["main"].script()  # the transposed copy
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=SPEC.tvm_target(2))
    for n in (37, 128) if rows == "symbolic" else (128,):
        x = rng.standard_normal((1, 2, 7, n, 64)).astype(np.float32)
        y = rng.standard_normal((1, 2, 1, 256, 64)).astype(np.float32)
        out = tvm.runtime.tensor(np.zeros((1, 2, 7, n, 256), np.float32))
        lib(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
        want = (x.astype(np.float64) @ np.swapaxes(y, -1, -2)) * 0.125
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_decode_scores_against_a_symbolic_cache_take_the_float_matmul_rule(rng):
    """A decode step's ``Q @ K^T`` as a plain export writes it: batch, queries and keys all symbolic,
    ``[batch, 2, 7 * s, 64] x [batch, 2, 64, past + s]`` (the transposed cache). The rule pads the keys
    to whole column tiles (a predicated tile would be scalarized), not the generic schedule; the same
    values as numpy for key counts under a tile, between tiles and on a tile's edge."""
    from tvm_lowprec.schedule.fp32_matmul import Fp32MatmulRule

    if getattr(SPEC, "fma", None) is None:
        pytest.skip(f"the {SPEC.name} row has no FMA recipe")
    batch, s, past = (tvm.tirx.Var(n, "int64") for n in ("batch", "s", "past"))
    a = te.placeholder((batch, 2, 7 * s, 64), "float32", name="a")
    b = te.placeholder((batch, 2, 64, past + s), "float32", name="b")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((batch, 2, 7 * s, past + s), lambda x, h, i, j: te.sum(a[x, h, i, k] * b[x, h, k, j], axis=k), name="c")
    func = te.create_prim_func([a, b, c, s, past])
    sch = schedule_func(func, SPEC)
    assert sch is not None and Fp32MatmulRule().apply(func, SPEC) is not None
    script = sch.mod["main"].script()
    assert "b_pad" in script and "a_pad" in script and "T.vectorized" in script and "T.parallel" in script
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=SPEC.tvm_target(2))
    for n, total, batches in ((1, 5, 1), (1, 129, 1), (3, 48, 2), (2, 33, 1)):
        x = rng.standard_normal((batches, 2, 7 * n, 64)).astype(np.float32)
        y = rng.standard_normal((batches, 2, 64, total)).astype(np.float32)
        out = tvm.runtime.tensor(np.zeros((batches, 2, 7 * n, total), np.float32))
        lib(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out, n, total - n)
        np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


def test_masked_scores_keep_the_float_matmul_rule(rng):
    """A prompt's scores as the GroupQueryAttention converter writes them: a causal mask computed
    before the product (key position <= query position) and applied after it. The mask is inlined into
    the epilogue (reverse_compute_at refused to leave it behind, and the scores fell to the generic
    schedule: 24 ms a layer at 128 queries); masked scores take the lowest float, as written."""
    from tvm_lowprec.schedule.fp32_matmul import Fp32MatmulRule

    if getattr(SPEC, "fma", None) is None:
        pytest.skip(f"the {SPEC.name} row has no FMA recipe")
    rows, total = 24, 64
    key_at = te.placeholder((1, 1, 1, 1, total), "int64", name="key_at")
    query_at = te.placeholder((1, 1, 1, rows, 1), "int64", name="query_at")
    a = te.placeholder((1, 2, 2, rows, 16), "float32", name="a")
    b = te.placeholder((1, 2, 1, 16, total), "float32", name="b")
    visible = te.compute((1, 1, 1, rows, total), lambda x, h, g, i, j: key_at[x, h, g, 0, j] <= query_at[x, h, g, i, 0],
                         name="visible")
    k = te.reduce_axis((0, 16), "k")
    c = te.compute((1, 2, 2, rows, total), lambda x, h, g, i, j: te.sum(a[x, h, g, i, k] * b[x, h, 0, k, j], axis=k), name="c")
    d = te.compute(c.shape, lambda *i: c[i] * 0.25, name="d")
    lowest = float(np.finfo(np.float32).min)
    e = te.compute(c.shape, lambda x, h, g, i, j: tvm.tirx.Select(visible[x, 0, 0, i, j], d[x, h, g, i, j],
                                                                  tvm.tirx.const(lowest, "float32")), name="e")
    sch = Fp32MatmulRule().apply(te.create_prim_func([key_at, query_at, a, b, e]), SPEC)
    assert sch is not None
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=SPEC.tvm_target(2))
    keys, queries = np.arange(total).reshape(1, 1, 1, 1, total), (np.arange(rows) + 30).reshape(1, 1, 1, rows, 1)
    x = rng.standard_normal((1, 2, 2, rows, 16)).astype(np.float32)
    y = rng.standard_normal((1, 2, 1, 16, total)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((1, 2, 2, rows, total), np.float32))
    lib(*(tvm.runtime.tensor(v) for v in (keys.astype(np.int64), queries.astype(np.int64), x, y)), out)
    want = np.where(keys <= queries, (x.astype(np.float64) @ y) * 0.25, lowest)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
