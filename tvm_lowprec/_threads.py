"""TVM's runtime thread pool sizes itself once, at its first parallel call, from ``TVM_NUM_THREADS``;
without it, TVM 0.27 assumes two hardware threads per core on x86 and uses half the CPUs (one
thread on a 2-vCPU machine), and ``runtime.config_threadpool`` cannot grow it later. We set the
variable to the CPUs this process may use, before any kernel runs, unless the user set it.
:class:`tvm_lowprec.Compiled` then narrows the pool per model with ``num_threads``.
"""

import os


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


os.environ.setdefault("TVM_NUM_THREADS", str(default_threads()))
