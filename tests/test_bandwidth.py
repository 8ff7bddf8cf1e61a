"""Bytes per kernel, the host's copy bandwidth and the profile's memory-speed columns.

No assertion is made on a speed (hosts are noisy): only that the figures are what their definitions say.
"""

import math

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.bench import bandwidth
from tvm_lowprec.bench.bandwidth import CopyBandwidth, copy_bandwidth
from tvm_lowprec.cli import DEMO_MODEL

from models import qlinear_matmul


def quantize_model(shape=(64, 256)) -> onnx.ModelProto:
    """One QuantizeLinear, float32 -> uint8, as ORT's quantizer puts at a model's input."""
    inits = [numpy_helper.from_array(np.float32(0.05), "scale"), numpy_helper.from_array(np.uint8(128), "zp")]
    graph = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"])], "quantize",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def demo():
    """The shipped demo: two int8 GEMMs, a quantize and a dequantize."""
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(DEMO_MODEL), target="native", num_threads=1)


def test_bytes_of_a_quantize_are_its_buffers():
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(quantize_model()), target="native")
    (kernel,) = [k for k in compiled.kernels() if k.op == "quantize"]
    assert (kernel.reads, kernel.writes) == (64 * 256 * 4, 64 * 256)
    assert kernel.bytes == 64 * 256 * 5


def test_bytes_of_a_gemm_count_its_weights_and_epilogue_parameters(demo):
    gemm = next(k for k in demo.kernels() if k.name == "qgemm_u8_8x256x128_requant")
    # A [8, 128] u8, packed B 256x128 in the row's storage (s8; s16 where the AVX2 rows widen the
    # weights for vpmaddwd), per-column correction (s32) and multiplier (f32), the output's zero point
    # and bounds (3 x s32); C [8, 256] u8
    b_bytes = np.dtype(str(demo._lowered[gemm.name].attrs["lowprec.b_storage"])).itemsize
    assert (gemm.reads, gemm.writes) == (8 * 128 + 256 * 128 * b_bytes + 256 * 4 + 256 * 4 + 3 * 4, 8 * 256)


def test_symbolic_shapes_have_no_bytes():
    model = qlinear_matmul(4, 32, 16)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    symbolic = [k for k in compiled.kernels() if any(isinstance(d, str) for d in k.shape)]
    assert symbolic and all(k.bytes is None and k.reads is None for k in symbolic)


def test_copy_bandwidth_is_measured_once_and_sensible(monkeypatch):
    table = copy_bandwidth()
    assert len(table.moved) == len(bandwidth.BUFFER_SIZES)
    assert table.moved == tuple(2 * n for n in bandwidth.BUFFER_SIZES)  # a copy of N bytes moves 2N
    assert table.moved[0] == 2 * 16 * 1024 and table.moved[-1] == 2 * 64 * 2**20
    assert all(math.isfinite(g) and g > 0 for g in (*table.gbs, *table.tvm_gbs, *table.numpy_gbs))
    assert table.gbs == tuple(map(max, table.tvm_gbs, table.numpy_gbs))
    assert table.threads == bandwidth.pool_threads()

    def measure_again(*args, **kwargs):
        raise AssertionError("measured a second time")

    monkeypatch.setattr(bandwidth, "measure_copy_bandwidth", measure_again)
    assert copy_bandwidth() is table


def test_ceiling_interpolates_in_log_size_and_holds_flat_beyond():
    table = CopyBandwidth(moved=(1024, 4096, 16384), tvm_gbs=(10.0, 30.0, 5.0), numpy_gbs=(20.0, 1.0, 1.0), threads=1)
    assert table.gbs == (20.0, 30.0, 5.0) and table.source == ("numpy", "tvm", "tvm")
    assert table.ceiling(16) == 20.0 and table.ceiling(1 << 30) == 5.0
    assert table.ceiling(4096) == 30.0 and table.ceiling(2048) == pytest.approx(25.0)  # halfway in log2
    with pytest.raises(ValueError):
        CopyBandwidth(moved=(4096, 1024), tvm_gbs=(1.0, 1.0), numpy_gbs=(1.0, 1.0), threads=1)
    with pytest.raises(ValueError):
        CopyBandwidth(moved=(1024,), tvm_gbs=(math.nan,), numpy_gbs=(1.0,), threads=1)


def test_profile_rows_carry_bytes_gbs_and_pct_copy(demo, rng):
    x = rng.standard_normal((8, 128)).astype(np.float32)
    rows = demo.profile(x, repeat=3)
    table = copy_bandwidth()  # the one the profile used: the pool runs the model's single thread
    assert table.threads == 1
    kernels = {k.name: k for k in demo.kernels()}
    for r in rows:
        info = kernels[r["name"]]
        assert r["bytes"] == info.bytes
        assert r["gbs"] == pytest.approx(info.bytes * r["calls"] / r["ms"] / 1e6)
        if r["op"] == "qgemm":
            assert r["gops"] is not None and r["pct_copy"] is None
        else:
            assert r["gops"] is None
            assert r["pct_copy"] == pytest.approx(100 * r["gbs"] / table.ceiling(info.bytes))
    assert {r["op"] for r in rows} >= {"qgemm", "quantize", "dequantize"}


def test_isolated_profile_times_the_same_kernels_alone(demo, rng):
    x = rng.standard_normal((8, 128)).astype(np.float32)
    in_model = {r["name"]: r for r in demo.profile(x, repeat=3)}
    alone = demo.profile(x, repeat=3, isolated=True)
    assert {r["name"] for r in alone} == set(in_model) and all(r["timed"] == "isolated" for r in alone)
    assert all(in_model[r["name"]]["timed"] == "in model" for r in alone)
    for r in alone:
        assert r["calls"] == in_model[r["name"]]["calls"] and r["ms"] > 0
        assert r["gbs"] == pytest.approx(r["bytes"] * r["calls"] / r["ms"] / 1e6)
    assert sum(r["share"] for r in alone) == pytest.approx(1.0)


def test_isolated_profile_fills_buffers_by_their_type():
    from tvm_lowprec.compiled import _random_fill

    rng = np.random.default_rng(0)
    buffer = lambda dtype: tvm.tirx.decl_buffer((4096,), dtype)  # noqa: E731
    codes = _random_fill(rng, buffer("uint8"))
    assert codes.dtype == np.uint8 and codes.min() == 0 and codes.max() == 255  # every code, full range
    assert _random_fill(rng, buffer("int8")).min() == -128
    assert not _random_fill(rng, buffer("int32")).any()  # indices and biases: zeros stay in range
    floats = _random_fill(rng, buffer("float32"))
    assert floats.dtype == np.float32 and 0.9 < floats.std() < 1.1


def test_isolated_profile_keeps_the_in_model_time_of_a_symbolic_kernel(rng):
    model = qlinear_matmul(4, 32, 16)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.warns(UserWarning, match="dynamic dimension"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", num_threads=1)
    a = rng.integers(0, 256, (4, 32), dtype=np.uint8)
    rows = compiled.profile(a, repeat=2, isolated=True)
    symbolic = {k.name for k in compiled.kernels() if k.bytes is None}
    assert symbolic and {r["name"] for r in rows if r["timed"] == "in model"} == symbolic & {r["name"] for r in rows}


def test_cli_run_table_shows_the_memory_columns(capsys):
    from tvm_lowprec.cli import main

    assert main(["run", "--repeat", "3"]) == 0
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()
    header = table[0].split()
    assert table[0].startswith("name") and {"GOPS", "bytes", "GB/s", "%", "copy"} <= set(header)
    quantize = next(line for line in table[2:] if line.startswith("quantize"))
    assert "5.0 KiB" in quantize and quantize.rstrip().endswith("%") and quantize.count("%") == 2
    gemm = next(line for line in table[2:] if line.startswith("qgemm"))
    assert gemm.count("%") == 1  # GOPS, no % of copy bandwidth: only its share


def test_cli_run_isolated_says_how_kernels_were_timed(capsys):
    from tvm_lowprec.cli import main

    assert main(["run", "--repeat", "3", "--isolated"]) == 0
    out = capsys.readouterr().out
    assert "each kernel timed alone" in out and "qgemm" in out
