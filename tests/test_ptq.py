"""Post-training quantization (tvm_lowprec.ptq): observers, config, calibration, QDQ insertion, the
accuracy report and the FP32 fallback, checked against hand-computed values, FP32 and ONNX Runtime."""

import json
import re

import numpy as np
import pytest
from onnx import numpy_helper

import tvm_lowprec
from tvm_lowprec.ptq import (
    MSE, CalibrationError, ConfigError, Entropy, LayerOverride, MinMax, PerChannel, PerGroup, Percentile, PerTensor,
    QuantConfig, QuantSpec, accuracy_report, quantize,
)
from tvm_lowprec.ptq.observers import TensorStats, observed_range, qparams
from tvm_lowprec.targets import registered_targets, resolve_target

from models import fp32_cnn, fp32_linear, fp32_linear_one_bad_layer, one_bad_feature_inputs, quantize_qdq
from reference import ort_session


# ----------------------------------------------------------------------------- observers


def test_reduced_range_qparams():
    """7 bits: ONNX Runtime's reduce_range ranges; symmetric int8 keeps +-63, symmetric uint8 centres on 64."""
    from tvm_lowprec.ptq.observers import qrange

    assert qrange("int8", True, 7) == (-63, 63) and qrange("int8", False, 7) == (-64, 63)
    assert qrange("uint8", False, 7) == (0, 127) and qrange("int8", True) == (-127, 127)
    scale, zp = qparams(-2.0, 1.0, "int8", symmetric=True, bits=7)
    assert scale == np.float32(2 / 63) and zp == 0
    assert qparams(-1.0, 1.0, "uint8", symmetric=True, bits=7) == (np.float32(2 / 127), 64)


def test_qparams_hand_computed():
    scale, zp = qparams(-1.0, 3.0, "uint8", symmetric=False)
    assert scale == np.float32(4 / 255) and zp == 64  # round(0 - (-1) / (4/255)) = round(63.75)
    scale, zp = qparams(-2.0, 1.0, "int8", symmetric=True)
    assert scale == np.float32(2 / 127) and zp == 0
    scale, zp = qparams(0.5, 2.0, "uint8", symmetric=False)  # the range always contains 0
    assert scale == np.float32(2 / 255) and zp == 0
    assert qparams(0.0, 0.0, "uint8", symmetric=False) == (np.float32(1.0), 0)  # all-zero tensor: exact zeros


def test_minmax_and_percentile_ranges():
    stats = TensorStats()
    for chunk in np.array_split(np.arange(10000, dtype=np.float32) - 2000, 7):
        stats.update(chunk)
    assert (stats.lo, stats.hi) == (-2000.0, 7999.0)
    assert observed_range(MinMax(), stats.lo, stats.hi, stats.sample, "uint8", False) == (-2000.0, 7999.0)
    lo, hi = observed_range(Percentile(99.0), stats.lo, stats.hi, stats.sample, "uint8", False)
    assert lo == pytest.approx(np.percentile(stats.sample, 1.0)) and hi == pytest.approx(np.percentile(stats.sample, 99.0))
    assert -1950 < lo < -1850 and 7850 < hi < 7950


@pytest.mark.parametrize("observer", [Entropy(), Percentile(99.9)])
def test_clipping_observers_cut_a_lone_outlier(observer, rng):
    values = np.concatenate([rng.standard_normal(20000), [80.0]]).astype(np.float32)
    lo, hi = observed_range(observer, values.min(), values.max(), values, "int8", True)
    assert 2.5 < hi < 10.0 and lo == pytest.approx(max(float(values.min()), -hi))


def test_mse_range_beats_minmax_on_heavy_tails(rng):
    values = rng.laplace(size=20000).astype(np.float32)

    def mse(lo, hi):
        scale, zp = qparams(lo, hi, "int8", True)
        q = (np.clip(np.rint(values / scale) + zp, -127, 127) - zp) * scale
        return np.mean((q - values) ** 2)

    lo, hi = observed_range(MSE(), values.min(), values.max(), values, "int8", True)
    assert hi < 0.95 * max(-values.min(), values.max())
    assert mse(lo, hi) < 0.95 * mse(values.min(), values.max())


# ----------------------------------------------------------------------------- config


def test_config_json_round_trip():
    config = QuantConfig(
        activations=QuantSpec("int8", symmetric=True, observer=Percentile(99.99)),
        weights=QuantSpec("int8", True, PerChannel(0), MSE(steps=40), bits=7),
        operators=("conv2d",),
        overrides=(LayerOverride("conv1", activations=QuantSpec("uint8", observer=Entropy(1024))),
                   LayerOverride("head", skip=True), LayerOverride("blocked", weights=QuantSpec("int8", True, PerGroup(64)))),
        target_sqnr=30.0,
    )
    text = config.to_json()
    json.loads(text)  # plain JSON
    assert QuantConfig.from_json(text) == config
    assert QuantConfig.from_json(QuantConfig().to_json()) == QuantConfig()


def test_default_config_is_like_ort_quantize_static():
    c = QuantConfig()
    assert c.activations == QuantSpec("uint8", False, PerTensor(), MinMax())
    assert c.weights == QuantSpec("int8", True, PerChannel(), MinMax())


@pytest.mark.parametrize("make", [
    lambda: QuantSpec("int4"), lambda: QuantSpec("int8", bits=9), lambda: QuantSpec("uint8", bits=1), lambda: Percentile(10), lambda: Entropy(16), lambda: MSE(steps=1), lambda: PerGroup(0),
    lambda: QuantConfig(operators=("softmax",)),
    lambda: QuantConfig(overrides=(LayerOverride("a"), LayerOverride("a", skip=True))),
    lambda: QuantConfig.from_json('{"type": "Nope"}'),
    lambda: QuantConfig.from_json('{"type": "QuantConfig", "colour": 1}'),
])
def test_invalid_config_is_a_clear_error(make):
    with pytest.raises(ConfigError):
        make()


# ----------------------------------------------------------------------------- quantize


def _sqnr(ref, got):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2))


def _compare_with_ort(model, shape, rng, per_channel=True):
    cal = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    held = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    mod = tvm_lowprec.from_onnx(model)
    qmod = quantize(mod, cal, QuantConfig(), progress=False)  # like-for-like with ORT's defaults on any host
    compiled = tvm_lowprec.compile(qmod, target="native")
    fp32 = ort_session(model, optimized=False)
    ort_int8 = ort_session(quantize_qdq(model, cal, per_channel=per_channel), optimized=False)
    refs = [fp32.run(None, {"x": x})[0] for x in held]
    ours = _sqnr(np.stack(refs), np.stack([compiled(x)[0] for x in held]))
    theirs = _sqnr(np.stack(refs), np.stack([ort_int8.run(None, {"x": x})[0] for x in held]))
    return mod, qmod, compiled, held, ours, theirs


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_quantized_model_runs_integer_kernels_and_matches_ort_accuracy(name, rng):
    model, shape = {"mlp": (fp32_linear((8, 64), 64, act="relu", layers=3), (8, 64)),
                    "cnn": (fp32_cnn((1, 3, 16, 16)), (1, 3, 16, 16))}[name]
    mod, qmod, compiled, held, ours, theirs = _compare_with_ort(model, shape, rng)
    kernels = [k.name for k in compiled.kernels()]
    assert sum(k.startswith(("qgemm", "qconv2d", "qdepthwise")) for k in kernels) == (1 if name == "mlp" else 4)
    assert ours > 24.0 and ours >= theirs - 0.1, (ours, theirs)
    report = accuracy_report(mod, qmod, held, progress=False)
    names = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Conv")]
    assert [r.name for r in report.layers] == names and all(r.quantized for r in report.layers)
    assert all(r.sqnr_db > 20 and r.cosine > 0.99 for r in report.layers)
    assert report.output_sqnr_db == pytest.approx(ours, abs=0.01)
    assert "| " + names[0] + " |" in report.table()


def test_report_as_data_and_plot(rng, tmp_path):
    model = fp32_linear((4, 32), 32, act="relu", layers=2)
    data = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(4)]
    mod = tvm_lowprec.from_onnx(model)
    report = accuracy_report(mod, quantize(mod, data, progress=False), data, progress=False)
    loaded = json.loads(report.to_json())
    assert [r["name"] for r in loaded["layers"]] == ["matmul0", "matmul1"] and loaded["samples"] == 4
    report.plot(tmp_path / "sqnr.png")
    assert (tmp_path / "sqnr.png").stat().st_size > 1000


def test_fallback_keeps_the_bad_layer_in_fp32_and_reaches_the_target(rng, caplog):
    model = fp32_linear_one_bad_layer()
    cal, held = one_bad_feature_inputs(rng, 8), one_bad_feature_inputs(rng, 4)
    mod = tvm_lowprec.from_onnx(model)
    plain = accuracy_report(mod, quantize(mod, cal, progress=False), held, progress=False)
    assert plain.output_sqnr_db < 20  # the bad layer hurts
    qmod = quantize(mod, cal, QuantConfig(target_sqnr=30.0), progress=False)
    report = accuracy_report(mod, qmod, held, progress=False)
    kept = [r.name for r in report.layers if not r.quantized]
    assert kept == ["matmul0"], kept
    assert report.output_sqnr_db >= 30.0
    assert "matmul0" in caplog.text  # quantize says which layers it kept
    compiled = tvm_lowprec.compile(qmod, target="native")
    assert sum(k.name.startswith("qgemm") for k in compiled.kernels()) >= 1  # the rest still integer


def test_override_skip_and_per_layer_spec(rng):
    model = fp32_linear((8, 32), 32, act="relu", layers=3)
    cal = [rng.standard_normal((8, 32)).astype(np.float32) for _ in range(4)]
    mod = tvm_lowprec.from_onnx(model)
    config = QuantConfig(overrides=(LayerOverride("matmul1", skip=True),
                                    LayerOverride("matmul2", activations=QuantSpec("int8", symmetric=True))))
    report = accuracy_report(mod, quantize(mod, cal, config, progress=False), cal, progress=False)
    assert [r.quantized for r in report.layers] == [True, False, True]


# ----------------------------------------------------------------------------- bad input


def test_nan_in_calibration_data_names_sample_and_input(rng):
    mod = tvm_lowprec.from_onnx(fp32_linear((4, 16), 16))
    data = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(3)]
    data[2][1, 3] = np.nan
    with pytest.raises(CalibrationError, match=r"sample 2, input 'x': 1 NaN/Inf"):
        quantize(mod, data, progress=False)


def test_empty_calibration_set():
    with pytest.raises(CalibrationError, match="empty"):
        quantize(tvm_lowprec.from_onnx(fp32_linear((4, 16), 16)), [], progress=False)


def test_unknown_override_and_unsupported_granularity(rng):
    mod = tvm_lowprec.from_onnx(fp32_linear((4, 16), 16, layers=2))
    data = [rng.standard_normal((4, 16)).astype(np.float32)]
    with pytest.raises(ConfigError, match=r"unknown layer\(s\) \['nope'\].*'matmul0', 'matmul1'"):
        quantize(mod, data, QuantConfig(overrides=(LayerOverride("nope", skip=True),)), progress=False)
    with pytest.raises(ConfigError, match="PerGroup"):
        quantize(mod, data, QuantConfig(weights=QuantSpec("int8", True, PerGroup(8))), progress=False)
    with pytest.raises(ConfigError, match="per tensor"):
        quantize(mod, data, QuantConfig(activations=QuantSpec("uint8", granularity=PerChannel(1))), progress=False)


def test_constant_zero_tensor_gets_scale_one_and_stays_exact():
    """An input that is 0 everywhere in calibration (a zero range) is quantized with scale 1: zero
    stays exact, and the model still runs and matches FP32 on that input."""
    model = fp32_linear((4, 16), 16, act="relu", layers=2)
    mod = tvm_lowprec.from_onnx(model)
    zeros = [np.zeros((4, 16), np.float32)] * 2
    qmod = quantize(mod, zeros, progress=False)
    compiled = tvm_lowprec.compile(qmod, target="native")
    want = ort_session(model, optimized=False).run(None, {"x": zeros[0]})[0]
    np.testing.assert_allclose(compiled(zeros[0])[0], want, atol=0.02 * np.abs(want).max() + 1e-6)


def _attention(seq=16, d=32, seed=0):
    """One attention head: q, k, v projections, softmax(q k^T / sqrt(d)) v, an output projection."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"W{n}")
             for n in "qkvo"]
    inits.append(numpy_helper.from_array(np.float32(1 / np.sqrt(d)), "scale"))
    nodes = [helper.make_node("MatMul", ["x", f"W{n}"], [n], name=f"proj_{n}") for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
              helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["a"], name="context"),
              helper.make_node("MatMul", ["a", "Wo"], ["y"], name="proj_o")]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_matmuls_of_two_activations_are_quantized(rng):
    model = _attention()
    mod, qmod, compiled, held, ours, theirs = _compare_with_ort(model, (16, 32), rng)
    kernels = [k.name for k in compiled.kernels()]
    assert sum(k.startswith("pack_b") for k in kernels) == 2  # scores and context: weights packed at run time
    report = accuracy_report(mod, qmod, held, progress=False)
    assert [r.name for r in report.layers] == ["proj_q", "proj_k", "proj_v", "scores", "context", "proj_o"]
    assert all(r.quantized for r in report.layers)
    assert ours > 20.0 and ours >= theirs - 0.1, (ours, theirs)


def test_one_calibration_serves_several_configs(rng):
    from tvm_lowprec.ptq import observe

    model = fp32_linear((8, 32), 32, act="relu", layers=2)
    mod = tvm_lowprec.from_onnx(model)
    cal = [rng.standard_normal((8, 32)).astype(np.float32) for _ in range(4)]
    obs = observe(mod, cal, progress=False)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    for config in (QuantConfig(), QuantConfig(activations=QuantSpec("uint8", observer=MSE()))):
        direct = tvm_lowprec.compile(quantize(mod, cal, config, progress=False))(x)[0]
        shared = tvm_lowprec.compile(quantize(mod, config=config, observations=obs))(x)[0]
        np.testing.assert_array_equal(direct, shared)


# ----------------------------------------------------------------------------- quantize for the target


@pytest.mark.parametrize("name", sorted(registered_targets()))
def test_target_default_weights_fit_the_fast_recipe(name):
    """Rows with a bounded (int16-pair) recipe get the widest weights that recipe accepts whatever their
    values; the others keep 8 bits."""
    from tvm_lowprec.ptq.observers import qrange

    spec = resolve_target(name)
    weights = QuantConfig.for_target(name).weights
    if not spec.bounded:
        assert weights == QuantConfig().weights
        return
    assert weights == QuantSpec("int8", True, PerChannel(), MinMax(), bits=weights.bits) and weights.bits < 8
    for extreme in qrange("int8", True, weights.bits):  # the worst case: every weight at one end
        assert all(r.intrin.accepts(np.full((64, 16), extreme, np.int8)) for r in spec.bounded)
    wider = qrange("int8", True, weights.bits + 1)[1]
    assert not all(r.intrin.accepts(np.full((64, 16), wider, np.int8)) for r in spec.bounded)


def test_quantize_for_a_target_without_vnni_takes_the_fast_exact_recipe(rng, caplog):
    """On x86-avx2 the default weights are 7-bit, so the GEMM runs vpmaddubsw (exact for them); the
    report says so with the SQNR against 8-bit weights; an explicit QuantConfig() keeps 8 bits
    (vpmaddwd), and a VNNI row keeps 8 bits without a note."""
    model = fp32_linear((8, 64), 64, act="relu", layers=2)
    mod = tvm_lowprec.from_onnx(model)
    cal = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(6)]

    def gemm_intrinsics(qmod, target):
        return {k.intrinsic for k in tvm_lowprec.compile(qmod, target=target).kernels() if k.op == "qgemm"}

    with caplog.at_level("WARNING", logger="tvm_lowprec.ptq"):
        reduced = quantize(mod, cal, target="x86-avx2", progress=False)
    assert gemm_intrinsics(reduced, "x86-avx2") == {"lowprec_vpmaddubsw_ymm_uint8_8x4"}
    note = next(r.getMessage() for r in caplog.records if "7 bits" in r.getMessage())
    reduced_db, full_db = (float(x) for x in re.findall(r"(-?[\d.]+) dB", note)[:2])
    report = accuracy_report(mod, reduced, cal[:2], target="x86-avx2", progress=False)
    assert report.notes == [note] and "Note: weights quantized to 7 bits for target x86-avx2" in report.table()
    assert report.to_dict()["notes"] == [note]
    assert 20.0 < reduced_db < full_db  # one bit less: about 6 dB less signal to noise, here
    full = quantize(mod, cal, QuantConfig(), target="x86-avx2", progress=False)
    exact = resolve_target("x86-avx2").gemm.operand("uint8")  # vpmaddwd, on int8 or int16 (widened) weights
    kinds = gemm_intrinsics(full, "x86-avx2")
    assert kinds and kinds <= {exact.intrin, exact.intrin_wide_b}
    assert "lowprec.ptq_notes" not in full["main"].attrs
    vnni = quantize(mod, cal, target="x86-avx512-vnni", progress=False)
    assert "lowprec.ptq_notes" not in vnni["main"].attrs


def test_reduced_bits_are_for_weights_only():
    mod = tvm_lowprec.from_onnx(fp32_linear((4, 16), 16))
    data = [np.ones((4, 16), np.float32)]
    with pytest.raises(ConfigError, match="bits=7 is for weights"):
        quantize(mod, data, QuantConfig(activations=QuantSpec("uint8", bits=7)), progress=False)


def test_a_silu_read_by_squeeze_and_excitation_is_quantized(rng):
    """EfficientNet's block: the SiLU after a convolution feeds the block's mean and its scaling
    multiply, not a layer. It is quantized too (Layer.activation), so neither the SiLU nor its readers
    run in float32 over the block's tensor: no float sigmoid kernel reads it; the accuracy stays at
    ORT's; and export_qdq writes the same Q/DQ pair after the Mul (ORT runs the file within a step)."""
    from onnx.reference import ReferenceEvaluator

    from models import fp32_se_block
    from tvm_lowprec.ptq.export_onnx import export_qdq
    from tvm_lowprec.ptq.quantize import quantize_with_plans

    shape = (1, 8, 16, 16)
    model = fp32_se_block(shape)
    cal = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    held = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    qmod, plans = quantize_with_plans(tvm_lowprec.from_onnx(model), cal, QuantConfig(), progress=False)
    (conv0,) = [p for p in plans if p.layer.name == "conv0"]
    assert conv0.activation is not None and conv0.layer.activation is not None
    compiled = tvm_lowprec.compile(qmod, target="native")
    block = 16 * 16 * 16  # the block's tensor: 4096 codes, or 16 KiB in float32
    floats = [k for k in compiled.kernels() if k.reads is not None and max(k.reads, k.writes) >= 4 * block
              and k.op not in ("im2col", "pad", "qgemm")]  # the convolutions' own copies and GEMMs read codes
    assert not floats, floats  # the SiLU is a table, its mean and scaling read 8-bit codes
    fp32 = ReferenceEvaluator(model)
    refs = np.stack([fp32.run(None, {"x": x})[0] for x in held])
    ours = _sqnr(refs, np.stack([compiled(x)[0] for x in held]))
    ort_int8 = ort_session(quantize_qdq(model, cal), optimized=False)
    theirs = _sqnr(refs, np.stack([ort_int8.run(None, {"x": x})[0] for x in held]))
    assert ours > 20.0 and ours >= theirs - 1.0, (ours, theirs)
    exported = export_qdq(model, plans)
    silu_qdq = [n for n in exported.graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("silu0")]
    assert len(silu_qdq) == 1, [n.input[0] for n in exported.graph.node if n.op_type == "QuantizeLinear"]
    from_file = np.stack([ort_session(exported, optimized=False).run(None, {"x": x})[0] for x in held])
    with np.errstate(divide="ignore"):  # bit-identical is an infinite SQNR
        assert _sqnr(from_file, np.stack([compiled(x)[0] for x in held])) > 30.0
