"""Wall-clock timing of a callable: warm-up, calibrated inner loop, median of repeats."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from .quiesce import quiesce as _quiesce

_MAX_NUMBER = 1 << 20


@dataclass(frozen=True)
class Timing:
    """How long to measure each benchmark point.

    Attributes
    ----------
    min_time : float
        Minimum seconds of one repeat; the inner loop count is chosen to reach it.
    repeat : int
        Number of repeats; the reported time is their median.
    warmup : int
        Untimed calls before calibration (the first one is timed to detect very slow points).
    budget : float or None
        A point whose first call takes at least this many seconds is measured by that call
        alone (``repeat`` is recorded as 1). ``None`` disables the cut-off.
    """

    min_time: float = 0.1
    repeat: int = 5
    warmup: int = 1
    budget: float | None = 2.0

    def __post_init__(self):
        if self.min_time <= 0 or self.repeat < 1 or self.warmup < 1:
            raise ValueError(f"Timing needs min_time > 0, repeat >= 1, warmup >= 1: {self}")


DEFAULT_TIMING = Timing()
QUICK_TIMING = Timing(min_time=0.02, repeat=3, budget=0.5)


@dataclass(frozen=True)
class Measurement:
    """Median seconds per call, with the loop sizes that produced it."""

    seconds: float
    number: int
    repeat: int


def _elapsed(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def _calibrate(fn: Callable[[], object], min_time: float) -> int:
    """Smallest loop count whose run lasts about ``min_time`` seconds."""
    return _calibrate_loop(wall_loop(fn), min_time)


def _calibrate_loop(loop: Callable[[int], float], min_time: float) -> int:
    """:func:`_calibrate` for ``loop(number) -> seconds per call`` (see :func:`measure_interleaved`)."""
    number = 1
    while True:
        took = loop(number) * number
        if took >= min_time / 4 or number >= _MAX_NUMBER:
            break
        number *= 4
    return max(1, min(_MAX_NUMBER, math.ceil(number * min_time / max(took, 1e-9))))


def measure(fn: Callable[[], object], timing: Timing = DEFAULT_TIMING) -> Measurement:
    """Time ``fn()`` as described by ``timing``.

    Parameters
    ----------
    fn : callable
        Zero-argument callable; its result is discarded.
    timing : Timing
        Loop sizes and the slow-point cut-off.

    Returns
    -------
    Measurement
        Median seconds per call over ``timing.repeat`` repeats.
    """
    first = _elapsed(fn, 1)
    if timing.budget is not None and first >= timing.budget:
        return Measurement(seconds=first, number=1, repeat=1)
    for _ in range(timing.warmup - 1):
        fn()
    number = _calibrate(fn, timing.min_time)
    samples = [_elapsed(fn, number) / number for _ in range(timing.repeat)]
    return Measurement(seconds=statistics.median(samples), number=number, repeat=timing.repeat)


def time_callable(fn: Callable[[], object], min_time: float = 0.1, repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds per call of ``fn()`` after ``warmup`` calls (no slow-point cut-off).

    Parameters
    ----------
    fn : callable
        Zero-argument callable.
    min_time : float
        Minimum seconds per repeat.
    repeat : int
        Number of repeats.
    warmup : int
        Calls made before timing.

    Returns
    -------
    float
    """
    timing = Timing(min_time=min_time, repeat=repeat, warmup=warmup, budget=None)
    return measure(fn, timing).seconds


def wall_loop(fn: Callable[[], object]) -> Callable[[int], float]:
    """``loop(number)``: seconds per call of ``number`` back-to-back calls of ``fn()``, by wall clock."""
    return lambda number: _elapsed(fn, number) / number


def compiled_loop(compiled, *inputs) -> Callable[[int], float]:
    """A :class:`tvm_lowprec.Compiled` model as a timing loop: TVM's time evaluator for ``number``
    calls; a single call (a slow point, or the calibration probe) by wall clock, which costs one call
    where the evaluator would add an untimed one before it."""

    def loop(number: int) -> float:
        if number == 1:
            start = time.perf_counter()
            compiled(*inputs)
            return time.perf_counter() - start
        return compiled.benchmark(*inputs, number=number, repeat=1)

    return loop


def measure_interleaved(loops: Mapping[str, Callable[[int], float]],
                        timing: Timing = DEFAULT_TIMING, quiesce: bool = False) -> dict[str, Measurement]:
    """Time several implementations of one point in interleaved rounds.

    Each of ``timing.repeat`` rounds runs one inner loop of every implementation in turn, so a slow
    phase of a shared machine hits them all alike and their ratios stay meaningful. An implementation
    whose first call here takes ``timing.budget`` seconds or more is measured by that call alone (make
    an untimed warm-up call before, e.g. the one whose output is checked). With ``quiesce``, every
    first call, calibration and timed loop starts once the other threads of this process are asleep
    (:func:`tvm_lowprec.bench.quiesce.quiesce`): runtimes with spinning worker pools (TVM's, ONNX
    Runtime's, OpenMP's) are then timed with their default policy, none slowed by the workers of the
    one timed before it.

    Parameters
    ----------
    loops : mapping of str to callable
        ``loop(number) -> seconds per call`` over ``number`` calls (:func:`wall_loop`, or a runtime's
        own timer such as TVM's time evaluator).
    timing : Timing
        Loop sizes and the slow-point cut-off.
    quiesce : bool
        Wait for the other threads of this process to sleep before every loop (costs 5 ms a loop, up
        to the spin time of the pool that ran last: TVM's ~0.2 s).

    Returns
    -------
    dict of str to Measurement
        In the order of ``loops``.

    Examples
    --------
    >>> out = measure_interleaved({"a": wall_loop(lambda: None)}, Timing(min_time=1e-3, repeat=3))
    >>> out["a"].repeat
    3
    """
    settle = _quiesce if quiesce else (lambda: None)

    def quiet(fn: Callable[[], object]):
        settle()
        return fn()

    first = {key: quiet(lambda: loop(1)) for key, loop in loops.items()}
    slow = {key for key, s in first.items() if timing.budget is not None and s >= timing.budget}
    fast = {key: loop for key, loop in loops.items() if key not in slow}
    for loop in fast.values():
        for _ in range(timing.warmup - 1):
            loop(1)
    numbers = {key: quiet(lambda: _calibrate_loop(loop, timing.min_time)) for key, loop in fast.items()}
    samples: dict[str, list[float]] = {key: [] for key in fast}
    for _ in range(timing.repeat):
        for key, loop in fast.items():
            samples[key].append(quiet(lambda: loop(numbers[key])))
    return {key: Measurement(first[key], 1, 1) if key in slow else
            Measurement(statistics.median(samples[key]), numbers[key], timing.repeat) for key in loops}
