"""This host's copy bandwidth by buffer size: the memory-speed ceiling of a kernel that computes little.

A streaming copy is what an elementwise kernel, a transpose, a pooling window or a lookup does at
best: read its inputs once, write its outputs once. Its speed depends on where the bytes live (a
32 KiB copy stays in L1/L2, a 64 MiB one goes to DRAM), so the ceiling of a kernel is a copy of as
many bytes as the kernel moves. :meth:`Compiled.profile <tvm_lowprec.Compiled.profile>` divides each
non-GEMM kernel's GB/s by it (``pct_copy``).

Two copies are timed at each size, interleaved (:func:`~tvm_lowprec.bench.timing.measure_interleaved`),
and the ceiling is the faster:

- a TVM-compiled copy kernel (float32, parallel outer loop, 16 lanes vectorized, unrolled by 8), what
  our kernels are made of, run on **TVM's runtime pool as it is configured** (the thread count of the
  model being profiled: :class:`~tvm_lowprec.Compiled` sets it first);
- ``numpy.copyto`` (glibc's ``memcpy``), **one thread**.

On the 2-core Zen 5 class host (noisy: other work shares the cores) the TVM kernel on one thread
matched or beat ``np.copyto`` (114-118 against 74-76 GB/s at 16 KiB, where numpy's call costs show;
within noise of each other from 64 KiB up: about 130-200 GB/s in L2, 85-100 at 1-4 MiB, 36-48 from
16 MiB). On two threads it reached 150-218 GB/s at 1-4 MiB, where ``np.copyto`` stays at one core's
90-100; but at 16-64 KiB a parallel launch costs more than the copy takes (10-92 GB/s), and there
numpy's one thread sets the ceiling. ``source`` says which copy set each size's ceiling.

Bytes: a copy of N bytes counts as **2N bytes moved** (N read + N written), the way a kernel's bytes
count every input it reads and every output it writes; a kernel moving B bytes is compared with the
copy that moves B bytes (a buffer of B/2), interpolated between the measured sizes in log size and
held flat beyond them.

Examples
--------
>>> table = copy_bandwidth()          # measured once per process and pool size (under a second)
>>> table is copy_bandwidth()
True
>>> table.ceiling(64 * 256 * 5) > 0  # GB/s of a copy moving as many bytes as a [64, 256] quantize
True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .timing import Timing, measure_interleaved, wall_loop

BUFFER_SIZES = tuple(16 * 1024 * 4**i for i in range(7))  # copied buffers: 16 KiB, 64 KiB, ..., 64 MiB
COPY_TIMING = Timing(min_time=0.003, repeat=5, budget=None)  # 7 sizes x 2 copies in about half a second
_TABLES: dict[int, "CopyBandwidth"] = {}  # pool threads -> this process's table


@dataclass(frozen=True)
class CopyBandwidth:
    """Measured copy bandwidth: a copy moving ``moved[i]`` bytes (twice its buffer) ran at ``gbs[i]``
    GB/s, the faster of ``tvm_gbs[i]`` (TVM's kernel on ``threads`` threads) and ``numpy_gbs[i]``
    (``np.copyto``, one thread)."""

    moved: tuple[int, ...]
    tvm_gbs: tuple[float, ...]
    numpy_gbs: tuple[float, ...]
    threads: int

    def __post_init__(self):
        if not self.moved or list(self.moved) != sorted(set(self.moved)) or self.threads < 1:
            raise ValueError(f"CopyBandwidth needs increasing sizes and threads >= 1: {self}")
        for values in (self.tvm_gbs, self.numpy_gbs):
            if len(values) != len(self.moved) or not all(math.isfinite(g) and g > 0 for g in values):
                raise ValueError(f"CopyBandwidth needs one positive, finite GB/s per size: {self}")

    @property
    def gbs(self) -> tuple[float, ...]:
        return tuple(map(max, self.tvm_gbs, self.numpy_gbs))

    @property
    def source(self) -> tuple[str, ...]:
        return tuple("tvm" if t >= n else "numpy" for t, n in zip(self.tvm_gbs, self.numpy_gbs))

    def ceiling(self, nbytes: int) -> float:
        """GB/s of a copy moving ``nbytes`` (read + written): linear in log2 size between the measured
        sizes, the end value beyond them."""
        gbs = self.gbs
        if nbytes <= self.moved[0]:
            return gbs[0]
        if nbytes >= self.moved[-1]:
            return gbs[-1]
        i = next(i for i, m in enumerate(self.moved) if m >= nbytes)
        lo, hi = math.log2(self.moved[i - 1]), math.log2(self.moved[i])
        w = (math.log2(nbytes) - lo) / (hi - lo)
        return gbs[i - 1] + w * (gbs[i] - gbs[i - 1])

    def rows(self) -> list[dict]:
        """One dict per size, for a report: buffer and moved bytes, each copy's GB/s, the ceiling's source."""
        return [{"buffer_bytes": m // 2, "moved_bytes": m, "gbs": g, "tvm_gbs": t, "numpy_gbs": n, "source": s}
                for m, g, t, n, s in zip(self.moved, self.gbs, self.tvm_gbs, self.numpy_gbs, self.source)]


@functools.cache
def _copy_kernel(nbytes: int):
    """TVM's copy of ``nbytes`` (a multiple of 512) for this host's CPU, compiled once per process."""
    import tvm
    from tvm import te
    from tvm.target import codegen

    src = te.placeholder((nbytes // 4,), "float32", name="src")
    dst = te.compute(src.shape, lambda i: src[i], name="dst")
    sch = tvm.s_tir.Schedule(te.create_prim_func([src, dst]).with_attr("global_symbol", "lowprec_copy"))
    (loop,) = sch.get_loops(sch.get_sblock("dst"))
    outer, unrolled, lanes = sch.split(loop, [None, 8, 16])
    sch.parallel(outer)
    sch.unroll(unrolled)
    sch.vectorize(lanes)
    target = tvm.target.Target({"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu())})
    return tvm.compile(sch.mod, target=target)["lowprec_copy"]


def pool_threads() -> int:
    """The threads TVM's runtime pool runs a parallel loop on now."""
    import tvm

    return int(tvm.get_global_func("runtime.NumThreads")())


def measure_copy_bandwidth(sizes=BUFFER_SIZES, timing: Timing = COPY_TIMING) -> CopyBandwidth:
    """Time both copies of a buffer of each size (bytes) with the project's timer: a fresh table.

    One source and one destination of the largest size are written before timing (no page faults in
    the loop); each smaller copy uses their first bytes.
    """
    import tvm

    src = np.ones(max(sizes) // 4, np.float32)
    dst = np.zeros_like(src)
    tvm_gbs, numpy_gbs = [], []
    for n in sizes:
        a, b = src[: n // 4], dst[: n // 4]
        kernel, ta, tb = _copy_kernel(n), tvm.runtime.tensor(a), tvm.runtime.tensor(b)
        timed = measure_interleaved({"tvm": wall_loop(lambda: kernel(ta, tb)),
                                     "numpy": wall_loop(lambda: np.copyto(b, a))}, timing)
        tvm_gbs.append(2 * n / timed["tvm"].seconds / 1e9)
        numpy_gbs.append(2 * n / timed["numpy"].seconds / 1e9)
    return CopyBandwidth(tuple(2 * n for n in sizes), tuple(tvm_gbs), tuple(numpy_gbs), pool_threads())


def copy_bandwidth() -> CopyBandwidth:
    """This process's table for TVM's pool at its current thread count: measured on the first call
    (:func:`measure_copy_bandwidth`), the same object on every later call at that thread count."""
    threads = pool_threads()
    if threads not in _TABLES:
        _TABLES[threads] = measure_copy_bandwidth()
    return _TABLES[threads]


def pct_of_copy(nbytes: int | None, gbs: float | None, table: CopyBandwidth | None) -> float | None:
    """``gbs`` as a percentage of the copy moving ``nbytes``; None where any of them is unknown."""
    if nbytes is None or gbs is None or table is None:
        return None
    return 100.0 * gbs / table.ceiling(nbytes)
