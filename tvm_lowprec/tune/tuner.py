"""``tune``: MetaSchedule over a model's integer kernels, records in a JSON database that ``compile``
reads back.

The tasks are the model's quantized GEMM kernels as :func:`tvm_lowprec.compile` would build them
(same passes, same PrimFuncs), so a record's workload matches the kernel at compile time exactly.
The search space is :mod:`.space` (the default schedule with sampled tile sizes), the cost model
XGBoost, the search evolutionary. Records go to a MetaSchedule ``JSONDatabase`` in ``work_dir``; a
second call with the same ``work_dir`` counts each kernel's existing records and only runs the
trials still missing (an interrupted run resumes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from ..errors import LowPrecError
from ..targets import resolve_target
from .space import is_tunable, space_generator

log = logging.getLogger("tvm_lowprec.tune")


class TuningDatabaseError(LowPrecError, ValueError):
    """A tuning database that cannot be read (names the folder and the reason)."""


@dataclass(frozen=True)
class Task:
    name: str
    func: tvm.tirx.PrimFunc


def tuning_target(spec, num_threads: int | None = None):
    """The TVM target that ``compile`` builds for (records are tied to it)."""
    return spec.tvm_target(num_threads or 2)


def _kernels(mod, spec, requant_mode, fast_math):
    from ..pipeline import fused_module

    with tuning_target(spec):
        fused = fused_module(mod, spec, requant_mode, fast_math)
    return [(g.name_hint, f) for g, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def untunable_kernels(mod, spec, requant_mode: str = "float", fast_math: bool = True, kernels=None) -> list[str]:
    """Integer kernels of ``mod`` that no search space covers yet (batched GEMMs, depthwise and
    im2col kernels): they keep their default schedules. ``kernels``: already made by :func:`_kernels`."""
    kernels = kernels if kernels is not None else _kernels(mod, spec, requant_mode, fast_math)
    return sorted(name for name, f in kernels if f.attrs is not None and "lowprec.op" in f.attrs and not is_tunable(f))


def extract_tasks(mod, spec, requant_mode: str = "float", fast_math: bool = True, kernels=None) -> list[Task]:
    """The distinct tunable kernels of ``mod`` (structurally equal kernels are one task)."""
    tasks, seen = [], set()
    kernels = kernels if kernels is not None else _kernels(mod, spec, requant_mode, fast_math)
    for name, func in kernels:
        if is_tunable(func):
            key = tvm_ffi.structural_hash(func)
            if key not in seen:
                seen.add(key)
                tasks.append(Task(name, func))
    return sorted(tasks, key=lambda t: t.name)


def open_database(work_dir) -> ms.database.JSONDatabase:
    """The JSON database in ``work_dir`` (created when missing); :class:`TuningDatabaseError` when its
    files cannot be parsed."""
    path = Path(work_dir)
    path.mkdir(parents=True, exist_ok=True)
    try:
        return ms.database.JSONDatabase(work_dir=str(path))
    except Exception as err:  # noqa: BLE001 - TVM raises plain errors for unreadable files
        raise TuningDatabaseError(f"tuning database in {path} cannot be read: {str(err).splitlines()[0]}") from err


def records_of(database, func) -> int:
    mod = _normalize_mod(func)
    if not database.has_workload(mod):
        return 0
    return len(database.get_top_k(database.commit_workload(mod), 1 << 20))


def tune(mod, target="native", *, trials: int = 64, work_dir="tuning", num_threads: int | None = None,
         requant_mode: str = "float", fast_math: bool = True, builder_timeout: float = 120.0,
         progress: bool = True) -> ms.database.JSONDatabase:
    """Tune every integer kernel of ``mod`` for ``target``: ``trials`` measured candidates per kernel
    (those already in ``work_dir`` count). Returns the database; pass it (or ``work_dir``) to
    :func:`tvm_lowprec.compile` as ``database=``."""
    from tqdm.auto import tqdm

    spec = resolve_target(target)
    target_ = tuning_target(spec, num_threads)
    database = open_database(work_dir)
    kernels = _kernels(mod, spec, requant_mode, fast_math)  # the passes run once for both lists
    tasks = extract_tasks(mod, spec, kernels=kernels)
    skipped = untunable_kernels(mod, spec, kernels=kernels)
    if skipped:
        log.warning("no tensorized search space for %d kernel(s), kept on their default schedules: %s",
                    len(skipped), ", ".join(skipped))
    if not tasks:
        log.warning("no tunable integer kernel in the model (nothing tensorized to tune)")
        return database
    for task in tqdm(tasks, desc="tuning", disable=not progress):
        remaining = trials - records_of(database, task.func)
        if remaining <= 0:
            log.info("%s: %d records already, skipped", task.name, trials - remaining)
            continue
        ms.tune_tir(
            _normalize_mod(task.func), target_, str(Path(work_dir) / "logs" / task.name),
            max_trials_global=remaining, num_trials_per_iter=min(remaining, 8),
            builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=builder_timeout),
            runner=ms.runner.LocalRunner(timeout_sec=60), database=database, cost_model="xgb",
            space=space_generator(), strategy=_search(trials), num_tuning_cores=1,
        )
    return database


def _search(trials: int):
    """Evolutionary search with the XGBoost model, its population sized to the budget: the default
    512 candidates, scored over 4 generations, cost more than the measurements on a small run."""
    return ms.search_strategy.EvolutionarySearch(
        population_size=min(512, max(32, 16 * trials)), init_min_unmeasured=min(50, max(8, 2 * trials)),
    )


def database_lookup(database, spec, num_threads: int | None = None):
    """``tuned(func)`` for :func:`~tvm_lowprec.pipeline.schedule_module`: the database's best schedule
    of a tunable kernel, or None (then the default rules schedule it)."""
    if database is None:
        return None
    if not isinstance(database, ms.database.Database):
        database = open_database(database)
    target_ = tuning_target(spec, num_threads)

    def tuned(func):
        if not is_tunable(func):
            return None
        sch = database.query_schedule(_normalize_mod(func), target_, "main")
        if sch is None:
            return None
        return sch

    return tuned
