"""Tensor intrinsics that tvm-lowprec adds to TVM (registered on import)."""

from . import arm, x86  # noqa: F401  (registers the intrinsics)
from .arm import ARM_INTRINSICS
from .x86 import X86_INTRINSICS

ALL_INTRINSICS = {**X86_INTRINSICS, **ARM_INTRINSICS}

__all__ = ["ALL_INTRINSICS", "ARM_INTRINSICS", "X86_INTRINSICS"]
