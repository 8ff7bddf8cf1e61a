"""Tensor intrinsics that tvm-lowprec adds to TVM (registered on import)."""

from . import x86  # noqa: F401  (registers the x86 intrinsics)
from .x86 import X86_INTRINSICS

ALL_INTRINSICS = dict(X86_INTRINSICS)

__all__ = ["ALL_INTRINSICS", "X86_INTRINSICS"]
