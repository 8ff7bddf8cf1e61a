"""Linux's permission for Intel AMX's tile data, which a process must ask for before its first tile
instruction (Linux 5.16 and later: the tile state is 8 KiB per thread, not given by default):
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``. Without it the first ``ldtilecfg`` or
``tileloadd`` kills the process with SIGILL; so a module with AMX kernels asks here first, and a refusal
is a :class:`AmxPermissionError` that says what failed, never a dead process."""

from __future__ import annotations

import ctypes
import functools
import os
import platform

from .errors import LowPrecError

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


class AmxPermissionError(LowPrecError):
    """This process may not use AMX's tile data (no AMX, an old kernel, or a refusal), with the reason."""


@functools.lru_cache(maxsize=1)
def request_permission() -> None:
    """Ask Linux once per process for AMX's tile data; raises :class:`AmxPermissionError` naming why not."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise AmxPermissionError(f"AMX needs Linux on x86-64, not {platform.system()} on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                          ctypes.c_ulong(XFEATURE_XTILEDATA))
    if result != 0:
        errno = ctypes.get_errno()
        raise AmxPermissionError(f"arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: {os.strerror(errno)} "
                                 f"(errno {errno}; this CPU or kernel offers no AMX tile data: Linux 5.16+ on a "
                                 "Sapphire Rapids or later Xeon)")


__all__ = ["AmxPermissionError", "request_permission"]
