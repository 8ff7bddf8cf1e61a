"""The benchmark harness on a tiny grid: it runs, checks tvm-lowprec against ONNX Runtime, writes files."""

import json

from tvm_lowprec.bench import QUICK_TIMING, Benchmark, run_benchmark


def test_tiny_grid_writes_csv_json_and_markdown(tmp_path):
    bench = Benchmark(
        "tiny", shapes=((4, 32, 64), (1, 48, 32)), providers=("tvm-lowprec", "tvm-lowprec-int8w", "ort-qlinearmatmul"),
        threads=(1,),
    )
    rows = run_benchmark(bench, tmp_path, timing=QUICK_TIMING)
    assert {(r["provider"], r["status"]) for r in rows} >= {("tvm-lowprec", "ok"), ("ort-qlinearmatmul", "ok")}
    for r in rows:
        if r["provider"].startswith("tvm-lowprec"):
            assert r["max_diff_vs_ort"] <= 1 and r["gops"] > 0
    meta = json.loads((tmp_path / "results.json").read_text())
    assert "metadata" in meta or "meta" in meta
    report = (tmp_path / "report.md").read_text()
    assert "tvm / ort-qlinearmatmul" in report and "4x32x64" in report
    assert (tmp_path / "results.csv").read_text().count("\n") >= len(rows)


def test_latency_plot_of_models_and_runtimes(tmp_path):
    from tvm_lowprec.bench.report import write_latency_plot

    runtimes = {"ort-int8": "ORT INT8", "tvm-lowprec-int8": "tvm-lowprec INT8"}
    rows = [{"model": "encoder", "runtime": r, "threads": t, "status": "ok", "ms": 1.0 + i + t}
            for i, r in enumerate(runtimes) for t in (1, 2)]
    rows.append({"model": "cnn", "runtime": "ort-int8", "threads": 1, "status": "error", "ms": None})
    assert write_latency_plot(rows, ["encoder", "cnn"], runtimes, [1, 2], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_denormals_are_zero_flushes_in_the_block_and_restores_the_mode():
    """The DAZ/FTZ switch of benchmarks/denormals.py: numpy's float32 arithmetic (this thread's SSE
    unit) reads a denormal as zero inside the block and as itself after it; the MXCSR is restored."""
    import platform

    import numpy as np
    import pytest

    from tvm_lowprec.bench.fpenv import DAZ, FTZ, denormals_are_zero, mxcsr

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("MXCSR is an x86 register")
    tiny = np.array([1e-40], np.float32)  # a float32 denormal
    before = mxcsr()
    assert before & (DAZ | FTZ) == 0 and (tiny * np.float32(1.0))[0] > 0
    with denormals_are_zero():
        assert mxcsr() & (DAZ | FTZ) == DAZ | FTZ
        assert (tiny * np.float32(1.0))[0] == 0 and (tiny + np.float32(0.0))[0] == 0
    assert mxcsr() & (DAZ | FTZ) == 0 and (tiny * np.float32(1.0))[0] > 0


def test_zoo_acceptance_names_its_reason():
    """benchmarks/zoo/runner.zoo_status: a cosine below 0.999 and past the graph's sensitivity is a
    mismatch, unless ONNX Runtime's own optimized run of the same file is at least as far off."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from zoo.runner import zoo_status

    far = dict(cosine=0.9963, steps=8.0, sensitivity_steps=1.0)
    assert zoo_status("mismatch", dict(far)) == "mismatch"
    assert zoo_status("mismatch", dict(far, ort_spread=0.9970)) == "mismatch"
    res = dict(far, ort_spread=0.9886)
    assert zoo_status("mismatch", res) == "ok" and res["ok_by"] == "ort_spread"
    res = dict(cosine=0.9995, steps=3.0, sensitivity_steps=1.0, ort_spread=0.9)
    assert zoo_status("mismatch", res) == "ok" and res["ok_by"] == "cosine"
