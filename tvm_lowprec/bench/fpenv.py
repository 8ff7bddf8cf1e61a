"""The x86 SSE control register (MXCSR) of the calling thread: run code with denormals read and
written as zero, to find kernels whose time depends on them.

A float kernel should never meet a denormal in normal use: quantized models' floats are scales,
multipliers and codes times scales. Where one does, it is nearly always garbage: lanes that a vector
load reads past the end of a small buffer (LLVM widens a 12-lane load of a 48-byte constant to 16
lanes, as far as the buffer's 64-byte alignment allows), whose values are whatever lies there. The
results are discarded, but an FMA on a denormal input takes a microcode assist of some hundred
cycles on Intel cores, and the kernel runs many times slower in some processes and not in others
(found so: the text detector's 6-channel upsampler, 1.2 ms instead of 0.06 ms;
:func:`~tvm_lowprec.kernels.col2im.param_length`). ``benchmarks/denormals.py`` profiles each model
with and without :func:`denormals_are_zero` and names the kernels it speeds up.

The flags are per thread: with one TVM thread the kernels run on the calling thread; TVM's pool
workers keep the MXCSR they started with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from contextlib import contextmanager

from ..errors import LowPrecError

DAZ, FTZ = 1 << 6, 1 << 15  # MXCSR: denormal inputs read as zero; denormal results flushed to zero
_MXCSR_OFFSET = 28  # glibc's x86-64 fenv_t: the x87 environment (28 bytes), then __mxcsr


class _FenvT(ctypes.Structure):
    _fields_ = [("x87", ctypes.c_uint8 * _MXCSR_OFFSET), ("mxcsr", ctypes.c_uint32)]


def _libm():
    if platform.machine() not in ("x86_64", "AMD64"):
        raise LowPrecError(f"denormals_are_zero: sets the x86 MXCSR register; this machine is {platform.machine()}")
    name = ctypes.util.find_library("m")
    if name is None:
        raise LowPrecError("denormals_are_zero: the C math library (libm, for fegetenv/fesetenv) was not found")
    return ctypes.CDLL(name)


def mxcsr() -> int:
    """The calling thread's MXCSR."""
    env = _FenvT()
    if _libm().fegetenv(ctypes.byref(env)) != 0:
        raise LowPrecError("fegetenv failed")
    return int(env.mxcsr)


def _set_mxcsr(value: int) -> None:
    libm, env = _libm(), _FenvT()
    if libm.fegetenv(ctypes.byref(env)) != 0:
        raise LowPrecError("fegetenv failed")
    env.mxcsr = value
    if libm.fesetenv(ctypes.byref(env)) != 0:
        raise LowPrecError("fesetenv failed")


@contextmanager
def denormals_are_zero():
    """Within the block, the calling thread reads denormal float inputs as zero and flushes denormal
    results to zero (DAZ and FTZ); the previous MXCSR is restored after it."""
    before = mxcsr()
    _set_mxcsr(before | DAZ | FTZ)
    try:
        yield
    finally:
        _set_mxcsr(before)
