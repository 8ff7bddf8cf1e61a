"""``tvm-lowprec quantize``: an FP32 ONNX model and samples -> an ONNX QDQ file that ONNX Runtime runs
with the accuracy of our compiled quantized model, plus the report; bad data is a clear error."""

import numpy as np
import onnx
import pytest
from models import fp32_cnn, fp32_linear
from reference import ort_session

import tvm_lowprec
from tvm_lowprec.cli import main
from tvm_lowprec.ptq import PerGroup, QuantConfig, QuantSpec
from tvm_lowprec.ptq.export_onnx import ExportError, export_qdq
from tvm_lowprec.ptq.quantize import quantize_with_plans

MODELS = {"gemm-mlp": (lambda: fp32_linear((8, 32), 32, op="gemm", act="relu", layers=2), (8, 32)),
          "matmul-mlp": (lambda: fp32_linear((8, 32), 32, act="relu", layers=2), (8, 32)),
          "cnn": (lambda: fp32_cnn((1, 3, 16, 16)), (1, 3, 16, 16))}


def _sqnr(refs, outs):
    ref = np.concatenate([np.ravel(r) for r in refs]).astype(np.float64)
    err = ref - np.concatenate([np.ravel(o) for o in outs]).astype(np.float64)
    return 10 * np.log10(np.sum(ref ** 2) / np.sum(err ** 2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cli_writes_a_qdq_file_that_ort_runs_as_accurately_as_ours(name, tmp_path, capsys):
    make, shape = MODELS[name]
    model = make()
    path, out = tmp_path / "model.onnx", tmp_path / "model_qdq.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((12, *shape)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", x=data)
    assert main(["quantize", str(path), "--data", str(tmp_path / "samples.npz"), "--out", str(out)]) == 0
    assert (tmp_path / "model_qdq.report.md").read_text().startswith("Accuracy against FP32")
    assert (tmp_path / "model_qdq.report.png").stat().st_size > 1000
    assert "onnxruntime, exported QDQ" in capsys.readouterr().out

    exported = onnx.load(out)
    ops = [n.op_type for n in exported.graph.node]
    layers = sum(op in ("MatMul", "Gemm", "Conv") for op in ops)
    # input and output Q/DQ per layer; DQ of the integer weights and of the int32 bias (every layer has one)
    assert ops.count("QuantizeLinear") == 2 * layers and ops.count("DequantizeLinear") == 4 * layers
    # the output Q/DQ sits where the layer ends, after its bias Add and Relu, as in our module
    readers = {t: n.op_type for n in exported.graph.node for t in n.input}
    assert all(readers[n.output[0]] in ("Add", "Relu", "Clip", "QuantizeLinear") for n in exported.graph.node
               if n.op_type in ("MatMul", "Gemm", "Conv"))
    assert all(readers[n.output[0]] != "QuantizeLinear" for n in exported.graph.node if n.op_type == "MatMul")
    # the same quantization in-process, compiled by us
    mod = tvm_lowprec.from_onnx(model)
    qmod, _ = quantize_with_plans(mod, list(data), QuantConfig.for_target("native"), progress=False)
    ours = tvm_lowprec.compile(qmod, target="native")
    held = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    fp32 = ort_session(model)
    refs = [fp32.run(None, {"x": x})[0] for x in held]
    theirs = ort_session(exported, optimized=False)  # the QDQ graph as written
    ort_db = _sqnr(refs, [theirs.run(None, {"x": x})[0] for x in held])
    our_db = _sqnr(refs, [ours(x)[0] for x in held])
    assert our_db > 24.0 and abs(ort_db - our_db) <= 0.3, (ort_db, our_db)
    fused = ort_session(exported)  # ORT's own integer kernels on the same file
    assert _sqnr(refs, [fused.run(None, {"x": x})[0] for x in held]) > our_db - 1.0


def test_bad_data_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save(fp32_linear((8, 32), 32), path)
    np.savez(tmp_path / "wrong.npz", images=np.zeros((2, 8, 32), np.float32))
    nan = np.zeros((3, 8, 32), np.float32)
    nan[1, 2, 3] = np.nan
    np.savez(tmp_path / "nan.npz", x=nan)
    np.savez(tmp_path / "shape.npz", x=np.zeros((3, 8, 16), np.float32))
    (tmp_path / "empty").mkdir()
    cases = {"wrong.npz": r"no array for input(s) ['x']", "nan.npz": "sample 1 of input 'x' has NaN/Inf",
             "shape.npz": "sample 0 of input 'x' has shape [8, 16]; the model takes [8, 32]",
             "empty": "no .npy files"}
    for data, message in cases.items():
        code = main(["quantize", str(path), "--data", str(tmp_path / data), "--out", str(tmp_path / "q.onnx")])
        err = capsys.readouterr().err
        assert code == 2 and message in err, (data, err)
    assert not (tmp_path / "q.onnx").exists()


def test_folder_of_npy_and_blocked_weights_refused(tmp_path):
    model = fp32_linear((4, 64), 64)
    (tmp_path / "d").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(tmp_path / "d" / f"s{i}.npy", rng.standard_normal((4, 64)).astype(np.float32))
    from tvm_lowprec.cli import load_samples

    samples = load_samples(str(tmp_path / "d"), [("x", [4, 64])])
    assert len(samples) == 3 and samples[0]["x"].shape == (4, 64)
    config = QuantConfig(activations=None, weights=QuantSpec("int4", True, PerGroup(32)), operators=("matmul",))
    _, plans = quantize_with_plans(tvm_lowprec.from_onnx(model), None, config, progress=False)
    with pytest.raises(ExportError, match="blocked"):
        export_qdq(model, plans)


def test_run_on_an_fp32_model_points_to_quantize(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save(fp32_linear((8, 32), 32), path)
    assert main(["run", str(path), "--repeat", "2"]) == 0
    err = capsys.readouterr().err
    assert "runs in FP32" in err and "tvm-lowprec quantize" in err
