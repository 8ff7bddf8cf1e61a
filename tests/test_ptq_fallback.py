"""The ``target_sqnr`` fallback holds on every output (or the named ones), each measured on its own:
a large output that stays exact must not hide a small one that is badly quantized."""

import logging

import numpy as np
import pytest
from models import fp32_linear_one_bad_layer, one_bad_feature_inputs
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.ptq import ConfigError, QuantConfig, accuracy_report, quantize

TARGET = 30.0


def _two_output_model():
    """``big = 100 * x`` (no layer on its path: exact whatever is quantized) and ``y``: a 3-layer MLP
    whose first layer meets an input feature 1000x the others, which one per-tensor input scale wipes
    out (quantized, ``y`` falls to ~10 dB)."""
    model = fp32_linear_one_bad_layer()
    model.graph.initializer.append(numpy_helper.from_array(np.float32(100.0), "hundred"))
    model.graph.node.append(helper.make_node("Mul", ["x", "hundred"], ["big"], name="scale_up"))
    model.graph.output.insert(0, helper.make_tensor_value_info("big", TensorProto.FLOAT, [8, 32]))
    return model


def _pooled_sqnr(refs, outs):
    """The old figure: every output's values in one accumulator."""
    ref = np.concatenate([np.asarray(r, np.float64).ravel() for r in refs])
    err = ref - np.concatenate([np.asarray(o, np.float64).ravel() for o in outs])
    return 10 * np.log10(np.sum(ref ** 2) / np.sum(err ** 2))


@pytest.fixture(scope="module")
def two_outputs():
    rng = np.random.default_rng(7)
    return tvm_lowprec.from_onnx(_two_output_model()), one_bad_feature_inputs(rng, 8), one_bad_feature_inputs(rng, 4)


def test_fallback_holds_on_the_small_output_that_pooling_hid(two_outputs, caplog):
    mod, cal, held = two_outputs
    plain = quantize(mod, cal, progress=False)
    fp32, q = tvm_lowprec.compile(mod), tvm_lowprec.compile(plain)
    refs, outs = [fp32(x) for x in held], [q(x) for x in held]
    pooled = _pooled_sqnr([r for rs in refs for r in rs], [o for os in outs for o in os])
    report = accuracy_report(mod, plain, held, progress=False)
    by_name = {o.name: o.sqnr_db for o in report.outputs}
    assert set(by_name) == {"big", "y"}
    assert by_name["big"] == float("inf")  # no layer on its path
    assert pooled > TARGET and by_name["y"] < 20.0, (pooled, by_name)  # pooling hid the bad output
    assert report.binding_output == "y"

    with caplog.at_level(logging.WARNING, logger="tvm_lowprec.ptq"):
        qmod = quantize(mod, cal, QuantConfig(target_sqnr=TARGET), progress=False)
    report = accuracy_report(mod, qmod, held, progress=False)
    kept = [r.name for r in report.layers if not r.quantized]
    assert kept == ["matmul0"], report.table()
    assert {o.name: o.sqnr_db for o in report.outputs}["y"] >= TARGET, report.table()
    assert "binding output 'y'" in caplog.text and "matmul0" in caplog.text
    # every layer's isolated harm is in the report, and matmul0's is the worst
    alone = {r.name: r.alone_db for r in report.layers}
    assert None not in alone.values() and min(alone, key=alone.get) == "matmul0", alone
    table = report.table()
    assert "alone (dB)" in table and "Binding output (lowest SQNR): y" in table
    assert any("binding output 'y'" in n for n in report.notes)


def test_target_outputs_selects_and_unknown_names_are_listed(two_outputs):
    mod, cal, held = two_outputs
    # the target only on the exact output: nothing needs to stay in FP32
    qmod = quantize(mod, cal, QuantConfig(target_sqnr=TARGET, target_outputs=["big"]), progress=False)
    report = accuracy_report(mod, qmod, held, progress=False)
    assert all(r.quantized for r in report.layers), report.table()
    with pytest.raises(ConfigError, match=r"\['nope'\].*\['big', 'y'\]"):
        quantize(mod, cal, QuantConfig(target_sqnr=TARGET, target_outputs=["nope"]), progress=False)
    with pytest.raises(ConfigError, match="set target_sqnr"):
        QuantConfig(target_outputs=["y"])
    config = QuantConfig(target_sqnr=20.0, target_outputs=["y"])
    assert QuantConfig.from_json(config.to_json()) == config
