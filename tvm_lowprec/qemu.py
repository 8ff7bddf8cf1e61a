"""Executing AArch64 kernels on an x86-64 host under ``qemu-aarch64``: the real instructions, emulated.

Unlike the x86 rows' VNNI (which qemu does not implement, hence :mod:`tvm_lowprec.emulation`'s IR
rewriting), every AArch64 dot-product instruction (``sdot``, ``udot``, ``usdot``, ``smmla``,
``usmmla``) runs exactly in qemu-user. A kernel library cross-compiled by TVM is written as an
AArch64 object, linked statically with a small C harness (``data/kernel_harness.c``: it reads the
argument tensors from a file, calls the kernel's packed function, writes them back) by
``aarch64-linux-gnu-gcc``, and run under ``qemu-aarch64 -cpu <model>``.

Each row names the qemu CPU model it runs on (:attr:`~tvm_lowprec.hwspec.TargetSpec.qemu_cpu`): the
oldest model that has the row's features and lacks the next row's, so an instruction the row must not
use dies with SIGILL instead of passing unnoticed. Times under emulation mean nothing; this checks
results only.

Debian packages: ``qemu-user``, ``gcc-aarch64-linux-gnu``, ``libc6-dev-arm64-cross``.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import struct
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import LowPrecError

QEMU = "qemu-aarch64"
CROSS_CC = "aarch64-linux-gnu-gcc"
_MAGIC = b"LPRK"
_DL_CODES = {"i": 0, "u": 1, "f": 2}  # DLPack type codes: int, uint, float
_NP_KINDS = {code: kind for kind, code in _DL_CODES.items()}


class QemuError(LowPrecError):
    """A kernel could not be linked or run under qemu, or it raised or died (``signal`` set)."""

    def __init__(self, message: str, signal_number: int | None = None):
        super().__init__(message)
        self.signal = signal_number


def is_aarch64(spec) -> bool:
    """Whether a target row builds AArch64 code (:func:`tvm_lowprec.isa.isa_of`)."""
    from .isa import isa_of

    return isa_of(spec).name == "aarch64"


def _ffi_include() -> Path:
    import tvm_ffi

    return Path(tvm_ffi.__file__).parent / "include"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None where AArch64 kernels can run here, else what is missing (tests skip with it)."""
    missing = [tool for tool in (QEMU, CROSS_CC) if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not found: install the Debian packages qemu-user, gcc-aarch64-linux-gnu "
                "and libc6-dev-arm64-cross")
    if not (_ffi_include() / "tvm" / "ffi" / "c_api.h").is_file():
        return f"the TVM-FFI C headers are missing under {_ffi_include()}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def _require():
    reason = unavailable_reason()
    if reason:
        raise QemuError(f"cannot run AArch64 code here: {reason}")


def export_aarch64(executable, path) -> str:
    """Link ``executable`` (a ``tvm.compile`` result for an AArch64 target) into the shared library
    ``path`` with the cross compiler, for a board to load. Returns the path."""
    if shutil.which(CROSS_CC) is None:
        raise QemuError(f"linking for AArch64 needs the cross compiler {CROSS_CC}: install the Debian packages "
                        "gcc-aarch64-linux-gnu and libc6-dev-arm64-cross")
    from tvm.support import cc

    executable.export_library(str(path), fcompile=cc.cross_compiler(CROSS_CC))
    return str(path)


# ---------------------------------------------------------------- the tensor file

def _to_numpy(value) -> np.ndarray:
    return np.ascontiguousarray(value if isinstance(value, np.ndarray) else value.numpy())


def write_tensors(path: Path, arrays: list[np.ndarray]) -> None:
    """The harness's input format (see ``data/kernel_harness.c``)."""
    with open(path, "wb") as f:
        f.write(_MAGIC + struct.pack("<i", len(arrays)))
        for a in arrays:
            if a.dtype.kind not in _DL_CODES:
                raise QemuError(f"dtype {a.dtype} cannot be passed to a kernel")
            f.write(struct.pack("<BBHi", _DL_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(struct.pack("<q", a.nbytes))
            f.write(a.tobytes())


def read_tensors(path: Path) -> list[np.ndarray]:
    data = Path(path).read_bytes()
    if data[:4] != _MAGIC:
        raise QemuError(f"{path}: not a tensor file")
    (count,), pos, out = struct.unpack_from("<i", data, 4), 8, []
    for _ in range(count):
        code, bits, _lanes, ndim = struct.unpack_from("<BBHi", data, pos)
        pos += 8
        shape = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        (nbytes,) = struct.unpack_from("<q", data, pos)
        pos += 8
        dtype = np.dtype(f"{_NP_KINDS[code]}{bits // 8}")
        out.append(np.frombuffer(data, dtype, nbytes // dtype.itemsize, pos).reshape(shape).copy())
        pos += nbytes
    return out


# ---------------------------------------------------------------- running

class QemuFunction:
    """One kernel of a :class:`QemuModule`: called like TVM's packed function, on TVM tensors or
    numpy arrays, which it updates in place (the kernel's outputs among them)."""

    def __init__(self, module: "QemuModule", name: str):
        self.module, self.name = module, name
        self.executable = module._link(name)

    def __call__(self, *args, cpu: str | None = None, timeout: float = 300.0):
        arrays = [_to_numpy(a) for a in args]
        workdir = self.module.workdir
        src, dst = workdir / f"{self.name}.in", workdir / f"{self.name}.out"
        write_tensors(src, arrays)
        cpu = cpu or self.module.cpu
        try:
            proc = subprocess.run([QEMU, "-cpu", cpu, str(self.executable), str(src), str(dst)],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise QemuError(f"{self.name} under {QEMU} -cpu {cpu} did not finish in {timeout:.0f} s") from None
        if proc.returncode < 0:
            sig = -proc.returncode
            raise QemuError(f"{self.name} died under {QEMU} -cpu {cpu} with {signal.Signals(sig).name}: "
                            f"{proc.stderr.strip()[-300:]}", sig)
        if proc.returncode != 0:
            raise QemuError(f"{self.name} failed under {QEMU} -cpu {cpu} (exit {proc.returncode}): "
                            f"{proc.stderr.strip()[-600:]}")
        for arg, result in zip(args, read_tensors(dst)):
            if isinstance(arg, np.ndarray):
                arg[...] = result
            else:
                arg.copyfrom(result)


class QemuModule:
    """A cross-compiled TVM kernel library (``tvm.compile(prim_mod, aarch64_target)`` or its ``.mod``)
    whose functions run under ``qemu-aarch64 -cpu cpu``: ``QemuModule(lib)["qgemm"](*tensors)``."""

    def __init__(self, lib, cpu: str = "max", workdir: str | os.PathLike | None = None):
        _require()
        self.cpu = cpu
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="lowprec-qemu-")
        self.workdir = Path(workdir or self._tmp.name)
        self.object = self.workdir / "kernels.o"
        from tvm.runtime import Executable

        (lib.mod if isinstance(lib, Executable) else lib).write_to_file(str(self.object))
        self._functions: dict[str, QemuFunction] = {}

    def __getitem__(self, name: str) -> QemuFunction:
        if name not in self._functions:
            self._functions[name] = QemuFunction(self, name)
        return self._functions[name]

    def _link(self, name: str) -> Path:
        harness = resources.files("tvm_lowprec") / "data" / "kernel_harness.c"
        exe = self.workdir / f"{name}.elf"
        cmd = [CROSS_CC, "-O1", "-static", f"-I{_ffi_include()}", f"-DLOWPREC_ENTRY=__tvm_ffi_{name}",
               str(harness), str(self.object), "-o", str(exe), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise QemuError(f"linking {name} for AArch64 failed: {proc.stderr.strip()[-800:]}")
        return exe
