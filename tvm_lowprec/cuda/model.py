"""The CUDA side of a whole compiled model: its kernels' CUDA C (from TVM's source-only module on a
machine without a GPU, or its CUDA module on one), compiled by nvcc to PTX and a cubin for the row's
architecture, and checked: every ``mma`` in the PTX must be one of the row's forms.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from . import nvcc
from .mma import MMA_FORMS, UnsupportedMmaError


@dataclass(frozen=True)
class CudaBuild:
    """A model's device code for one architecture."""

    arch: str
    source: str
    ptx: str
    cubin: bytes
    mma: dict  # PTX mma instruction -> occurrences

    @property
    def kernel_names(self) -> list[str]:
        return sorted(set(re.findall(r"^\.visible \.entry (\w+)\(", self.ptx, flags=re.MULTILINE)))


def cuda_sources(module) -> list[str]:
    """The CUDA C of every device module ``module`` imports (depth first)."""
    found, stack, seen = [], [module], set()
    while stack:
        mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        try:
            source = mod.inspect_source()
        except Exception:  # noqa: BLE001  (modules without source: the VM's own, a DSO)
            source = ""
        if "__global__" in source:
            found.append(source)
        stack.extend(mod.imports)
    return found


def check_mma(ptx: str, spec) -> dict:
    """``{instruction: count}`` of the PTX's mma; raises :class:`UnsupportedMmaError` naming the
    instruction and the architecture when one is not among the row's forms."""
    found = nvcc.ptx_mma_instructions(ptx)
    allowed = {f.ptx for f in MMA_FORMS if f.name in spec.mma_forms()}
    for instruction in found:
        if instruction not in allowed:
            raise UnsupportedMmaError(f"the kernels use {instruction}, which {spec.name} ({spec.arch}) does not "
                                      f"have; its forms are {sorted(allowed)}")
    return found


def build_model(executable, spec) -> CudaBuild | None:
    """nvcc the executable's device code for ``spec.arch``; None when nvcc is not installed."""
    if nvcc.find_tool("nvcc") is None:
        return None
    sources = cuda_sources(executable.mod)
    if not sources:
        raise RuntimeError(f"the build for {spec.name} has no CUDA kernels")
    source = "\n".join(sources)
    ptx = nvcc.compile_ptx(source, spec.arch)
    mma = check_mma(ptx, spec)
    return CudaBuild(spec.arch, source, ptx, nvcc.compile_cubin(source, spec.arch), mma)


@contextlib.contextmanager
def device_compiler(spec):
    """While TVM builds a GPU row's module where its CUDA runtime is enabled (a machine with a GPU),
    the device code is compiled by nvcc for the row's architecture (a cubin), else by TVM's own
    callback (NVRTC through the ``cuda-python`` bindings), else by NVRTC through CuPy (PTX). TVM
    calls this hook only where it has a CUDA runtime; elsewhere the block changes nothing."""
    import tvm.support.nvcc  # noqa: F401  (registers TVM's own callback, restored afterwards)
    import tvm_ffi

    name = "tvm_callback_cuda_compile"
    previous = tvm_ffi.get_global_func(name, allow_missing=True)

    def compile_device_code(code, *_):
        errors = []
        if nvcc.find_tool("nvcc") is not None:
            return nvcc.compile_cubin(code, spec.arch)
        if previous is not None:
            try:
                return previous(code)
            except Exception as err:  # noqa: BLE001  (cuda-python missing: try CuPy)
                errors.append(f"TVM's NVRTC: {err}")
        try:
            from cupy.cuda import compiler

            return compiler.compile_using_nvrtc(code, options=(f"-arch=compute_{spec.arch[3:]}",)).encode()
        except Exception as err:  # noqa: BLE001
            errors.append(f"CuPy's NVRTC: {err}")
        raise nvcc.NvccError("no CUDA compiler for the device code: no nvcc; " + "; ".join(errors))

    tvm_ffi.register_global_func(name, compile_device_code, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)
