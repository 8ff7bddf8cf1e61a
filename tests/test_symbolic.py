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
    """The QDQ MLP: both GEMMs on the row's intrinsic with a symbolic M (named ``M``), the same
    numbers as ONNX Runtime on the same file at every size, and as the model compiled for one size."""
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq_mlp), target="native")
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert len(gemms) == 2 and all("_Mx" in k.name for k in gemms)
    assert {k.intrinsic for k in gemms} <= _row_intrinsics()
    session = ort_session(qdq_mlp)
    for seq in LENGTHS:
        x = rng.standard_normal((2, seq, 64)).astype(np.float32)
        np.testing.assert_array_equal(compiled(x)[0], session.run(None, {"x": x})[0])
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
    session, scale = ort_session(model), output_scale(model)
    for seq in (1, 5, 40):
        ids = rng.integers(0, 256, (1, seq)).astype(np.int64)
        assert_within_one_step(compiled(ids)[0], session.run(None, {"ids": ids})[0], scale, exact_fraction=0.9)
    fixed = tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"ids": (1, 16)}), target="native")
    ids = rng.integers(0, 256, (1, 16)).astype(np.int64)
    np.testing.assert_array_equal(compiled(ids), fixed(ids))
