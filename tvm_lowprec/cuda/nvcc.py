"""Compile CUDA C to PTX and cubin with ``nvcc``, and read back the tensor-core instructions.

No GPU is needed: ``nvcc -ptx`` and ``nvcc -cubin`` (which runs ``ptxas``) only need the toolkit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ..errors import LowPrecError
from .mma import sm_number


class NvccError(LowPrecError, RuntimeError):
    """nvcc (or ptxas/cuobjdump) failed; the message carries the command and its stderr."""


@dataclass(frozen=True)
class CompiledCuda:
    """The outputs of one CUDA source for one architecture."""

    arch: str  # "sm_90"
    ptx: str
    cubin: bytes


def _wheel_bins() -> list[str]:
    """``bin`` folders of NVIDIA's pip wheels (``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``:
    ``site-packages/nvidia/cu13/bin``)."""
    try:
        import nvidia  # a namespace package: one path per wheel family
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        for sub in sorted(os.listdir(root), reverse=True):
            path = os.path.join(root, sub, "bin")
            if os.path.isdir(path):
                found.append(path)
    return found


def find_tool(name: str) -> str | None:
    """Path of a CUDA toolkit binary: on PATH, else under ``$CUDA_HOME/bin`` or /usr/local/cuda*/bin,
    else in NVIDIA's pip wheels (the test extra installs cuobjdump and nvdisasm that way)."""
    found = shutil.which(name)
    if found:
        return found
    for path in _wheel_bins():
        if os.access(os.path.join(path, name), os.X_OK):
            return os.path.join(path, name)
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    roots += sorted((f"/usr/local/{d}" for d in os.listdir("/usr/local") if d.startswith("cuda-")), reverse=True)
    for root in roots:
        path = os.path.join(root, "bin", name) if root else ""
        if path and os.access(path, os.X_OK):
            return path
    return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    # the tool's own folder first: cuobjdump runs nvdisasm, which a wheel puts beside it (or in a sibling)
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(cmd[0]), *_wheel_bins(), os.environ.get("PATH", "")]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    except OSError as err:
        raise NvccError(f"cannot run {cmd[0]}: {err}") from err
    if proc.returncode != 0:
        raise NvccError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc


def _nvcc() -> str:
    path = find_tool("nvcc")
    if path is None:
        raise NvccError("nvcc not found (put the CUDA toolkit's bin on PATH or set CUDA_HOME)")
    return path


def _compile(source: str, arch: str, kind: str, extra: tuple[str, ...]) -> bytes:
    sm = sm_number(arch)
    suffix = "a" if str(arch).endswith("a") else ""
    with tempfile.TemporaryDirectory(prefix="tvm_lowprec_nvcc_") as tmp:
        src = os.path.join(tmp, "kernel.cu")
        out = os.path.join(tmp, f"kernel.{kind}")
        with open(src, "w") as f:
            f.write(source)
        cmd = [_nvcc(), f"-{kind}", f"-arch=sm_{sm}{suffix}", "-O3", *extra, "-o", out, src]
        _run(cmd)
        with open(out, "rb") as f:
            return f.read()


def compile_ptx(source: str, arch: str, extra: tuple[str, ...] = ()) -> str:
    """CUDA C -> PTX text for ``arch`` (e.g. ``"sm_90"``)."""
    return _compile(source, arch, "ptx", extra).decode()


def compile_cubin(source: str, arch: str, extra: tuple[str, ...] = ()) -> bytes:
    """CUDA C -> cubin (SASS) for ``arch``; nvcc runs ptxas for the real architecture."""
    return _compile(source, arch, "cubin", extra)


def compile_cuda(source: str, arch: str, extra: tuple[str, ...] = ()) -> CompiledCuda:
    """Both PTX and cubin of ``source`` for ``arch``."""
    return CompiledCuda(str(arch), compile_ptx(source, arch, extra), compile_cubin(source, arch, extra))


_MMA_RE = re.compile(r"\b(mma\.sync\.aligned\.[\w.]+)")


def ptx_mma_instructions(ptx: str) -> dict[str, int]:
    """``{instruction: count}`` of every ``mma.sync`` in a PTX text (one entry per distinct form)."""
    counts: dict[str, int] = {}
    for match in _MMA_RE.finditer(ptx):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def sass_mma_opcodes(cubin: bytes) -> dict[str, int] | None:
    """``{opcode: count}`` of the IMMA/HMMA (and QMMA) SASS instructions in a cubin, or ``None`` if
    ``cuobjdump`` is not installed."""
    tool = find_tool("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tvm_lowprec_sass_") as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = _run([tool, "-sass", path]).stdout
    counts: dict[str, int] = {}
    for match in re.finditer(r"\b([IHQ]MMA(?:\.[\w]+)*)", sass):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts
