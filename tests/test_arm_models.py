"""Whole models on the AArch64 rows, run the way a user runs a remote board: cross-compiled here,
exported with ``aarch64-linux-gnu-gcc``, uploaded over TVM RPC to the emulated arm64 board (TVM's RPC
server under qemu-aarch64; conftest.arm_board) and run there by the Relax VM.

- The models of the VNNI rows' emulated-execution tests (the demo model, a conv network, a block
  network, attention, a quantize_dynamic model) against ``onnx.reference``, on every Arm row.
- ONNX's conformance cases of the matmul/conv family, exact: with constant weights (the packed,
  tensorized kernel) on every Arm row; as shipped (runtime operands) on the dot-product row.
- Tuning against the board through its tracker, end to end (functional only: emulated times mean
  nothing, and the records are not kept).
"""

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec.qemu import is_aarch64

from conformance import load_cases
from conftest import TARGETS, board_session
from models import qlinear_matmul
from reference import assert_matches
from test_emulation import MODELS
from test_onnx_conformance import _bind_all_but_first

ARM = [t for t in TARGETS if is_aarch64(t)]
FAMILY = [c for c in load_cases() if "matmul" in c.name or "conv" in c.name]


def _compiled(model, spec):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    assert compiled.execution == "none"  # not in this process: on the board
    return compiled


def _run_on_board(compiled, arm_board, *inputs):
    with compiled.remote(board_session(arm_board)) as remote:  # closed: the board serves one session
        return remote(*inputs)


def _uses_the_rows_intrinsic(compiled, spec):
    return any(k.intrinsic.startswith(f"lowprec_{spec.gemm.name}_") for k in compiled.kernels())


@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
@pytest.mark.parametrize("name", list(MODELS))
def test_model_on_the_board_matches_onnx_reference(spec, name, arm_board, rng):
    make, shape, how = MODELS[name]
    model = make(rng)
    compiled = _compiled(model, spec)
    assert _uses_the_rows_intrinsic(compiled, spec)
    reference = ReferenceEvaluator(onnx.version_converter.convert_version(model, 21))
    x = rng.standard_normal(shape).astype(np.float32)
    want = reference.run(None, {model.graph.input[0].name: x})[0]
    assert_matches(_run_on_board(compiled, arm_board, x)[0], want, how, model)


def _exact(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
@pytest.mark.parametrize("case", FAMILY, ids=lambda c: c.name)
def test_conformance_case_with_constant_weights_on_the_board(spec, case, arm_board):
    inputs, expected = case.data_sets[0]
    model, runtime_inputs = _bind_all_but_first(case.model, inputs)
    _exact(_run_on_board(_compiled(model, spec), arm_board, *[np.asarray(x) for x in runtime_inputs]), expected)


@pytest.mark.parametrize("case", FAMILY, ids=lambda c: c.name)
def test_conformance_case_as_shipped_on_the_board(case, arm_board):
    inputs, expected = case.data_sets[0]
    compiled = _compiled(case.model, tvm_lowprec.registered_targets()["arm64-dotprod"])
    _exact(_run_on_board(compiled, arm_board, *[np.asarray(x) for x in inputs]), expected)


def test_tuning_against_the_board_through_its_tracker(arm_board, tmp_path, rng):
    """``tune(..., rpc_tracker=..., rpc_key=...)`` builds the candidates here (linked with the cross
    compiler), measures them on the board and applies the best: the tuned model runs there, exact."""
    (host, port), key = arm_board
    model = qlinear_matmul(16, 64, 32)
    spec = tvm_lowprec.registered_targets()["arm64-dotprod"]
    mod = tvm_lowprec.from_onnx(model)
    result = tvm_lowprec.tune(mod, spec, trials=3, work_dir=tmp_path / "db", rpc_tracker=f"{host}:{port}",
                              rpc_key=key, progress=False)
    assert result.measured >= 1 and result.remote == f"{key}@{host}:{port}"
    compiled = tvm_lowprec.compile(mod, target=spec, database=result.database)
    assert any(k.schedule == "tuned" for k in compiled.kernels())
    a = rng.integers(0, 256, (16, 64)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: a})[0]
    np.testing.assert_array_equal(_run_on_board(compiled, arm_board, a)[0], want)


def test_cli_runs_a_model_on_the_board(arm_board, capsys):
    """``tvm-lowprec run --target arm64-i8mm --rpc-tracker ... --rpc-key ...``: the demo model on the
    board, its outputs equal to ONNX Runtime's graph as written, and the board's own time printed."""
    from tvm_lowprec.cli import main

    (host, port), key = arm_board
    assert main(["run", "--target", "arm64-i8mm", "--rpc-tracker", f"{host}:{port}", "--rpc-key", key,
                 "--repeat", "5"]) == 0
    out = capsys.readouterr().out
    assert "usmmla_v16_" in out and f"ran on the board at {key}@{host}:{port}" in out
    line = next(l for l in out.splitlines() if "graph as written" in l)  # noqa: E741
    assert float(line.rsplit(":", 1)[1]) == 0.0
