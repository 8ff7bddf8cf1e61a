"""MetaSchedule tuning of the integer kernels (tvm_lowprec.tune): the design space keeps the
intrinsic and always builds, tuned records are applied by compile and stay exact, a second run
resumes from the database, and an unreadable database never breaks a compile."""

import itertools
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx.reference import ReferenceEvaluator
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

import tvm_lowprec
from tvm_lowprec.schedule.qgemm import QGemmRule
from tvm_lowprec.targets import registered_targets, resolve_target
from tvm_lowprec.tune import TuningError, default_schedule, extract_tasks, open_database, qgemm_space
from tvm_lowprec.schedule.qgemm import is_narrow, row_runs
from tvm_lowprec.tune.space import MAX_K_SLICES, MAX_ROWS, space_size

from conftest import runnable
from models import qlinear_matmul

TESTS = Path(__file__).resolve().parent

MODEL = dict(m=48, k=128, n=64)


def _model():
    return qlinear_matmul(MODEL["m"], MODEL["k"], MODEL["n"])


def _x(rng):
    return rng.integers(0, 256, (MODEL["m"], MODEL["k"])).astype(np.uint8)


def _reference(model, x):
    return ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]


@pytest.mark.parametrize("name", sorted(registered_targets("cpu")))
def test_every_sampled_candidate_keeps_the_intrinsic_and_builds(name):
    """Random draws of both design spaces (K whole, K blocked) per target row: each tensorizes with
    the row's intrinsic and builds (exactness of a tuned kernel: the end-to-end test below)."""
    spec = resolve_target(name)
    (task,) = extract_tasks(tvm_lowprec.from_onnx(_model()), spec)
    intrin = str(task.func.attrs["lowprec.intrin"])
    for seed in range(1, 6):
        for k_blocked in (False, True):
            sch = Schedule(_normalize_mod(task.func), seed=seed)
            qgemm_space(sch, k_blocked)
            assert intrin in str(sch.trace)
            tvm.compile(sch.mod, target=spec.tvm_target(1))


def _attention_scores():
    """Q·Kᵀ of 12 heads: both operands activations, so a batched kernel fed by run-time packing."""
    from test_batched import _qlinear_matmul_runtime_b

    return _qlinear_matmul_runtime_b((12, 32, 64), (12, 64, 32), "uint8", 131)


@pytest.mark.parametrize("name", sorted(registered_targets("cpu")))
@pytest.mark.parametrize("shape", [(48, 128, 64), (256, 512, 512), (3136, 576, 64), "batched"])
def test_default_schedule_is_a_point_of_the_space(name, shape):
    """The default rule's schedule is the space's trace with the rule's tile as decisions (the tuner
    measures it first), and the trace replays with every row tile the search may pick (a loop count
    that depended on the tile would make mutated candidates fail to replay). Batched kernels too."""
    spec = resolve_target(name)
    model = _attention_scores() if shape == "batched" else qlinear_matmul(*shape)
    (task,) = extract_tasks(tvm_lowprec.from_onnx(model), spec)
    func = _normalize_mod(task.func)["main"]
    assert (int(func.attrs["lowprec.batch"]) > 0) == (shape == "batched")
    default = default_schedule(func)
    assert tvm_ffi.structural_equal(default.mod, QGemmRule().apply(func, spec).mod)
    for k_blocked in (False, True):
        base = Schedule(func)
        qgemm_space(base, k_blocked)
        row_sample = next(i for i in base.trace.insts if i.kind.name == "SamplePerfectTile")
        rows = int(np.prod([int(d) for d in base.trace.decisions[row_sample]]))
        runs = len(base.trace.decisions[row_sample]) == 3  # a narrow GEMM's runs of row tiles, K whole
        assert runs == (not k_blocked and is_narrow(func))
        for mr in [d for d in range(1, MAX_ROWS + 1) if rows % d == 0]:
            decision = [*row_runs(rows // mr), mr] if runs else [rows // mr, mr]
            trace = base.trace.with_decision(row_sample, decision, remove_postproc=True)
            replayed = Schedule(func)
            trace.apply_to_schedule(replayed, remove_postproc=True)
        if shape == "batched":  # one draw of each space builds (the others: the test above, unbatched)
            tvm.compile(replayed.mod, target=spec.tvm_target(1))


def _perfect_tiles(extent, n, bound):
    """Every ``n``-factor split of ``extent`` whose innermost factor is at most ``bound``."""
    if n == 1:
        return [[extent]]
    return [[*outer, d] for d in range(1, min(extent, bound) + 1) if extent % d == 0
            for outer in _perfect_tiles(extent // d, n - 1, extent)]


def test_space_size_counts_every_distinct_schedule():
    """space_size (where the tuner stops searching) equals the distinct schedules that replaying every
    decision of both design spaces gives."""
    spec = resolve_target("x86-avx2")
    (task,) = extract_tasks(tvm_lowprec.from_onnx(_model()), spec)
    func = _normalize_mod(task.func)["main"]
    seen = set()
    for k_blocked in (False, True):
        base = Schedule(func)
        qgemm_space(base, k_blocked)
        samples = [i for i in base.trace.insts if i.kind.name == "SamplePerfectTile"]
        extents = [int(np.prod([int(d) for d in base.trace.decisions[i]])) for i in samples]
        parts = [len(base.trace.decisions[i]) for i in samples]  # 3: runs of row tiles, tiles per run, mr
        choices = [_perfect_tiles(e, n, bound) for e, n, bound in zip(extents, parts, (MAX_ROWS, MAX_K_SLICES))]
        for decisions in itertools.product(*choices):
            trace = base.trace
            for inst, decision in zip(samples, decisions):
                trace = trace.with_decision(inst, decision, remove_postproc=True)
            sch = Schedule(func)
            trace.apply_to_schedule(sch, remove_postproc=True)
            seen.add(tvm_ffi.structural_hash(sch.mod))
    assert len(seen) == space_size(func)


def test_validated_schedules_rank_before_single_measurements(tmp_path):
    """A schedule measured once (a possibly lucky time) does not beat validated ones; among validated
    schedules the median decides, and the validated default stays unless beaten by MIN_GAIN; compile's
    lookup applies the winner and leaves the kernel it was given untouched."""
    from tvm.s_tir import meta_schedule as ms
    from tvm_lowprec.tune.tuner import _best, _ranked, _records, database_lookup

    spec = resolve_target("x86-avx2")
    (task,) = extract_tasks(tvm_lowprec.from_onnx(_model()), spec)
    func = _normalize_mod(task.func)["main"]
    pristine = tvm_ffi.structural_hash(task.func)
    db = open_database(tmp_path)
    workload = db.commit_workload(_normalize_mod(task.func))
    traces = []
    for seed in range(1, 40):  # three distinct schedules of the space
        sch = Schedule(func, seed=seed)
        qgemm_space(sch, True)
        if all(str(sch.trace) != str(t) for t in traces):
            traces.append(sch.trace)
        if len(traces) == 3:
            break
    lucky, slow, good = traces
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    target = spec.tvm_target(2)

    def commit(trace, secs):
        db.commit_tuning_record(ms.database.TuningRecord(trace, workload, secs, target, args_info))

    for trace, secs in ((lucky, [1e-4]), (slow, [3e-4]), (slow, [3e-4, 3.1e-4]), (good, [2e-4]), (good, [2e-4, 2.5e-4])):
        commit(trace, secs)
    ranked = _ranked(_records(db, task.func))
    assert [str(r.trace) for r, *_ in ranked] == [str(good), str(slow), str(lucky)]
    assert ranked[0][1] == pytest.approx(2e-4)  # median of 2e-4, 2e-4, 2.5e-4
    chosen = database_lookup(db, spec)(task.func)
    replayed = Schedule(_normalize_mod(task.func))
    qgemm_space(replayed, True, decisions=[[int(d) for d in good.decisions[i]] for i in good.insts
                                          if i.kind.name == "SamplePerfectTile"])
    assert tvm_ffi.structural_equal(chosen.mod, replayed.mod)
    assert tvm_ffi.structural_hash(task.func) == pristine  # the replay worked on a copy
    # the validated default within MIN_GAIN (3%) of the winner stays: noise is no reason to swap
    default = default_schedule(func).trace
    commit(default, [2.05e-4, 2.05e-4])
    assert str(_best(_records(db, task.func), func)[0].trace) == str(default)
    commit(default, [2.5e-4, 2.5e-4])  # now a median of 2.275e-4 against 2e-4: the tuned one wins
    assert str(_best(_records(db, task.func), func)[0].trace) == str(good)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One 2-trial tuning run (the default schedule, then one searched candidate), shared. It uses the
    random cost model (the XGBoost one: the interrupted, remote and CLI runs below)."""
    if not runnable(resolve_target("native")):
        pytest.skip("needs a host that runs the native row")
    work = tmp_path_factory.mktemp("tuned") / "db"
    return tvm_lowprec.tune(tvm_lowprec.from_onnx(_model()), "native", trials=2, work_dir=work, progress=False,
                            cost_model="random")


def test_cost_model_is_checked_before_tuning(tmp_path, monkeypatch):
    from tvm_lowprec.tune import tuner

    mod = tvm_lowprec.from_onnx(_model())
    with pytest.raises(ValueError, match="cost_model must be one of xgb, random"):
        tvm_lowprec.tune(mod, "native", trials=2, work_dir=tmp_path, cost_model="gbm")
    real = tuner.importlib.util.find_spec
    monkeypatch.setattr(tuner.importlib.util, "find_spec", lambda name: None if name == "xgboost" else real(name))
    with pytest.raises(TuningError, match=r"needs the xgboost package.*cost_model='random'"):
        tvm_lowprec.tune(mod, "native", trials=2, work_dir=tmp_path)
    assert not open_database(tmp_path).get_all_tuning_records()  # refused before measuring anything


def _schedules(compiled):
    return [k.schedule for k in compiled.kernels() if k.op == "qgemm"]


def test_tune_then_compile_with_the_records(tuned, rng):
    model = _model()
    mod = tvm_lowprec.from_onnx(model)
    records = tuned.database.get_all_tuning_records()
    assert len(records) == 2 and tuned.measured == 2
    assert all(float(r.run_secs[0]) < 1.0 for r in records)  # every candidate built and ran (failures: 1e10)
    (row,) = tuned.tasks
    assert row.failed == 0 and row.trials == 2
    assert row.default_us is not None and row.best_us <= row.default_us  # the default was measured first
    assert "| qgemm_" in tuned.table() and "trials/s" in tuned.table()
    compiled = tvm_lowprec.compile(mod, "native", database=tuned.work_dir)
    assert _schedules(compiled) == ["tuned"]
    assert _schedules(tvm_lowprec.compile(mod, "native", database=False)) == ["default"]
    x = _x(rng)
    np.testing.assert_array_equal(compiled(x)[0], _reference(model, x))
    # a second run with the same folder finds the trials done: nothing new is measured
    again = tvm_lowprec.tune(mod, "native", trials=2, work_dir=tuned.work_dir, progress=False)
    assert again.measured == 0 and len(again.database.get_all_tuning_records()) == 2
    # reopened from its files, the database gives the same best schedule
    reopened = open_database(tuned.work_dir)
    (task,) = extract_tasks(mod, resolve_target("native"))
    target = resolve_target("native").tvm_target(2)
    best = [db.query_tuning_record(_normalize_mod(task.func), target, "main") for db in (tuned.database, reopened)]
    assert str(best[0].trace) == str(best[1].trace)


def test_shipped_records_are_used_when_the_target_matches(tuned, tmp_path, monkeypatch, rng):
    """Records under schedules/<row>/ apply without database=...; database=False turns them off."""
    from tvm_lowprec.tune import tuner

    row = resolve_target("native").row
    shutil.copytree(tuned.work_dir, tmp_path / row, ignore=shutil.ignore_patterns("logs"))
    monkeypatch.setattr(tuner, "SCHEDULE_DIRS", (tmp_path,))
    tuner._shipped.cache_clear()
    model = _model()
    mod = tvm_lowprec.from_onnx(model)
    try:
        assert _schedules(tvm_lowprec.compile(mod, "native")) == ["tuned"]
        assert _schedules(tvm_lowprec.compile(mod, "native", database=False)) == ["default"]
        other = tvm_lowprec.from_onnx(qlinear_matmul(32, 64, 32))  # no record: the default rule
        assert _schedules(tvm_lowprec.compile(other, "native")) == ["default"]
    finally:
        tuner._shipped.cache_clear()


@pytest.mark.host_dependent
@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_interrupted_run_resumes(tmp_path):
    """A tuning process killed after its first record keeps it; the next run measures only the rest."""
    work = tmp_path / "db"
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import tvm_lowprec; from models import qlinear_matmul\n"
              f"tvm_lowprec.tune(tvm_lowprec.from_onnx(qlinear_matmul(**{MODEL!r})), 'native', trials=64, "
              f"work_dir={str(work)!r}, progress=False)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = work / "database_tuning_record.json"
    try:
        deadline = time.time() + 300
        while not (records.exists() and records.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.time() < deadline, "the tuning process ended without a record"
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()
    lines = [json.loads(line) for line in records.read_text().split("\n")[:-1]]  # complete lines only
    kept = len(lines)
    assert 1 <= kept < 64
    # the search counts distinct schedules: the killed run may have measured one twice (the default,
    # then the same trace sampled by the search), and the budget is in distinct schedules
    distinct = len({json.dumps(record[1][0], sort_keys=True) for record in lines})
    result = tvm_lowprec.tune(tvm_lowprec.from_onnx(_model()), "native", trials=distinct + 1, work_dir=work,
                              progress=False)
    assert result.measured == 1 and result.tasks[0].trials == kept + 1
    assert result.tasks[0].default_us is not None  # the killed run's first record: the default schedule


@pytest.fixture(scope="module")
def rpc_tracker():
    """A TVM RPC tracker and one server (key ``lowprec-test``) on the loopback interface."""
    pytest.importorskip("tornado")
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    server = Server("127.0.0.1", port=9300, port_end=9400, key="lowprec-test",
                    tracker_addr=("127.0.0.1", tracker.port), silent=True)
    address = f"127.0.0.1:{tracker.port}"
    deadline = time.time() + 60
    while "lowprec-test" not in tvm.rpc.connect_tracker("127.0.0.1", tracker.port).summary()["queue_info"]:
        assert time.time() < deadline, "the RPC server did not register with the tracker"
        time.sleep(0.2)
    yield address
    server.terminate()
    tracker.terminate()


@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_tune_over_rpc_on_loopback(rpc_tracker, tmp_path, rng):
    model = _model()
    mod = tvm_lowprec.from_onnx(model)
    result = tvm_lowprec.tune(mod, "native", trials=2, work_dir=tmp_path / "db", rpc_tracker=rpc_tracker,
                              rpc_key="lowprec-test", progress=False)
    assert result.remote == f"lowprec-test@{rpc_tracker}"
    assert result.measured == 2 and result.tasks[0].failed == 0
    assert all(float(r.run_secs[0]) < 1.0 for r in result.database.get_all_tuning_records())
    compiled = tvm_lowprec.compile(mod, "native", database=result)
    x = _x(rng)
    np.testing.assert_array_equal(compiled(x)[0], _reference(model, x))


def test_rpc_errors_name_the_problem(rpc_tracker, tmp_path):
    mod = tvm_lowprec.from_onnx(_model())
    with pytest.raises(TuningError, match="no RPC server is registered under key 'other'.*lowprec-test"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path, rpc_tracker=rpc_tracker, rpc_key="other")
    with pytest.raises(TuningError, match="HOST:PORT"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path, rpc_tracker="localhost", rpc_key="k")
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(TuningError, match=f"cannot reach the RPC tracker at 127.0.0.1:{port}"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path, rpc_tracker=f"127.0.0.1:{port}", rpc_key="k")
    with pytest.raises(TuningError, match="both rpc_tracker"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path, rpc_key="k")


def test_a_target_this_host_cannot_run_needs_a_remote_machine(tmp_path):
    foreign = [s for s in registered_targets("cpu").values() if not runnable(s)]
    if not foreign:
        pytest.skip("this host runs every registered row")
    with pytest.raises(TuningError, match=f"{foreign[0].name} does not run on this host.*rpc_tracker"):
        tvm_lowprec.tune(tvm_lowprec.from_onnx(_model()), foreign[0].name, trials=1, work_dir=tmp_path)


@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_cli_tune_then_run_with_the_records(tmp_path, capsys):
    import onnx

    from tvm_lowprec.cli import main

    path = tmp_path / "model.onnx"
    onnx.save(_model(), path)
    assert main(["tune", str(path), "--trials", "1", "--threads", "1", "--work-dir", str(tmp_path / "db")]) == 0
    out = capsys.readouterr().out
    assert "| qgemm_u8_48x64x128" in out and "trials/s" in out and "--database" in out
    assert main(["run", str(path), "--database", str(tmp_path / "db"), "--repeat", "2"]) == 0
    assert "tuned" in capsys.readouterr().out
    assert main(["tune", str(path), "--rpc-tracker", "nohost", "--rpc-key", "k", "--work-dir", str(tmp_path)]) == 2


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


@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_tuned_batched_kernel_is_exact(tmp_path, rng):
    """Attention's batched kernel (run-time packed weights) tunes and stays exact."""
    from onnx.reference import ReferenceEvaluator

    model = _attention_scores()
    mod = tvm_lowprec.from_onnx(model)
    result = tvm_lowprec.tune(mod, "native", trials=2, work_dir=tmp_path / "db", progress=False, others=False)
    assert [t.failed for t in result.tasks] == [0] and result.measured == 2
    compiled = tvm_lowprec.compile(mod, "native", database=result)
    assert _schedules(compiled) == ["tuned"]
    a = rng.integers(0, 256, (12, 32, 64)).astype(np.uint8)
    b = rng.integers(0, 256, (12, 64, 32)).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a, b)[0], ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0])


def test_kernels_without_a_search_space_are_named(caplog, tmp_path):
    """A depthwise convolution has an integer kernel but no tensorized space: tune says so by name."""
    from models import qlinear_conv
    from tvm_lowprec.tune import untunable_kernels

    mod = tvm_lowprec.from_onnx(qlinear_conv((1, 8, 10, 10), 8, (3, 3), pads=(1, 1, 1, 1), group=8))
    spec = resolve_target("native")
    assert extract_tasks(mod, spec) == []
    assert [n for n in untunable_kernels(mod, spec) if n.startswith("qdepthwise")]
    with caplog.at_level("WARNING", logger="tvm_lowprec.tune"):
        tvm_lowprec.tune(mod, "native", trials=1, work_dir=tmp_path / "db", progress=False, others=False,
                         measure_model=False)
    assert "qdepthwise" in caplog.text and "no tensorized search space" in caplog.text
    # with others (tune's default) the depthwise kernel is a task of MetaSchedule's CPU space
    tasks = extract_tasks(mod, spec, others=True)
    assert [t.name for t in tasks if t.generic and t.name.startswith("qdepthwise")] and not untunable_kernels(
        mod, spec, others=True)


def _residual_add():
    """A residual add of two 8-bit tensors: one non-GEMM kernel (int32 fixed point on the codes)."""
    from test_integer_binary import qdq_binary

    return qdq_binary("Add", (1, 8, 8, 16), (1, 8, 8, 16))


@pytest.mark.skipif(not runnable(resolve_target("native")), reason="needs a host that runs the native row")
def test_non_gemm_kernels_are_tuned_from_the_rules_schedule_and_stay_exact(tmp_path, rng):
    model = _residual_add()
    mod = tvm_lowprec.from_onnx(model)
    result = tvm_lowprec.tune(mod, "native", trials=3, work_dir=tmp_path / "db", progress=False, cost_model="random",
                              num_threads=1)
    generic = [t for t in result.tasks if t.generic]
    assert generic and all(t.default_us is not None and t.failed == 0 and t.trials >= 2 for t in generic)
    assert all(t.gops is None for t in generic) and "| fused_" in result.table()
    assert result.model_ms is not None and all(ms_ > 0 for ms_ in result.model_ms) and "tuned (" in result.table()
    compiled = tvm_lowprec.compile(mod, "native", database=result, num_threads=1)
    a, b = (rng.integers(0, 256, (1, 8, 8, 16)).astype(np.uint8) for _ in range(2))
    np.testing.assert_array_equal(compiled(a, b)[0], tvm_lowprec.compile(mod, "native", database=False)(a, b)[0])


def test_a_non_gemm_record_replaces_the_rules_schedule_only_when_faster(tmp_path, rng):
    """Records made by hand: the rule's schedule (validated, 1 s) and the kernel unscheduled (validated,
    1 us): the lookup replays the faster; with the rule's schedule the faster, compile keeps "default"."""
    from tvm.s_tir import meta_schedule as ms
    from tvm_lowprec.tune.tuner import database_lookup
    from tvm_lowprec.tune.space import rule_schedule

    spec = resolve_target("native")
    mod = tvm_lowprec.from_onnx(_residual_add())
    (task,) = [t for t in extract_tasks(mod, spec, others=True) if t.generic]
    target = spec.tvm_target(2)
    func = _normalize_mod(task.func)["main"]
    # the kernel left as written; one instruction in its trace: TVM 0.27's get_top_k skips records
    # whose trace is empty (seen: a 1 us empty-trace record never returned)
    unscheduled = Schedule(func)
    unscheduled.get_child_blocks(unscheduled.get_sblock("root"))
    rule, plain = rule_schedule(func, spec, target).trace, unscheduled.trace
    assert str(rule) != str(plain)

    def database(rule_secs, plain_secs, where):
        db = open_database(tmp_path / where)
        workload = db.commit_workload(_normalize_mod(task.func))
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        for trace, secs in ((rule, rule_secs), (plain, plain_secs)):
            db.commit_tuning_record(ms.database.TuningRecord(trace, workload, secs, target, args_info))
        return db

    faster_plain = database([1.0, 1.0], [1e-6, 1e-6], "plain")
    chosen = database_lookup(faster_plain, spec)(task.func)
    assert chosen is not None and tvm_ffi.structural_equal(chosen.mod["main"].body, func.body)
    assert database_lookup(database([1e-6, 1e-6], [1.0, 1.0], "rule"), spec)(task.func) is None
    compiled = tvm_lowprec.compile(mod, "native", database=faster_plain)
    assert {k.name: k.schedule for k in compiled.kernels()}[task.name] == "tuned"
    if runnable(spec):
        a, b = (rng.integers(0, 256, (1, 8, 8, 16)).astype(np.uint8) for _ in range(2))
        np.testing.assert_array_equal(compiled(a, b)[0], tvm_lowprec.compile(mod, "native", database=False)(a, b)[0])


@pytest.mark.host_dependent
def test_a_gemm_reading_a_convolution_window_keeps_the_rules_row_tiles_in_the_search():
    """The search space of a GEMM read through a convolution window (kernels.qgemm.ConvWindow) keeps the
    rule's row tile, whose rows follow the output rows: its default point is the rule's schedule, the
    same TIR, both K-whole and K-blocked spaces build."""
    import tvm

    from tvm_lowprec.kernels.qgemm import ConvWindow, Epilogue, GemmLayout, QGemmProblem, build_qgemm
    from tvm_lowprec.schedule import schedule_func
    from tvm_lowprec.targets import resolve_target
    from tvm_lowprec.tune.space import default_schedule, qgemm_spaces

    window = ConvWindow(1, (18, 18), (16, 16), (3, 3), (1, 1), (1, 1), 8)
    problem = QGemmProblem(window.rows, 16, window.depth, "uint8", Epilogue(zero_point=3), window=window)

    def reads_window(spec):
        layout = GemmLayout.choose(problem, spec)
        return not (layout.rows != 1 or 8 % layout.kstep or layout.needs_prepare(problem))

    # this host's row where it reads the window in place (the VNNI rows), else the first x86 row that
    # does: code generation only, so any host builds it (an AVX2 host's row reads an im2col buffer)
    candidates = [resolve_target("native"), *(s for s in registered_targets("cpu").values() if s.name.startswith("x86"))]
    spec = next((s for s in candidates if reads_window(s)), None)
    if spec is None:
        pytest.skip("no x86 row reads this convolution's window in place")
    layout = GemmLayout.choose(problem, spec)
    func = build_qgemm(problem, layout, "qgemm")
    rule = schedule_func(func, spec).mod["main"]
    assert "lowprec.window" in rule.attrs
    tvm.ir.assert_structural_equal(default_schedule(func).mod["main"], rule)
    from tvm.s_tir import Schedule

    for space in qgemm_spaces(Schedule(func)):
        tvm.compile(space.mod, target=spec.tvm_target(1))
