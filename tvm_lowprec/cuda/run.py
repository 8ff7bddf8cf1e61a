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

_NP_DTYPE = {
    "int8": np.int8, "uint8": np.uint8, "int32": np.int32, "float32": np.float32,
    # neither numpy nor CuPy has 4-bit or float8 arrays: such operands travel as their bytes
    "int4": np.uint8, "uint4": np.uint8, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8,
}
_PER_BYTE = {"int4": 2, "uint4": 2}  # 4-bit operands: two per byte along K, low nibble = even k


def operand_layout(gemm) -> dict[str, tuple[tuple[int, int], type, str]]:
    """``{role: (shape, numpy dtype, what it holds)}`` of the arrays ``gemm``'s kernel takes: A
    ``[M, K]``, B ``[N, K]`` (``K/2`` bytes for 4-bit operands, packed; float8 as uint8 bits) and C
    ``[M, N]`` of the mma's accumulator dtype (int32, or float32 for FP8)."""
    out = {}
    for role, rows, dtype in (("A", gemm.m, gemm.a_dtype), ("B", gemm.n, gemm.b_dtype)):
        per = _PER_BYTE.get(dtype, 1)
        if dtype not in _NP_DTYPE or gemm.k % per:
            raise InputError(f"{role}: no device layout for {dtype} with K={gemm.k}")
        note = dtype
        if per > 1:
            note = f"{dtype} packed {per} per byte along K"
        elif np.dtype(_NP_DTYPE[dtype]).name != dtype:
            note = f"{dtype} bits"
        out[role] = ((rows, gemm.k // per), _NP_DTYPE[dtype], note)
    acc = gemm.mma.c_dtype
    out["C"] = ((gemm.m, gemm.n), _NP_DTYPE[acc], acc)
    return out


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


def tvm_cuda_available() -> bool:
    """Whether TVM's own CUDA runtime sees a device (what a compiled whole model runs on)."""
    try:
        import tvm

        return bool(tvm.runtime.enabled("cuda")) and tvm.cuda(0).exist
    except Exception:  # noqa: BLE001
        return False


def device_arch() -> str:
    """``"sm_90"`` for device 0."""
    import cupy

    return f"sm_{cupy.cuda.Device(0).compute_capability}"


class GemmKernel:
    """A loaded GEMM kernel: ``kernel(a, b)`` returns ``C`` (a cupy int32 array, float32 for FP8)."""

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

    def _check(self, role: str, array):
        import cupy

        shape, dtype, note = self.layout[role]
        if not isinstance(array, cupy.ndarray):
            raise InputError(f"{role} must be a cupy array, got {type(array).__name__}")
        if tuple(array.shape) != shape or array.dtype != np.dtype(dtype):
            raise InputError(f"{role} must be {np.dtype(dtype).name}{list(shape)} ({note}), "
                             f"got {array.dtype}{list(array.shape)}")
        if not array.flags.c_contiguous:
            raise InputError(f"{role} must be C-contiguous")

    @property
    def layout(self):
        """:func:`operand_layout` of the kernel's GEMM (worked out once, not per call)."""
        if getattr(self, "_layout", None) is None:
            self._layout = operand_layout(self.gemm)
        return self._layout

    def __call__(self, a, b, c=None):
        """``C = A x B^T`` on cupy arrays laid out as :func:`operand_layout` says; returns C."""
        import cupy

        g = self.gemm
        if c is None:
            shape, dtype, _ = self.layout["C"]
            c = cupy.empty(shape, dtype=dtype)
        self._check("A", a)
        self._check("B", b)
        self._check("C", c)
        by_role = {"A": a, "B": b, "C": c}
        args = tuple(by_role[p.role] for p in g.params)
        self._function(g.grid, g.block, args, shared_mem=g.dynamic_shared_bytes)
        return c


def _to_device(x):
    import cupy

    if isinstance(x, np.ndarray) and x.dtype.itemsize == 1 and x.dtype.kind == "V":
        x = x.view(np.uint8)  # ml_dtypes float8: its bits
    return cupy.ascontiguousarray(cupy.asarray(x))


def run_gemm(gemm, a, b):
    """One-shot: load ``gemm``, run it on host or device arrays (float8 ones from ``ml_dtypes`` are
    passed as their bits; 4-bit ones packed, see :func:`operand_layout`), return C as a numpy array
    (int32, or float32 for FP8)."""
    import cupy

    kernel = GemmKernel(gemm)
    c = kernel(_to_device(a), _to_device(b))
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(c)
