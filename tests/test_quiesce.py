"""tvm_lowprec.bench.quiesce: a timed loop starts once the other threads of the process are asleep."""

import sys
import threading
import time

import pytest

from tvm_lowprec.bench import quiesce as q

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/task")


def _spinner(seconds: float, done: threading.Event) -> threading.Thread:
    """A thread that busy-waits for ``seconds`` (as a pool worker spins after its last task), then sleeps
    until ``done`` is set (which also ends the spin)."""

    def spin():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and not done.is_set():
            pass
        done.wait()

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread


def test_quiesce_returns_once_a_spinning_thread_sleeps():
    done = threading.Event()
    start = time.perf_counter()
    thread = _spinner(0.1, done)
    try:
        waited = q.quiesce()
        assert time.perf_counter() - start >= 0.1  # not before the spin ended
        assert waited < 1.0
    finally:
        done.set()
        thread.join()


def test_quiesce_gives_up_on_a_thread_that_never_sleeps_and_counts_it():
    done = threading.Event()
    timeouts = q.LOG.timeouts
    thread = _spinner(5.0, done)
    try:
        waited = q.quiesce(timeout=0.05)
        assert 0.05 <= waited < 1.0
        assert q.LOG.timeouts == timeouts + 1
    finally:
        done.set()
        thread.join()


def test_thread_policy_is_recorded():
    policy = q.thread_policy()
    assert set(policy) == {"tvm", "onnxruntime", "openmp", "between_runtimes", "quiesce"}
    assert policy["quiesce"]["calls"] == q.LOG.calls
