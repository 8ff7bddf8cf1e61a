"""Any Relax module in: TVM's own ONNX and PyTorch frontends, ``relax.frontend.nn`` and hand-written
TVMScript, compiled and quantized by tvm-lowprec as a user's TVM script would (issue: a library for
TVM scripts). Each frontend's FP32 module quantizes and compiles, each QDQ module compiles to integer
kernels on the row's intrinsic, and both match the reference runtime (ONNX Runtime, or PyTorch).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import tvm_lowprec
from tvm_lowprec.errors import InputError
from tvm_lowprec.frontend.relax_module import prepare_module

from models import fp32_cnn, quantize_qdq
from reference import assert_within_one_step, cosine, ort_session, output_scale

SHAPE = (1, 3, 16, 16)


def row_intrinsics(spec) -> set[str]:
    """The intrinsic names the row's GEMM recipes report (from the row's data, not from this host)."""
    names = set()
    for recipe in spec.recipes():
        for operand in recipe.intrin.a_operands.values():
            names.update(n for n in (operand.intrin, operand.intrin_wide_b) if n)
    return names


def _out(result):
    return np.asarray(result[0] if isinstance(result, (list, tuple)) else result)


@pytest.fixture(scope="module")
def cnn():
    rng = np.random.default_rng(0)
    fp32 = fp32_cnn(SHAPE)
    samples = [rng.standard_normal(SHAPE).astype("float32") for _ in range(4)]
    return fp32, quantize_qdq(fp32, samples), samples, rng.standard_normal(SHAPE).astype("float32")


@pytest.mark.parametrize("keep_params", [False, True], ids=["weights-constant", "weights-as-inputs"])
def test_tvm_onnx_frontend_qdq_model_runs_on_the_rows_intrinsic(cnn, keep_params):
    """TVM's importer reads a QDQ file as R.quantize/R.dequantize; with keep_params_in_input the weights
    are trailing parameters whose values ride in ``main``'s attributes: bound as constants."""
    _, qdq, _, x = cnn
    mod = tvm_from_onnx(qdq, keep_params_in_input=keep_params)
    compiled = tvm_lowprec.compile(mod, target="native")
    assert [i.name for i in compiled.inputs] == ["x"]
    used = {k.intrinsic for k in compiled.kernels()}
    assert used & row_intrinsics(compiled.spec), sorted(used)
    want = ort_session(qdq, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(_out(compiled(x)), want, output_scale(qdq))


def test_tvm_onnx_frontend_fp32_model_is_quantized_by_us(cnn):
    fp32, _, samples, x = cnn
    mod = tvm_from_onnx(fp32)
    quantized = tvm_lowprec.quantize(mod, samples, progress=False)
    compiled = tvm_lowprec.compile(quantized, target="native")
    assert {k.intrinsic for k in compiled.kernels()} & row_intrinsics(compiled.spec)
    want = ort_session(fp32).run(None, {"x": x})[0]
    assert cosine(_out(compiled(x)), want) >= 0.999
    report = tvm_lowprec.accuracy_report(mod, quantized, samples[:2], progress=False)
    assert report is not None


def _torch_mlp():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    return torch, model


@pytest.mark.parametrize("keep_params", [False, True], ids=["weights-constant", "weights-as-inputs"])
def test_torch_exported_program_compiles_and_quantizes(keep_params):
    torch, model = _torch_mlp()
    from tvm.relax.frontend.torch import from_exported_program

    x = torch.randn(8, 64)
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=keep_params)
    want = model(x).detach().numpy()
    compiled = tvm_lowprec.compile(mod, target="native")
    np.testing.assert_allclose(_out(compiled(x.numpy())), want, rtol=1e-4, atol=1e-5)
    samples = [torch.randn(8, 64).numpy() for _ in range(4)]
    quantized = tvm_lowprec.compile(tvm_lowprec.quantize(mod, samples, progress=False), target="native")
    assert {k.intrinsic for k in quantized.kernels()} & row_intrinsics(quantized.spec)
    assert cosine(_out(quantized(x.numpy())), want) >= 0.999


def test_torch_fx_frontend_compiles():
    torch, model = _torch_mlp()
    from tvm.relax.frontend.torch import from_fx

    mod = from_fx(torch.fx.symbolic_trace(model), [((8, 64), "float32")])
    x = torch.randn(8, 64)
    np.testing.assert_allclose(_out(tvm_lowprec.compile(mod, target="native")(x.numpy())),
                               model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def _nn_module():
    from tvm.relax.frontend import nn

    class Linear(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(32, 16, bias=False)

        def forward(self, x: nn.Tensor):
            return nn.op.relu(self.fc(x))

    mod, spec = Linear().export_tvm({"forward": {"x": nn.spec.Tensor((4, 32), "float32")}})
    return mod, spec


def test_nn_export_without_weight_values_names_the_weights_then_binds():
    """``export_tvm`` keeps the weights as inputs with no values: a named error, then BindParams works."""
    mod, spec = _nn_module()
    mod = tvm.IRModule({"main" if gv.name_hint == "forward" else gv.name_hint: f for gv, f in mod.functions.items()})
    main = mod["main"].with_attr("global_symbol", "main")
    mod["main"] = main
    with pytest.raises(InputError, match="fc.weight"):
        tvm_lowprec.compile(mod, target="native")
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((16, 32)).astype("float32")
    bound = relax.transform.BindParams("main", {"fc.weight": tvm.runtime.tensor(weight)})(mod)
    bound["main"] = bound["main"].without_attr("num_input")
    x = rng.standard_normal((4, 32)).astype("float32")
    got = _out(tvm_lowprec.compile(bound, target="native")(x))
    np.testing.assert_allclose(got, np.maximum(x @ weight.T, 0), rtol=1e-4, atol=1e-5)


def test_tvmscript_qdq_matmul_is_exact():
    """Hand-written TVMScript with R.quantize / R.dequantize around a matmul: the integer kernel on the
    row's intrinsic, equal to numpy's integer arithmetic with ONNX's rounding."""
    rng = np.random.default_rng(2)
    w_q = rng.integers(-127, 128, (64, 32)).astype("int8")
    sx, sw, sy, zx, zy = 0.05, 0.01, 0.2, 128, 120
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            xq = bb.emit(relax.op.quantize(x, relax.const(sx, "float32"), relax.const(zx, "uint8"), axis=-1,
                                           out_dtype="uint8"))
            xd = bb.emit(relax.op.dequantize(xq, relax.const(sx, "float32"), relax.const(zx, "uint8"), axis=-1))
            wd = bb.emit(relax.op.dequantize(relax.const(w_q), relax.const(sw, "float32"), relax.const(0, "int8"),
                                             axis=-1))
            y = bb.emit(relax.op.matmul(xd, wd))
            yq = bb.emit(relax.op.quantize(y, relax.const(sy, "float32"), relax.const(zy, "uint8"), axis=-1,
                                           out_dtype="uint8"))
            out = bb.emit_output(relax.op.dequantize(yq, relax.const(sy, "float32"), relax.const(zy, "uint8"),
                                                     axis=-1))
        bb.emit_func_output(out)
    compiled = tvm_lowprec.compile(bb.get(), target="native")
    assert {k.intrinsic for k in compiled.kernels()} & row_intrinsics(compiled.spec)
    xv = (rng.standard_normal((16, 64)) * 3).astype("float32")
    xq = np.clip(np.rint(xv / np.float32(sx)) + zx, 0, 255).astype(np.int64)
    acc = (xq - zx) @ w_q.astype(np.int64)
    yq = np.clip(np.rint(acc * (np.float64(np.float32(sx)) * np.float64(np.float32(sw)) / np.float64(np.float32(sy))))
                 + zy, 0, 255)
    want = ((yq - zy) * np.float32(sy)).astype("float32")
    assert_within_one_step(_out(compiled(xv)), want, sy, exact_fraction=0.99)


def test_a_module_without_main_is_a_named_error():
    with pytest.raises(InputError, match="no 'main'"):
        prepare_module(tvm.IRModule({}))
    with pytest.raises(InputError, match="tvm.IRModule"):
        prepare_module("model.onnx")
