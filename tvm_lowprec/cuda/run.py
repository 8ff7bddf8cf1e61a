"""Run a built :class:`~tvm_lowprec.cuda.gemm.CudaGemm` through CuPy, without TVM's CUDA runtime.

The cubin is loaded with ``cupy.RawModule(path=...)``; if the driver refuses it (an architecture
mismatch), the generated CUDA source is compiled by CuPy instead. Arguments go in the order of the
kernel's own signature (``gemm.params``, read from the generated source), never by assumption.
This module does not import TVM.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..errors import InputError

_NP_DTYPE = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32}


def cuda_device_available() -> tuple[bool, str]:
    """``(True, "NVIDIA H200 (sm_90)")`` or ``(False, reason)``; never raises."""
    try:
        import cupy
    except Exception as err:  # noqa: BLE001  (any import failure means: no usable GPU)
        return False, f"cupy is not importable ({type(err).__name__}: {err})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return False, "no CUDA device"
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return True, f"{name} (sm_{device_arch()[3:]})"
    except Exception as err:  # noqa: BLE001
        return False, f"no usable CUDA device ({type(err).__name__}: {err})"


def device_arch() -> str:
    """``"sm_90"`` for device 0."""
    import cupy

    return f"sm_{cupy.cuda.Device(0).compute_capability}"


class GemmKernel:
    """A loaded GEMM kernel: ``kernel(a, b)`` returns ``C`` (a cupy int32 array)."""

    def __init__(self, gemm):
        import cupy

        self.gemm = gemm
        self.loaded_from = None
        self._module = None
        errors = []
        if gemm.cubin:
            try:
                with tempfile.TemporaryDirectory(prefix="tvm_lowprec_cubin_") as tmp:
                    path = os.path.join(tmp, "gemm.cubin")
                    with open(path, "wb") as f:
                        f.write(gemm.cubin)
                    self._module = cupy.RawModule(path=path)
                    self._function = self._module.get_function(gemm.kernel_name)  # loads now
                self.loaded_from = "cubin"
            except Exception as err:  # noqa: BLE001
                errors.append(f"cubin: {type(err).__name__}: {err}")
        if self.loaded_from is None:
            for backend in ("nvcc", "nvrtc"):
                try:
                    self._module = cupy.RawModule(code=gemm.source, backend=backend, options=("-std=c++17",))
                    self._function = self._module.get_function(gemm.kernel_name)
                    self.loaded_from = f"source ({backend})"
                    break
                except Exception as err:  # noqa: BLE001
                    errors.append(f"{backend}: {type(err).__name__}: {err}")
        if self.loaded_from is None:
            raise RuntimeError(f"cannot load kernel {gemm.kernel_name}: " + " | ".join(errors))

    def _check(self, role: str, array, shape: tuple[int, int], dtype: str):
        import cupy

        if not isinstance(array, cupy.ndarray):
            raise InputError(f"{role} must be a cupy array, got {type(array).__name__}")
        if tuple(array.shape) != shape or array.dtype != np.dtype(_NP_DTYPE[dtype]):
            raise InputError(f"{role} must be {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}")
        if not array.flags.c_contiguous:
            raise InputError(f"{role} must be C-contiguous")

    def __call__(self, a, b, c=None):
        import cupy

        g = self.gemm
        if c is None:
            c = cupy.empty((g.m, g.n), dtype=np.int32)
        self._check("A", a, (g.m, g.k), g.a_dtype)
        self._check("B", b, (g.n, g.k), g.b_dtype)
        self._check("C", c, (g.m, g.n), "int32")
        by_role = {"A": a, "B": b, "C": c}
        args = tuple(by_role[p.role] for p in g.params)
        self._function(g.grid, g.block, args, shared_mem=g.dynamic_shared_bytes)
        return c


def run_gemm(gemm, a, b):
    """One-shot: load ``gemm``, run it on host or device arrays, return C as a numpy int32 array."""
    import cupy

    kernel = GemmKernel(gemm)
    c = kernel(cupy.ascontiguousarray(cupy.asarray(a)), cupy.ascontiguousarray(cupy.asarray(b)))
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(c)
