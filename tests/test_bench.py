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
