"""Let the previous runtime's worker threads go to sleep before the next runtime is timed.

Benchmarks time every runtime with the thread policy a user gets by default: TVM's pool workers spin
(``TVM_THREAD_POOL_SPIN_COUNT`` unset: 300000 ``sched_yield`` calls) after each parallel region before
they sleep, ONNX Runtime's intra-op workers spin (``session.intra_op.allow_spinning`` on), OpenBLAS
and OpenMP workers spin by their own defaults. Spinning is what makes back-to-back calls of one
runtime fast (no wake-up per parallel region), but in a process that times several runtimes one after
the other, the workers of the runtime timed last keep a core busy while the next one is timed.

:func:`quiesce` waits until no other thread of this process has run for :data:`QUIET_WINDOW_S`
and none is runnable (per-thread CPU time from ``/proc/self/task/*/schedstat``, nanoseconds, and the
state in ``/proc/self/task/*/stat``: a spinning worker preempted by another process is runnable, not
asleep), so every timed loop starts
with the other runtimes' workers asleep; within the loop its own workers spin as a user's would.
Measured on the 2-core Zen 5 host (ORT 1.32, TVM 0.27, 2 threads), other threads kept running after
the last call for: TVM's pool 135-215 ms, ORT's intra-op pool 35-95 ms, OpenBLAS (numpy) about
100 ms. Timed right after an ORT loop (0.2 s loops, 30 rounds), a TVM model's loop shared the cores
with ORT's spinning worker for 41 ms; after :func:`quiesce` no other runtime's thread ran during it and
it took 1.02x its time alone (benchmarks/README.md, "Thread policy"). Where ``schedstat`` cannot be
read (not Linux), it sleeps :data:`FALLBACK_SLEEP_S`, longer than those. :func:`tvm_lowprec.bench.timing.measure_interleaved` (``quiesce=True``) calls it before every timed
loop, :func:`tvm_lowprec.bench.grid.run_point` before every point; :func:`thread_policy` is what each
benchmark records in its metadata.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass

QUIET_WINDOW_S = 0.005  # no other thread ran or was runnable for this long: asleep (a spinner runs every µs)
POLL_S = 0.001
TIMEOUT_S = 2.0  # give up (a thread that never sleeps); counted in the metadata
FALLBACK_SLEEP_S = 0.3  # no per-thread CPU times: sleep past the longest spin measured (TVM's, ~0.2 s)
_TASKS = "/proc/self/task"


@dataclass
class QuiesceLog:
    """What the calls of :func:`quiesce` in this process waited (recorded by :func:`thread_policy`)."""

    calls: int = 0
    waited_s: float = 0.0
    max_wait_s: float = 0.0
    timeouts: int = 0
    fallback_sleeps: int = 0

    def add(self, seconds: float, timed_out: bool, fallback: bool) -> None:
        self.calls += 1
        self.waited_s += seconds
        self.max_wait_s = max(self.max_wait_s, seconds)
        self.timeouts += timed_out
        self.fallback_sleeps += fallback


LOG = QuiesceLog()


def other_threads_cpu_ns() -> dict[int, int] | None:
    """CPU nanoseconds each thread of this process but the caller has run, or None where unknown."""
    sampled = _sample_threads()
    return None if sampled is None else {tid: ns for tid, (ns, _) in sampled.items()}


def _sample_threads() -> dict[int, tuple[int, bool]] | None:
    """``{tid: (CPU nanoseconds, runnable)}`` for every thread of this process but the caller (runnable:
    state ``R``, running or waiting for a CPU, as a spinning worker preempted by another process is),
    or None where ``/proc`` does not say."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir(_TASKS) if int(t) != me]
    except OSError:
        return None
    sampled = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{_TASKS}/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]  # after "tid (comm)"; comm may hold spaces
        except (OSError, ValueError, IndexError):  # a thread that just exited, or no schedstat
            if not os.path.exists(f"{_TASKS}/{tid}"):
                continue
            return None
        sampled[tid] = (ns, state == "R")
    return sampled


def quiesce(window: float = QUIET_WINDOW_S, timeout: float = TIMEOUT_S) -> float:
    """Wait until no other thread of this process has run, or been runnable, for ``window`` seconds;
    return the wait.

    Parameters
    ----------
    window : float
        Seconds in which no other thread gains CPU time or is runnable that count as quiet.
    timeout : float
        Give up after this many seconds (counted in :data:`LOG` as a timeout).

    Returns
    -------
    float
        Seconds waited (at least ``window`` where per-thread CPU times are known).

    Examples
    --------
    >>> quiesce() >= 0
    True
    """
    start = time.perf_counter()
    before = other_threads_cpu_ns()
    if before is None:
        time.sleep(FALLBACK_SLEEP_S)
        waited = time.perf_counter() - start
        LOG.add(waited, False, True)
        return waited
    quiet_since = start
    while True:
        time.sleep(POLL_S)
        now_s, sampled = time.perf_counter(), _sample_threads() or {}
        if any(ns > before.get(tid, 0) or runnable for tid, (ns, runnable) in sampled.items()):
            quiet_since = now_s
        before = {tid: ns for tid, (ns, _) in sampled.items()}
        if now_s - quiet_since >= window or now_s - start >= timeout:
            waited = now_s - start
            LOG.add(waited, now_s - quiet_since < window, False)
            return waited


@dataclass(frozen=True)
class ThreadPolicy:
    """How worker threads behave while timed: every runtime's default, quiesced between runtimes."""

    tvm: str
    onnxruntime: str
    openmp: str
    between_runtimes: str


def thread_policy() -> dict:
    """The thread policy of this run and what :func:`quiesce` waited, for a benchmark's metadata."""
    spin = os.environ.get("TVM_THREAD_POOL_SPIN_COUNT")
    omp = os.environ.get("OMP_WAIT_POLICY")
    policy = ThreadPolicy(
        tvm=f"TVM_THREAD_POOL_SPIN_COUNT={spin}" if spin is not None else "default: workers spin 300000 yields, then sleep",
        onnxruntime="default: session.intra_op.allow_spinning on (sessions from tvm_lowprec.bench.providers.ort_session)",
        openmp=f"OMP_WAIT_POLICY={omp}" if omp is not None else "default (OMP_WAIT_POLICY unset)",
        between_runtimes=(f"quiesce: before every timed loop, wait until no other thread ran or was runnable for "
                          f"{QUIET_WINDOW_S * 1e3:g} ms (/proc/self/task/*/schedstat; timeout {TIMEOUT_S:g} s, "
                          f"else sleep {FALLBACK_SLEEP_S:g} s)"),
    )
    log = {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(LOG).items()}
    return {**asdict(policy), "quiesce": log}
