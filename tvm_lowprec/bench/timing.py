"""Wall-clock timing of a callable: warm-up, calibrated inner loop, median of repeats."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

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
    number = 1
    while True:
        took = _elapsed(fn, number)
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
