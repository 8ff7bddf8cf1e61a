"""CUDA tensor-core kernels: the mma table, nvcc compilation, a TVM-scheduled INT8 GEMM and a
launcher that runs its cubin through CuPy (no TVM CUDA runtime needed).

Importing this package does not import TVM; :mod:`.gemm` does.
"""

from .mma import (
    MMA_FORMS,
    MmaForm,
    UnsupportedMmaError,
    find_mma,
    forms_for,
    require_mma,
    sm_number,
)

__all__ = [
    "MMA_FORMS",
    "MmaForm",
    "UnsupportedMmaError",
    "find_mma",
    "forms_for",
    "require_mma",
    "sm_number",
]
