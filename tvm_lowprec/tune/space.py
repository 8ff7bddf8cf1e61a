"""The MetaSchedule design space of a quantized GEMM kernel: the default schedule's structure with its
tile sizes left to the search.

The PrimFunc (:func:`~tvm_lowprec.kernels.build_qgemm`) fixes the weight packing (``nr`` vectors of
``lanes`` columns per panel) and the intrinsic; what the schedule may still choose, and the search
samples, is:

- the row tile ``mr``: a factor of the padded M, at most :data:`MAX_ROWS` (the largest row tile of the
  target's tile tables, plus headroom: register spills are measured, not guessed);
- for a narrow GEMM with K whole (:func:`~tvm_lowprec.schedule.qgemm.is_narrow`: its threads share
  runs of row tiles, not B panels), the number of runs, sampled with the row tile as one perfect tile
  ``[runs, tiles per run, mr]`` of the padded M;
- the K loop: all of K inside a row tile (the epilogue fused per row tile), or K blocks that keep a
  B panel slice in L1 while every row tile passes over it (the epilogue fused per panel); the two are
  two design spaces, since a trace cannot branch, and the block size is sampled.

The default schedule (:class:`~tvm_lowprec.schedule.qgemm.QGemmRule`) is one point of this space:
:func:`default_trace` gives it, and the tuner measures it first, so a tuned kernel is never slower
than the default one.

Every candidate tensorizes its inner loop with the target's intrinsic in the schedule itself (no
post-processor rewrites it, none adds loops around it), so every candidate builds: the failures
MetaSchedule's generic rules produce on TVM 0.27 (a vectorized loop around the tensorized block:
"Cannot broadcast lanes=16 to 64") cannot occur.
"""

from __future__ import annotations


from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from ..schedule.qgemm import QGemmRule, gemm_rows, is_narrow, row_loop, row_runs, tile_gemm, window_tiles_apply

MAX_ROWS = 8  # row-tile bound for the search (the tile tables go up to 6)
MAX_K_SLICES = 512  # kstep slices per K block


def is_tunable(func) -> bool:
    """A kernel the search space covers: tvm-lowprec's quantized GEMM, batched (attention's run-time
    packed operands) or not."""
    attrs = func.attrs
    return attrs is not None and attrs.get("lowprec.op", None) == "qgemm"


_KEY_ATTRS = ("lowprec.shape", "lowprec.tile", "lowprec.vector", "lowprec.intrin", "lowprec.b_storage",
              "lowprec.a_dtype", "lowprec.epilogue", "lowprec.batch", "lowprec.window")  # lowprec.rows: implied by the intrinsic


def schedule_key(func) -> str:
    """What a schedule of this kernel depends on: shape, tile, intrinsic, storage dtypes, epilogue
    kind and the blocks present. Kernels that differ only in their constants (zero points, clamp
    bounds) share the key, so one tuning task and one record serve them all."""
    attrs = func.attrs
    parts = [f"{name}={attrs[name]}" for name in _KEY_ATTRS if name in attrs]
    sch = Schedule(func)
    parts.append("blocks=" + ",".join(sorted(sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root")))))
    return ";".join(parts)


def qgemm_space(sch, k_blocked: bool = True, decisions=None) -> None:
    """Schedule ``sch`` (a qgemm PrimFunc as ``main``) as the default rule does
    (:func:`~tvm_lowprec.schedule.qgemm.tile_gemm`), the row tile sampled and, with ``k_blocked``,
    the K blocks too. ``decisions``: the samples' values (``[[m / mr, mr], [blocks, slices]]``, the
    first ``[runs, m / mr / runs, mr]`` for a narrow GEMM with K whole) instead of random draws."""
    func = sch.mod["main"]
    _, nr, _ = (int(x) for x in func.attrs["lowprec.tile"])
    intrin = str(func.attrs["lowprec.intrin"])
    lanes, kstep = (int(x) for x in func.attrs["lowprec.vector"])
    batched = int(func.attrs.get("lowprec.batch", 0)) > 0
    rows = gemm_rows(func)
    decisions = list(decisions or [None, None])
    QGemmRule._prepare_inputs(sch)
    narrow = not k_blocked and is_narrow(func)
    rule_mr = int(func.attrs["lowprec.tile"][0])
    if rows == 1 and window_tiles_apply(func, rule_mr):
        # the rule's row tile, whose rows follow the output rows (schedule.qgemm._window_tiles): a
        # sampled tile would take the plain split, slower for every tile (its rows' addresses divided)
        mr, runs = rule_mr, None
    else:
        tiles = sch.sample_perfect_tile(row_loop(sch, rows), n=3 if narrow else 2, max_innermost_factor=MAX_ROWS // rows,
                                        decision=decisions[0])
        mr, runs = tiles[-1], (tiles[:2] if narrow else None)

    def k_blocks(sch, slices):
        return sch.sample_perfect_tile(slices, n=2, max_innermost_factor=MAX_K_SLICES, decision=decisions[1])

    tile_gemm(sch, mr, nr, k_blocks if k_blocked else None, intrin, lanes, kstep, batched, rows, runs)


def _gemm_extents(func) -> tuple[int, int]:
    """(padded rows, or row groups for a matrix instruction; K slices of ``kstep``) of a qgemm PrimFunc."""
    _, kstep = (int(x) for x in func.attrs["lowprec.vector"])
    probe = Schedule(func)
    rows = int(probe.get(row_loop(probe, gemm_rows(func))).extent)
    k = int(probe.get(probe.get_loops(probe.get_sblock("gemm"))[-1]).extent)
    return rows, k // kstep


def space_size(func) -> int:
    """Distinct schedules in both design spaces: row tiles x (K whole + each K blocking), K whole counted
    once per number of runs of row tiles for a narrow GEMM. Small (tens
    to a few hundred): the tuner stops there instead of asking the search for candidates that are
    not left."""
    rows, slices = _gemm_extents(func)
    tiles = [d for d in range(1, MAX_ROWS // gemm_rows(func) + 1) if rows % d == 0]
    k_blocks = sum(slices % d == 0 for d in range(1, min(slices, MAX_K_SLICES) + 1))
    # K whole: each row tile, times each number of runs of tiles for a narrow GEMM
    whole = sum(_divisors(rows // mr) for mr in tiles) if is_narrow(func) else len(tiles)
    return whole + len(tiles) * k_blocks


def _divisors(n: int) -> int:
    return sum(n % d == 0 for d in range(1, n + 1))


def qgemm_spaces(sch) -> list:
    """Both design spaces: K whole inside the row tile, and K blocked."""
    blocked = sch.copy()
    qgemm_space(sch, k_blocked=False)
    qgemm_space(blocked, k_blocked=True)
    return [sch, blocked]


def default_schedule(func):
    """The default schedule as a point of the space (its trace carries the rule's row tile and K block
    as the samples' decisions), or None where the rule's tile does not divide the loop."""
    mr, _, kblock = (int(x) for x in func.attrs["lowprec.tile"])
    mr //= gemm_rows(func)  # row groups for a matrix instruction
    _, kstep = (int(x) for x in func.attrs["lowprec.vector"])
    rows, slices = _gemm_extents(func)
    if rows % mr or (kblock and slices % (kblock // kstep)):
        return None
    first = [*row_runs(rows // mr), mr] if not kblock and is_narrow(func) else [rows // mr, mr]
    decisions = [first, [slices // (kblock // kstep), kblock // kstep] if kblock else None]
    sch = Schedule(func)
    qgemm_space(sch, k_blocked=kblock > 0, decisions=decisions)
    return sch


def space_generator():
    """The ScheduleFn space: our function only; no generic rules or post-processors; the tile-size
    mutator for the evolutionary search."""
    return ms.space_generator.ScheduleFn(
        qgemm_spaces, sch_rules=[], postprocs=[], mutator_probs={ms.mutator.MutateTileSize(): 1.0}
    )


# -- every other kernel: MetaSchedule's CPU space, our rule's schedule as the first point ---------------
#
# An element-wise chain, a layout change, a pool, a row operator, a lookup, a depthwise convolution:
# what our rules choose (vector width, parallel grain, fusion of the producers) is fixed in their code,
# so the search runs MetaSchedule's own space for the target (multi-level tiling, inlining,
# parallelize-vectorize-unroll), and the rule's schedule (or, where no rule accepts the kernel, the
# kernel as written) is measured first: a record replaces it only when it is faster
# (:data:`~tvm_lowprec.tune.tuner.MIN_GAIN`).


def is_generic_task(func) -> bool:
    """A kernel the generic space covers: any PrimFunc with fixed shapes that is not a view (a reshape
    TVM lowers without a copy), not a qgemm (:func:`is_tunable`) and not already scheduled."""
    from tvm import relax

    if is_tunable(func) or (func.attrs is not None and func.attrs.get("tir.is_scheduled", False)):
        return False
    if relax.analysis.has_reshape_pattern(func):
        return False
    return all(isinstance(getattr(d, "value", d), int) for p in func.params for d in getattr(p, "shape", ()))


def rule_schedule(func, spec, target):
    """The schedule ``compile`` gives a non-GEMM kernel for ``target`` (the TVM target of ``spec``'s row
    that compile builds for): the first accepting rule's, or, where none accepts it, ``func``
    unscheduled, its trace one no-op instruction (TVM 0.27's ``get_top_k`` never returns a record
    whose trace is empty, so the measured default would be lost)."""
    from ..schedule import schedule_func

    with target:
        sch = schedule_func(func, spec)
    if sch is None:
        sch = Schedule(func)
        sch.get_child_blocks(sch.get_sblock("root"))
    return sch


def generic_space_generator():
    """MetaSchedule's design space for the target: its default rules, post-processors and mutators."""
    return ms.space_generator.PostOrderApply()
