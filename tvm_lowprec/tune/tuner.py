"""``tune``: MetaSchedule over a model's integer kernels, records in a JSON database that ``compile``
reads back.

The tasks are the model's quantized GEMM kernels as :func:`tvm_lowprec.compile` would build them
(same passes, same PrimFuncs), so a record's workload matches the kernel at compile time exactly.
The search space is :mod:`.space` (the default schedule with sampled tile sizes), the cost model
XGBoost, the search evolutionary. Each kernel's first measurement is its default schedule, so the
best record is never slower than what ``compile`` does without one.

Records go to a MetaSchedule ``JSONDatabase`` in ``work_dir``; a second call with the same
``work_dir`` counts each kernel's records and runs only the trials still missing (an interrupted run
resumes). Candidates are measured on this host (``LocalRunner``) or on remote machines registered with
a TVM RPC tracker (``rpc_tracker="host:port", rpc_key=...``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import shutil
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from .. import _tvmscript
from ..errors import LowPrecError
from ..targets import host_supports, resolve_target
from .space import (default_schedule, generic_space_generator, is_generic_task, is_tunable, rule_schedule, schedule_key,
                    space_generator, space_size)

log = logging.getLogger("tvm_lowprec.tune")

FAILED = 1e9  # MetaSchedule records a failed build or run with run_secs of 1e10
VALIDATE_TOP = 4  # after the search, the 4 fastest schedules and the default are measured again,
VALIDATE_ROUNDS = 5  # 5 interleaved rounds; the medians of all measurements decide
MIN_TRIALS_TO_VALIDATE = 16
MIN_GAIN = 0.03  # a tuned schedule replaces the validated default only when its median is 3% faster


class TuningDatabaseError(LowPrecError, ValueError):
    """A tuning database that cannot be read (names the folder and the reason)."""


class TuningError(LowPrecError, RuntimeError):
    """Tuning cannot start: a target this host cannot run, an unreachable RPC tracker, an unknown key."""


@dataclass(frozen=True)
class Task:
    """One tuning task: a kernel, and the names of all the model's kernels that share its schedule
    key (:func:`~.space.schedule_key`); its record serves them all."""

    name: str
    func: tvm.tirx.PrimFunc
    kernels: tuple[str, ...] = ()
    generic: bool = False  # a non-GEMM kernel: MetaSchedule's CPU space, the rule's schedule first

    @property
    def shape(self) -> tuple[int, ...]:
        """A GEMM's M x N x K; another kernel's output shape."""
        if self.generic:
            return tuple(int(getattr(d, "value", d)) for d in self.func.params[-1].shape)
        return tuple(int(x) for x in self.func.attrs["lowprec.shape"])

    @property
    def batch(self) -> int:
        return int(self.func.attrs.get("lowprec.batch", 0))


@dataclass(frozen=True)
class TaskResult:
    """One kernel after tuning: its records in the database (this run's and earlier ones)."""

    name: str
    shape: tuple[int, int, int]
    intrinsic: str
    kernels: int  # kernels of the model this task's record serves
    trials: int  # records of this kernel, failed ones included
    failed: int  # records whose build or run failed
    default_us: float | None  # the default schedule's measured time (None: not measured)
    best_us: float | None  # the time of the schedule compile uses
    batch: int = 0  # GEMMs per call (batched kernels)
    generic: bool = False  # a non-GEMM kernel (shape: its output's; no GOPS)

    @property
    def speedup(self) -> float | None:
        return self.default_us / self.best_us if self.default_us and self.best_us else None

    @property
    def gops(self) -> float | None:
        if self.generic:
            return None
        m, n, k = self.shape
        return 2 * max(1, self.batch) * m * n * k / self.best_us / 1e3 if self.best_us else None


@dataclass(frozen=True)
class TuningResult:
    """What :func:`tune` did: the database (pass it, or ``work_dir``, to ``compile(database=...)``),
    one row per kernel, the wall time and the candidates measured in this run."""

    database: ms.database.JSONDatabase
    work_dir: Path
    target: str
    tasks: tuple[TaskResult, ...]
    untuned: tuple[str, ...]
    seconds: float
    measured: int
    remote: str | None = None
    model_ms: tuple[float, float] | None = None  # the model by TVM's time evaluator: default schedules, tuned

    @property
    def trials_per_second(self) -> float:
        return self.measured / self.seconds if self.seconds > 0 else 0.0

    def table(self) -> str:
        """Markdown: per kernel, records, failures, default and tuned time, speed-up, GOPS."""
        head = ("| kernel | [batch x] M x N x K (GEMM) or output | kernels | trials | failed | default µs | tuned µs "
                "| speed-up | GOPS |\n"
                "|---|---|---|---|---|---|---|---|---|")
        rows = [head]
        for t in self.tasks:
            fmt = lambda v, f: "—" if v is None else format(v, f)  # noqa: E731
            shape = "x".join(map(str, ((t.batch,) if t.batch else ()) + tuple(t.shape)))
            rows.append(f"| {t.name} | {shape} | {t.kernels} | {t.trials} | {t.failed} | {fmt(t.default_us, '.1f')} "
                        f"| {fmt(t.best_us, '.1f')} | {fmt(t.speedup, '.2f')} | {fmt(t.gops, '.1f')} |")
        where = f"on {self.remote}" if self.remote else "on this host"
        rows.append(f"\n{self.measured} candidates measured {where} in {self.seconds:.0f} s "
                    f"({self.trials_per_second:.3f} trials/s); target {self.target}.")
        if self.untuned:
            rows.append(f"Not tuned (no tensorized search space; default schedules): {', '.join(self.untuned)}.")
        if self.model_ms:
            before, after = self.model_ms
            rows.append(f"Model, one call by TVM's time evaluator, interleaved: {before:.4g} ms with the default "
                        f"schedules, {after:.4g} ms tuned ({before / after:.2f}x).")
        return "\n".join(rows)


def tuning_target(spec, num_threads: int | None = None):
    """The TVM target that ``compile`` builds for (records are tied to it)."""
    return spec.tvm_target(num_threads or 2)


def _kernels(mod, spec, requant_mode, fast_math):
    from ..pipeline import fused_module
    from ..schedule.lookup_epilogue import gemm_part

    with tuning_target(spec):
        fused = fused_module(mod, spec, requant_mode, fast_math)
    # a GEMM with a lookup after it is tuned as the GEMM it was (the schedule puts the lookup back)
    return [(g.name_hint, gemm_part(f)) for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def untunable_kernels(mod, spec, requant_mode: str = "float", fast_math: bool = True, kernels=None,
                      others: bool = False) -> list[str]:
    """Integer kernels of ``mod`` that no search space covers (run-time weight packing, im2col,
    depthwise) unless ``others`` gives them the generic one: they keep their default schedules.
    ``kernels``: already made by :func:`_kernels`."""
    kernels = kernels if kernels is not None else _kernels(mod, spec, requant_mode, fast_math)
    return sorted(name for name, f in kernels if f.attrs is not None and "lowprec.op" in f.attrs and not is_tunable(f)
                  and not (others and is_generic_task(f)))


def extract_tasks(mod, spec, requant_mode: str = "float", fast_math: bool = True, kernels=None,
                  others: bool = False) -> list[Task]:
    """The tunable kernels of ``mod``, one task per schedule key (kernels that differ only in their
    constants are one task, represented by the first of them by name); with ``others``, also every
    other kernel (:func:`~.space.is_generic_task`), one task per structurally equal kernel."""
    groups: dict[str, list] = {}
    kernels = kernels if kernels is not None else _kernels(mod, spec, requant_mode, fast_math)
    for name, func in sorted(kernels, key=lambda item: item[0]):
        if is_tunable(func):
            groups.setdefault(schedule_key(func), []).append((name, func))
        elif others and is_generic_task(func):
            groups.setdefault(f"generic:{tvm_ffi.structural_hash(_normalize_mod(func))}", []).append((name, func))
    tasks = [Task(members[0][0], members[0][1], tuple(n for n, _ in members), key.startswith("generic:"))
             for key, members in groups.items()]
    return sorted(tasks, key=lambda t: (t.generic, t.name))


def open_database(work_dir) -> ms.database.JSONDatabase:
    """The JSON database in ``work_dir`` (created when missing); :class:`TuningDatabaseError` when its
    files cannot be parsed."""
    path = Path(work_dir)
    path.mkdir(parents=True, exist_ok=True)
    try:
        return ms.database.JSONDatabase(work_dir=str(path))
    except Exception as err:  # noqa: BLE001 - TVM raises plain errors for unreadable files
        raise TuningDatabaseError(f"tuning database in {path} cannot be read: {str(err).splitlines()[0]}") from err


def _records(database, func) -> list:
    mod = _normalize_mod(func)
    if not database.has_workload(mod):
        return []
    return list(database.get_top_k(database.commit_workload(mod), 1 << 20))


def records_of(database, func) -> int:
    return len(_records(database, func))


def rpc_runner(tracker: str, key: str, timeout_sec: float = 60.0):
    """MetaSchedule's RPC runner for the servers registered under ``key`` with the tracker at
    ``tracker`` (``"host:port"``); :class:`TuningError` when the tracker cannot be reached or has no
    server under that key."""
    host, _, port = str(tracker).rpartition(":")
    if not host or not port.isdigit():
        raise TuningError(f"rpc tracker must be given as HOST:PORT, not {tracker!r}")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()  # TVM's own connect retries for 60 s
        summary = tvm.rpc.connect_tracker(host, int(port)).summary()
    except Exception as err:  # noqa: BLE001 - socket and RPC errors alike
        raise TuningError(f"cannot reach the RPC tracker at {tracker}: {str(err).splitlines()[0]}") from err
    keys = sorted(summary.get("queue_info", {}))
    if key not in keys:
        raise TuningError(f"no RPC server is registered under key {key!r} with the tracker at {tracker} "
                          f"(keys there: {', '.join(keys) or 'none'})")
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key,
                                 session_timeout_sec=int(timeout_sec))
    return ms.runner.RPCRunner(config, _evaluator())


def _evaluator():
    return ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100, enable_cpu_cache_flush=False)


def _builder(timeout_sec: float, spec=None):
    """One build worker (the VM has two cores; the runner needs them quiet). The worker imports TVM's
    tensor intrinsics the cheap way (:mod:`tvm_lowprec._tvmscript`): MetaSchedule restarts the build
    pool for every batch and would otherwise spend about 60 s per batch importing them. For an
    AArch64 row the worker links each candidate with the cross compiler, so the board only loads it."""
    import cloudpickle

    from .. import qemu

    cloudpickle.register_pickle_by_value(sys.modules[_tvmscript.__name__])  # the worker needs no tvm_lowprec
    export = None
    if spec is not None and qemu.is_aarch64(spec):
        export = functools.partial(_tvmscript.export_shared_library, qemu.CROSS_CC)
    return ms.builder.LocalBuilder(max_workers=1, timeout_sec=timeout_sec, f_export=export,
                                   initializer=_tvmscript.import_tensor_intrinsics)


def _measure(schedules, func, target, builder, runner, rounds: int = 1) -> list[list[float]]:
    """Build ``schedules`` once and run each ``rounds`` times, interleaved (every round runs each
    once): the times measured per schedule, empty where it failed to build or run."""
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for sch in schedules])
    for b in built:
        if b.error_msg:
            log.warning("%s: a schedule failed to build: %s", func.attrs.get("global_symbol", "?"),
                        b.error_msg.splitlines()[-1])
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    ok = [i for i, b in enumerate(built) if not b.error_msg]
    times: list[list[float]] = [[] for _ in schedules]
    for _ in range(rounds):
        futures = runner.run([ms.runner.RunnerInput(built[i].artifact_path, "cpu", args_info) for i in ok])
        for i, future in zip(ok, futures):
            result = future.result()
            if result.error_msg is None:
                times[i] += [float(x) for x in result.run_secs]
    for b in built:
        if b.artifact_path:
            shutil.rmtree(Path(b.artifact_path).parent, ignore_errors=True)
    return times


def _commit(database, func, trace, run_secs, target) -> None:
    workload = database.commit_workload(_normalize_mod(func))
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, run_secs, target, args_info))


def _default(func, target):
    """The schedule ``compile`` gives ``func`` without records for ``target``: a GEMM's default point
    of its space (None where the rule's tile does not fit), another kernel's rule schedule."""
    func = _normalize_mod(func)["main"]
    if is_tunable(func):
        return default_schedule(func)
    return rule_schedule(func, resolve_target(target), target)


def _measure_default(task, target, database, builder, runner) -> None:
    """Build and run the default schedule and commit it as the kernel's first record (a failure as
    MetaSchedule records one: 1e10 s)."""
    sch = _default(task.func, target)
    if sch is not None:
        (times,) = _measure([sch], task.func, target, builder, runner)
        _commit(database, task.func, sch.trace, times or [1e10], target)


def _seconds(record) -> float:
    """A record's mean measured time (1e10 for a failed candidate)."""
    return sum(float(s) for s in record.run_secs) / len(record.run_secs)


def _by_trace(records) -> dict:
    """Distinct schedules among ``records``: trace text -> (a record of it, every time measured for it);
    failed measurements left out. A schedule's time is the median of all its measurements: the search
    measures each candidate once, validation again several times, and one lucky measurement must not
    make a candidate the best (on a noisy machine the best of 64 single measurements mostly is)."""
    groups: dict[str, tuple] = {}
    for record in records:
        if _seconds(record) >= FAILED:
            continue
        key = str(record.trace)
        first, times = groups.get(key, (record, []))
        groups[key] = (first, times + [float(s) for s in record.run_secs])
    return groups


def _ranked(records) -> list[tuple]:
    """(record, median seconds), one per distinct schedule, fastest first; once some schedules have
    been validated (measured more than once), those come first: a schedule measured once is ranked by
    a single, likely lucky, measurement (seen here: one measured 3.5 ms once, 4.1 ms in isolation,
    against the validated default's 3.6 and 3.0 ms)."""
    groups = _by_trace(records).values()
    validated = any(len(times) > 1 for _, times in groups)
    return sorted(((rec, statistics.median(times), len(times) > 1) for rec, times in groups),
                  key=lambda item: (validated and not item[2], item[1]))


def _default_trace(func, target) -> str | None:
    """The default schedule's trace text (how its records are recognised), or None."""
    sch = _default(func, target)
    return str(sch.trace) if sch is not None else None


def _best(records, func, ranked=None, default=None):
    """(record, median seconds) of the schedule ``compile`` should use, or None: the first of
    :func:`_ranked`, except that the validated default schedule stays unless the winner's median is at
    least :data:`MIN_GAIN` faster (differences smaller than that are this machine's noise, and swapping
    on them made kernels slower as often as faster). ``ranked``, ``default``: already computed."""
    ranked = ranked if ranked is not None else _ranked(records)
    if not ranked:
        return None
    default = default if default is not None else _default_trace(func, ranked[0][0].target)
    for record, seconds, validated in ranked:
        if validated and str(record.trace) == default and ranked[0][1] > seconds * (1 - MIN_GAIN):
            return record, seconds
    return ranked[0][:2]


def _replay(trace, func) -> Schedule:
    """``trace`` applied to a private copy of ``func``: on TVM 0.27 ``Trace.apply_to_schedule``
    rewrites the loops of the function it was given in place (seen: a kernel's M loop of 48 read 2
    after a replay), which would corrupt the model's kernel and every later lookup of it."""
    sch = Schedule(tvm.ir.load_json(tvm.ir.save_json(_normalize_mod(func))))
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _replay_or_none(record, func) -> Schedule | None:
    """``record``'s schedule replayed on ``func``, or None (with a warning) where it does not apply:
    then the default rules schedule the kernel."""
    try:
        return _replay(record.trace, func)
    except Exception as err:  # noqa: BLE001 - a record that does not fit: the default rules
        log.warning("tuning record for %s does not apply (%s); default schedule", func.attrs.get("global_symbol", "?"),
                    str(err).splitlines()[-1])
        return None


def _validate(task, target, database, builder, runner, top: int, rounds: int) -> None:
    """Measure the ``top`` fastest schedules so far and the default one again, ``rounds`` times,
    interleaved, and record the times: the medians then decide."""
    ranked = [rec for rec, *_ in _ranked(_records(database, task.func))]
    default = _default_trace(task.func, target)
    chosen = ranked[:top] + [rec for rec in ranked[top:] if str(rec.trace) == default]
    if len(chosen) < 2:
        return
    schedules = [_replay(record.trace, task.func) for record in chosen]
    for record, secs in zip(chosen, _measure(schedules, task.func, target, builder, runner, rounds)):
        if secs:
            _commit(database, task.func, record.trace, secs, target)


def _summary(database, task, target) -> TaskResult:
    records = _records(database, task.func)
    failed = sum(_seconds(r) >= FAILED for r in records)
    func = _normalize_mod(task.func)["main"]
    ranked, default = _ranked(records), _default_trace(func, target)
    best = _best(records, func, ranked, default)
    default_s = [t for rec, t, _ in ranked if str(rec.trace) == default]
    intrinsic = str(task.func.attrs.get("lowprec.intrin", "none")) if task.func.attrs is not None else "none"
    return TaskResult(task.name, task.shape, intrinsic, max(1, len(task.kernels)), len(records), failed,
                      default_s[0] * 1e6 if default_s else None, best[1] * 1e6 if best else None, task.batch,
                      task.generic)


COST_MODELS = ("xgb", "random")


def tune(mod, target="native", *, trials: int = 64, work_dir="tuning", num_threads: int | None = None,
         requant_mode: str = "float", fast_math: bool = True, rpc_tracker: str | None = None,
         rpc_key: str | None = None, builder_timeout: float = 120.0, progress: bool = True,
         cost_model: str = "xgb", others: bool = True, measure_model: bool = True,
         top: int | None = None) -> TuningResult:
    """Tune every integer kernel of ``mod`` for ``target``: ``trials`` measured candidates per kernel,
    the default schedule first (records already in ``work_dir`` count).

    ``num_threads``: candidates are measured with that many threads (default: all of this host's
    cores); records apply at any thread count, so tune at the one you deploy with.
    ``rpc_tracker="host:port"`` and ``rpc_key``: measure on the machines registered with that TVM RPC
    tracker (``python -m tvm.exec.rpc_tracker``, ``python -m tvm.exec.rpc_server --tracker ... --key
    ...``) instead of this host. Returns a :class:`TuningResult`; pass it (or ``work_dir``) to
    :func:`tvm_lowprec.compile` as ``database=``. ``cost_model``: ``"xgb"`` (MetaSchedule's XGBoost
    model, the default) or ``"random"`` (no model: candidates drawn at random from the evolutionary
    search's population; for hosts without xgboost). ``others``: also tune every non-GEMM kernel
    (element-wise chains, layout changes, pools, row operators, lookups, depthwise convolutions) in
    MetaSchedule's CPU space, each measured first with the schedule our rule gives it
    (:mod:`~.space`). ``measure_model``: after tuning, time the whole model with the default
    schedules and with the records, interleaved, on this host (not with ``rpc_tracker``):
    :attr:`TuningResult.model_ms`. ``top``: tune only the kernels among the model's ``top`` slowest
    (each timed alone on this host, ``Compiled.profile(isolated=True)``, default schedules): where
    the time is."""
    from tqdm.auto import tqdm

    from ..frontend.relax_module import prepare_module

    if trials < 1:
        raise ValueError(f"trials must be at least 1, not {trials}")
    mod = prepare_module(mod)  # a TVM frontend's weights kept as inputs: bound as constants
    if cost_model not in COST_MODELS:
        raise ValueError(f"cost_model must be one of {', '.join(COST_MODELS)}, not {cost_model!r}")
    if (rpc_tracker is None) != (rpc_key is None):
        raise TuningError("remote tuning needs both rpc_tracker ('host:port') and rpc_key")
    spec = resolve_target(target)
    if rpc_tracker is None and not host_supports(spec):
        raise TuningError(f"target {spec.name} does not run on this host (it needs {', '.join(spec.features)}): "
                          "measure on a machine that does, with rpc_tracker='host:port' and rpc_key=...")
    start = time.perf_counter()
    target_ = tuning_target(spec, num_threads)
    database = open_database(work_dir)
    kernels = _kernels(mod, spec, requant_mode, fast_math)  # the passes run once for both lists
    tasks = extract_tasks(mod, spec, kernels=kernels, others=others)
    skipped = tuple(untunable_kernels(mod, spec, kernels=kernels, others=others))
    default_build = functools.cache(lambda: _compile(mod, spec, num_threads, False))  # top= and measure_model
    if top is not None:
        if rpc_tracker is not None:
            raise TuningError("top= ranks the kernels by timing them on this host; tune remotely without it")
        tasks = _slowest(tasks, default_build(), top)
    if skipped:
        log.warning("no tensorized search space for %d kernel(s), kept on their default schedules: %s",
                    len(skipped), ", ".join(skipped))
    if not tasks:
        log.warning("no tunable integer kernel in the model (nothing tensorized to tune)")
    runner = rpc_runner(rpc_tracker, rpc_key) if rpc_tracker else None
    before = sum(records_of(database, t.func) for t in tasks)
    todo = [t for t in tasks if any(_work_left(database, t, trials))]
    if todo and cost_model == "xgb" and importlib.util.find_spec("xgboost") is None:
        raise TuningError("cost_model='xgb' needs the xgboost package (pip install xgboost); "
                          "cost_model='random' tunes without it")
    if todo:  # the worker pools start only when something is left to measure
        runner = runner or ms.runner.LocalRunner(
            timeout_sec=60, evaluator_config=_evaluator(),
            initializer=functools.partial(_tvmscript.use_threads, num_threads) if num_threads else None)
        builder = _builder(builder_timeout, spec)
        _tvmscript.import_tensor_intrinsics()  # TuneContext imports them; cheaply here
    for task in tqdm(todo, desc="tuning", disable=not progress or not todo):
        if records_of(database, task.func) == 0:
            _measure_default(task, target_, database, builder, runner)
        search, _ = _work_left(database, task, trials)
        if search > 0:
            with _metaschedule_logging():
                ms.tune_tir(
                    _normalize_mod(task.func), target_, str(Path(work_dir) / "logs" / task.name),
                    max_trials_global=search, num_trials_per_iter=min(search, 16),
                    builder=builder, runner=runner, database=database, cost_model=cost_model,
                    space=generic_space_generator() if task.generic else space_generator(),
                    strategy=_search(trials), num_tuning_cores=1,
                )
        if _work_left(database, task, trials)[1]:
            _validate(task, target_, database, builder, runner, VALIDATE_TOP, VALIDATE_ROUNDS)
    measured = sum(records_of(database, t.func) for t in tasks) - before
    model_ms = None
    if measure_model and not rpc_tracker and tasks:
        model_ms = _model_before_after(default_build(), _compile(mod, spec, num_threads, database))
    return TuningResult(database, Path(work_dir), spec.name, tuple(_summary(database, t, target_) for t in tasks), skipped,
                        time.perf_counter() - start, measured, remote=f"{rpc_key}@{rpc_tracker}" if rpc_tracker else None,
                        model_ms=model_ms)


def _compile(mod, spec, num_threads, database):
    import tvm_lowprec

    return tvm_lowprec.compile(mod, spec, num_threads=num_threads, database=database)


def _slowest(tasks, compiled, top: int) -> list:
    """The tasks serving at least one of the model's ``top`` slowest kernels (``compiled``: the model
    on its default schedules), slowest first."""
    from ..compiled import random_inputs

    rank = {r["name"]: i for i, r in enumerate(compiled.profile(random_inputs(compiled), repeat=2, isolated=True))}
    chosen = [t for t in tasks if any(rank.get(k, top) < top for k in t.kernels or (t.name,))]
    return sorted(chosen, key=lambda t: min(rank.get(k, top) for k in t.kernels or (t.name,)))


def _model_before_after(default, tuned) -> tuple[float, float] | None:
    """(default, tuned) ms of one call of the whole model (two builds of it), TVM's time evaluator,
    interleaved rounds; None where the model has a dynamic input."""
    from ..bench.timing import Timing, compiled_loop, measure_interleaved
    from ..compiled import random_inputs
    from ..errors import InputError

    try:
        inputs = random_inputs(default)
    except InputError:
        return None
    loops = {"default": compiled_loop(default, inputs), "tuned": compiled_loop(tuned, inputs)}
    times = measure_interleaved(loops, Timing(min_time=0.05, repeat=5, budget=None))
    return times["default"].seconds * 1e3, times["tuned"].seconds * 1e3


def _work_left(database, task, trials: int) -> tuple[int, bool]:
    """(candidates the search still has to measure, whether validation is still to run) for a budget of
    ``trials`` measurements: the search stops at the size of the space, validation (budgets of
    :data:`MIN_TRIALS_TO_VALIDATE` or more) runs once, after it (a schedule measured twice marks it)."""
    records = _records(database, task.func)
    distinct = len({str(r.trace) for r in records})
    validation = VALIDATE_TOP + 1 if trials >= MIN_TRIALS_TO_VALIDATE else 0
    size = trials if task.generic else space_size(_normalize_mod(task.func)["main"])
    search = min(trials - validation, size) - distinct
    return max(0, search), bool(validation) and len(records) == distinct


@contextlib.contextmanager
def _metaschedule_logging():
    """Around one ``tune_tir``: MetaSchedule's own tables go to ``work_dir/logs``, not the console,
    unless the user set its logger's level (its log setup raises that logger to DEBUG, so the choice
    is remembered); and handlers without a name are detached meanwhile. TVM's log setup re-lists
    every handler of its logger by name in a ``logging.config.dictConfig`` and fails on one without
    (``'NoneType' object has no attribute 'format'``): pytest's log capture attaches two."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    if logger.level == logging.NOTSET or getattr(logger, "_lowprec_quiet", False):
        logger.setLevel(logging.WARNING)
        logger._lowprec_quiet = True
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for handler in unnamed:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in unnamed:
            logger.addHandler(handler)


def _search(trials: int):
    """Evolutionary search with the XGBoost model, its population sized to the budget: the default
    512 candidates, scored over 4 generations, cost more than the measurements on a small run."""
    return ms.search_strategy.EvolutionarySearch(
        population_size=min(512, max(32, 16 * trials)), init_min_unmeasured=min(50, max(8, 2 * trials)),
    )


def _as_database(database):
    if isinstance(database, TuningResult):
        return database.database
    if isinstance(database, ms.database.Database):
        return database
    return open_database(database)


SCHEDULE_DIRS = (Path(__file__).resolve().parents[1] / "schedules",   # installed: package data
                 Path(__file__).resolve().parents[2] / "schedules")   # a source checkout: schedules/


def shipped_database(spec):
    """The tuning records shipped for ``spec``'s row (``schedules/<row>/``), or None."""
    for root in SCHEDULE_DIRS:
        if (root / spec.row / "database_tuning_record.json").is_file():
            return _shipped(str(root / spec.row))
    return None


@functools.lru_cache(maxsize=None)
def _shipped(path: str):
    return open_database(path)


def _best_records(database, key) -> dict:
    """``key(record)`` -> the best record (:func:`_best`) among those with that key."""
    groups: dict = {}
    for record in database.get_all_tuning_records():
        groups.setdefault(key(record), []).append(record)
    best = {k: _best(records, records[0].workload.mod["main"]) for k, records in groups.items()}
    return {k: b[0] for k, b in best.items() if b}


def export_best(database, dest) -> int:
    """Write the best successful record of every workload of ``database`` (a work dir, a
    :class:`TuningResult` or a Database) to a new JSON database in ``dest``: the compact form shipped
    in ``schedules/<row>/``. Returns the number of records written."""
    best = _best_records(_as_database(database), lambda record: tvm_ffi.structural_hash(record.workload.mod))
    dest = Path(dest)
    for name in ("database_workload.json", "database_tuning_record.json"):
        (dest / name).unlink(missing_ok=True)
    out = open_database(dest)
    for record in best.values():
        out.commit_tuning_record(ms.database.TuningRecord(
            record.trace, out.commit_workload(record.workload.mod), [float(s) for s in record.run_secs],
            record.target, record.args_info))
    return len(best)


def database_lookup(database, spec, num_threads: int | None = None):
    """``tuned(func)`` for :func:`~tvm_lowprec.pipeline.schedule_module`: the database's best schedule
    of a tunable kernel, or None (then the default rules schedule it)."""
    if database is None:
        return None
    database = _as_database(database)

    @functools.cache
    def by_key() -> dict:
        """Schedule key -> best record, for kernels without records of their own."""
        return _best_records(database, lambda record: schedule_key(record.workload.mod["main"]))

    target = tuning_target(spec, num_threads)

    def tuned(func):
        if not is_tunable(func):
            return _tuned_other(func) if is_generic_task(func) else None
        mod = _normalize_mod(func)
        best = _best(_records(database, func), mod["main"])
        # no record of its own: a kernel differing only in its constants
        record = best[0] if best else by_key().get(schedule_key(func))
        return _replay_or_none(record, func) if record is not None else None

    def _tuned_other(func):
        """A non-GEMM kernel's best record, or None where it has none or the rule's schedule is best."""
        records = _records(database, func)
        if not records:
            return None
        default = _default_trace(func, target)
        best = _best(records, _normalize_mod(func)["main"], default=default)
        if best is None or str(best[0].trace) == default:
            return None
        return _replay_or_none(best[0], func)

    return tuned
