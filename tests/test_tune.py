"""MetaSchedule tuning of the integer kernels (tvm_lowprec.tune): the design space keeps the
intrinsic and always builds, tuned records are applied by compile and stay exact, a second run
resumes from the database, and an unreadable database never breaks a compile."""

import numpy as np
import pytest
import tvm
from onnx.reference import ReferenceEvaluator
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

import tvm_lowprec
from tvm_lowprec.targets import registered_targets, resolve_target
from tvm_lowprec.tune import extract_tasks, qgemm_space

from conftest import runnable
from models import qlinear_matmul

MODEL = dict(m=48, k=128, n=64)


def _model():
    return qlinear_matmul(MODEL["m"], MODEL["k"], MODEL["n"])


def _x(rng):
    return rng.integers(0, 256, (MODEL["m"], MODEL["k"])).astype(np.uint8)


def _reference(model, x):
    return ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]


@pytest.mark.parametrize("name", sorted(registered_targets()))
def test_every_sampled_candidate_keeps_the_intrinsic_and_builds(name):
    """Ten random draws of the design space per target row: each tensorizes with the row's intrinsic
    and builds (exactness of a tuned kernel: the end-to-end test below)."""
    spec = resolve_target(name)
    (task,) = extract_tasks(tvm_lowprec.from_onnx(_model()), spec)
    intrin = str(task.func.attrs["lowprec.intrin"])
    for seed in range(1, 11):
        sch = Schedule(_normalize_mod(task.func), seed=seed)
        qgemm_space(sch)
        assert intrin in str(sch.trace)
        tvm.compile(sch.mod, target=spec.tvm_target(1))


@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_tune_then_compile_with_the_records(tmp_path, rng):
    model = _model()
    mod = tvm_lowprec.from_onnx(model)
    work = tmp_path / "db"
    database = tvm_lowprec.tune(mod, "native", trials=2, work_dir=work, progress=False)
    records = database.get_all_tuning_records()
    assert len(records) == 2
    assert all(float(r.run_secs[0]) < 1.0 for r in records)  # every candidate built and ran (failures: 1e10)
    compiled = tvm_lowprec.compile(mod, "native", database=work)
    tuned = [f for _, f in compiled._lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("lowprec.op", None) == "qgemm"]
    assert len(tuned) == 1 and bool(tuned[0].attrs.get("lowprec.tuned", False))
    x = _x(rng)
    np.testing.assert_array_equal(compiled(x)[0], _reference(model, x))
    # a second run with the same folder finds the trials done: nothing new is measured
    again = tvm_lowprec.tune(mod, "native", trials=2, work_dir=work, progress=False)
    assert len(again.get_all_tuning_records()) == 2
    # reopened from its files, the database gives the same best schedule
    from tvm_lowprec.tune import open_database

    reopened = open_database(work)
    (task,) = extract_tasks(mod, resolve_target("native"))
    target = resolve_target("native").tvm_target(2)
    best = [database.query_tuning_record(_normalize_mod(task.func), target, "main"),
            reopened.query_tuning_record(_normalize_mod(task.func), target, "main")]
    assert str(best[0].trace) == str(best[1].trace)


def test_unreadable_database_warns_and_compiles_with_defaults(tmp_path, rng):
    work = tmp_path / "broken"
    work.mkdir()
    (work / "database_workload.json").write_text("{ this is not json\n")
    (work / "database_tuning_record.json").write_text("")
    model = _model()
    with pytest.warns(UserWarning, match="cannot be read"):
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), "native", database=work)
    if runnable(resolve_target("native")):
        x = _x(rng)
        np.testing.assert_array_equal(compiled(x)[0], _reference(model, x))


def test_model_without_integer_kernels_has_no_tasks():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    mod = tvm_lowprec.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert extract_tasks(mod, resolve_target("native")) == []


def test_kernels_without_a_search_space_are_named(caplog, tmp_path):
    """A depthwise convolution has an integer kernel but no tensorized space: tune says so by name."""
    from models import qlinear_conv
    from tvm_lowprec.tune import untunable_kernels

    mod = tvm_lowprec.from_onnx(qlinear_conv((1, 8, 10, 10), 8, (3, 3), pads=(1, 1, 1, 1), group=8))
    spec = resolve_target("native")
    assert extract_tasks(mod, spec) == []
    assert [n for n in untunable_kernels(mod, spec) if n.startswith("qdepthwise")]
    with caplog.at_level("WARNING", logger="tvm_lowprec.tune"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path / "db", progress=False)
    assert "qdepthwise" in caplog.text and "no tensorized search space" in caplog.text
