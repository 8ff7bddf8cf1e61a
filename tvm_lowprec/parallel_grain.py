"""Kernels too small to share between threads: their parallel loops run serially.

A parallel loop becomes one ``TVMBackendParallelLaunch``: the pool's workers are woken (or found
spinning), each runs its share, and the caller waits for the last. On a 2-core Zen 4 that costs
1-1.5 us a launch, more when a worker has gone to sleep, and a GEMM kernel often has two (its A
operand's copy, then the GEMM). So a kernel of a few microseconds gets slower on two threads than on
one: SqueezeNet@64 has 40 kernels, most of 1-5 us; on two threads 28 of them ran slower than on one,
and the model took 0.138-0.26 ms against 0.145 ms on one thread (per-kernel profiles, 1 vs 2 threads).

:func:`serialize_small_kernels` gives every parallel loop of a kernel whose estimated time on one
thread (:func:`serial_microseconds`: its buffers' bytes at :data:`COPY_GBPS`, plus its
operations at :data:`PEAK_GOPS` where it is a GEMM or convolution) is under :data:`GRAIN_US` the serial
kind. The rates are one Zen 4 core's (copy bandwidth; ``vpdpbusd zmm``, or the kernel's own rate in
:data:`OP_GOPS`); the threshold is the
break-even measured there: of SqueezeNet's GEMMs, those estimated at 7.6 us and above ran faster on
two threads, those at 3.8 us and below slower. A kernel with a symbolic shape keeps its loops.

:func:`tvm_lowprec.pipeline.schedule_module` (the ``lowprec.ScheduleFuncs`` pass) applies it to every
kernel it schedules, tuned ones included, so the kernel table shows the loops as they run.
"""

from __future__ import annotations

from tvm import tirx

from .kernel_cost import call_ops, param_bytes
from .tir_nest import map_nest

COPY_GBPS = 20.0  # one Zen 4 core's copy bandwidth (bytes read + written), GB/s
PEAK_GOPS = 460.0  # one Zen 4 core's vpdpbusd zmm peak, GOPS
# kernels whose arithmetic runs well below that peak: the rate that puts their break-even with GRAIN_US
# where it was measured (Keras MobileNetV2, Zen 4, 1 / 2 threads). The depthwise kernel multiplies one
# tap per lane (60-76 GOPS): at PEAK_GOPS its 12x12 layers (7.6 us a call) were estimated under
# GRAIN_US and ran on one thread of two (2 threads 7.6 -> 6.7 us); at 70 GOPS its 384-channel 6x6
# layers (3.6 us) went parallel and got slower (3.6 -> 4.0 us)
OP_GOPS = {"qdepthwise": 100.0}
GRAIN_US = 5.0


def serial_microseconds(func: tirx.PrimFunc) -> float | None:
    """``func``'s estimated time on one thread, in microseconds; None where a buffer is symbolic."""
    size = param_bytes(func)
    if size is None:
        return None
    attrs = func.attrs if func.attrs is not None else {}
    rate = OP_GOPS.get(str(attrs.get("lowprec.op", "")), PEAK_GOPS)
    return size / (COPY_GBPS * 1e3) + (call_ops(attrs) or 0) / (rate * 1e3)


def serialize_small_kernels(func: tirx.PrimFunc, grain_us: float = GRAIN_US) -> tirx.PrimFunc:
    """``func`` with its parallel loops made serial where :func:`serial_microseconds` is under ``grain_us``."""
    estimate = serial_microseconds(func)
    if estimate is None or estimate >= grain_us:
        return func

    def rewrite(stmt):
        if not isinstance(stmt, tirx.For) or stmt.kind != tirx.ForKind.PARALLEL:
            return None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, tirx.ForKind.SERIAL, stmt.body, stmt.thread_binding,
                        stmt.annotations)

    body = map_nest(func.body, rewrite)
    return func if body.same_as(func.body) else func.with_body(body)
