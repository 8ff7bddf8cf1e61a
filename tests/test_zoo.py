"""The model zoo's code path (benchmarks/zoo/) on three of its smallest models: build with random weights,
export, ORT's pre-processing and static quantization, tvm_lowprec.compile, compare with ONNX Runtime running
the same QDQ file as written. Each model runs in its own process (zoo.runner.run_isolated), as in
``benchmarks/zoo.py``; no timing. Built files are cached (``TVM_LOWPREC_ZOO_CACHE``, default
``~/.cache/tvm-lowprec-zoo``): the first run exports (about a minute more), later runs reuse them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

import zoo  # noqa: E402
from zoo.common import ZooModel  # noqa: E402
from zoo.runner import RunConfig, run_isolated  # noqa: E402

TIMEOUT_S = 240  # per model process; a cold cache (export + quantize + compile) takes about a minute

# (zoo name, input size, the packages its builder imports)
CASES = [
    ("squeezenet1_1", 64, ("torchvision",)),  # a CNN at 64x64
    ("bert_tiny", 32, ("transformers",)),  # 2-layer BERT, d 128, sequence 32
    ("yolov8n", 128, ("ultralytics",)),  # a detector at 128x128
]


def _require(packages):
    for package in packages:
        if package == "torchvision":  # through the zoo's import (declares the operator schemas if needed)
            from zoo.torchvision import import_torchvision

            try:
                import_torchvision()
            except ImportError:
                pass
        pytest.importorskip(package)


def test_registry_shapes():
    """Every source is present, every entry is a ZooModel with a reduced size no larger than its default."""
    assert set(zoo.SOURCES) == {"torchvision", "timm", "transformers", "ultralytics", "keras"}
    assert zoo.REGISTRY["keras_mobilenet_v2"].key(96, True) == "keras_mobilenet_v2-96-tf2onnx"
    for name, entry in zoo.REGISTRY.items():
        assert isinstance(entry, ZooModel) and entry.name == name
        assert 0 < entry.small_size <= entry.size
    for name in zoo.QUICK:
        assert name in zoo.REGISTRY
    assert zoo.REGISTRY["yolov8n"].key(160, True) == "yolov8n-160-ultralytics"


@pytest.mark.parametrize("name,size,packages", CASES, ids=[c[0] for c in CASES])
def test_zoo_model_matches_onnxruntime(name, size, packages, tmp_path):
    _require(packages)
    config = RunConfig(size=size, timing=None, profile=False, threads=[1])
    result = run_isolated(name, config, TIMEOUT_S, tmp_path / f"{name}.log")
    log_tail = (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
    assert result["status"] == "ok", f"{name}: {result.get('status')}: {result.get('error')}\n{log_tail}"
    assert result["stage"] == "done"
    assert result["compile_s"] > 0
    assert result["cosine"] >= 0.999, json.dumps(result, indent=1)[:2000]
    assert result["unscheduled"] == []  # every kernel has a real schedule (no serial, scalar loops)
    manifest = json.loads(Path(result["int8"]).with_suffix("").with_suffix(".json").read_text())
    assert manifest["quantization"]["quant_format"] == "QDQ"
    assert manifest["int8"]["ops"].get("QuantizeLinear", 0) > 0  # really quantized


def test_crash_is_a_row(tmp_path):
    """A model process that dies is reported with its stage and signal, not raised."""
    result = run_isolated("no_such_model", RunConfig(timing=None), 120, tmp_path / "x.log")
    assert result["status"] == "crashed"
    assert "exit code" in result["error"] or "without a result" in result["error"]


def _result(model, tvm_ms, ort_ms, status="ok", unscheduled=(), kernels=(), tags=(), ort_gops=None):
    return {"model": model, "status": status, "stage": "done", "unscheduled": list(unscheduled), "tags": list(tags),
            "times": {"1": {"tvm-lowprec": {"ms": tvm_ms}, "ort-int8": {"ms": ort_ms}}},
            "profile_top": [{"name": n, "ms": ms, "pct_copy": pct} for n, ms, pct in kernels],
            **({"ort_gemm": {"gops": ort_gops}} if ort_gops else {})}


def test_the_zoo_check_names_every_bar_a_run_misses():
    """``zoo.py --check``: the issue's bars on a run's results (no timing here: results as a run writes them)."""
    from zoo import checks as script
    good = [_result("a", 1.0, 2.0, kernels=[("gemm", 0.5, None), ("copy", 0.1, 40.0)]), _result("b", 1.0, 1.6)]
    assert script.check_lines(good, [1]) == []
    assert "2.00x" not in script.geomean_line(good, [1]) and "1.79x" in script.geomean_line(good, [1])
    bad = [_result("slow", 1.0, 0.9), _result("wrong", 1.0, 3.0, status="mismatch"),
           _result("serial", 1.0, 3.0, unscheduled=["fused_sum"]),
           _result("strided", 1.0, 3.0, kernels=[("fused_variance", 0.05, 5.9), ("tiny", 0.001, 1.0)])]
    lines = script.check_lines(bad, [1])
    assert any("`slow`" in line and "0.90x" in line for line in lines)
    assert any("`wrong`" in line and "mismatch" in line for line in lines)
    assert any("`serial`" in line and "fused_sum" in line for line in lines)
    assert any("fused_variance" in line for line in lines) and not any("tiny" in line for line in lines)
    assert len(lines) == 4  # geometric mean 2.01x: above its bar
    assert any("geometric mean" in line for line in script.check_lines([_result("x", 1.0, 1.2)], [1]))


def test_the_zoo_check_holds_each_class_to_its_bar():
    """CNNs 1.5x unless ORT's GEMM work is above 60% of the peak (then 1.1x), transformers 1.3x, a model with
    several tags the highest; an unknown peak or ORT profile leaves the class bar standing."""
    from zoo import checks as script
    peak = 400.0

    def failed(result, peak_gops=peak):
        return [line for line in script.check_lines([result], [1], peak_gops) if "geometric" not in line]

    assert failed(_result("cnn", 1.0, 1.6, tags=["cnn"], ort_gops=100)) == []
    assert "bar 1.5x" in failed(_result("cnn", 1.0, 1.4, tags=["cnn"], ort_gops=100))[0]
    assert failed(_result("resnet", 1.0, 1.2, tags=["cnn"], ort_gops=0.7 * peak)) == []  # ORT near the peak
    assert "bar 1.1x" in failed(_result("resnet", 1.0, 1.05, tags=["cnn"], ort_gops=0.7 * peak))[0]
    assert "bar 1.5x" in failed(_result("resnet", 1.0, 1.2, tags=["cnn"], ort_gops=0.7 * peak), None)[0]
    assert failed(_result("bert", 1.0, 1.35, tags=["transformer"], ort_gops=0.9 * peak)) == []
    assert "bar 1.3x" in failed(_result("bert", 1.0, 1.25, tags=["transformer"]))[0]
    assert "bar 1.5x" in failed(_result("hybrid", 1.0, 1.4, tags=["cnn", "transformer"], ort_gops=0.9 * peak))[0]
    assert failed(_result("untagged", 1.0, 1.05)) == []  # the every-model bar only
    assert script.class_bar(_result("x", 1, 1, tags=["detector"], ort_gops=0.3 * peak), peak) == (1.5, "detector, ORT's GEMM work at 30% of peak")
