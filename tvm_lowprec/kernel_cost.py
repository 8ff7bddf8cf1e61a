"""What one call of a kernel costs, from its PrimFunc alone: bytes of its buffers, operations of
its arithmetic. :class:`tvm_lowprec.Compiled`'s kernel table and profile report them (GOPS, % of copy
bandwidth); :mod:`tvm_lowprec.parallel_grain` estimates a kernel's time on one thread from them.
"""

from __future__ import annotations

import math

import tvm

# the kernels whose profile row reports GOPS; the others report % of the copy bandwidth
COMPUTE_OPS = ("qgemm", "qgemm16", "qdepthwise", "nbits_gemm", "fp32_gemm", "bf16_gemm", "fp8_weights")


def buffer_bytes(buffer) -> int | None:
    """A buffer's bytes (a bool element takes a byte), or None for a symbolic shape."""
    if not all(isinstance(d, (int, tvm.tirx.IntImm)) for d in buffer.shape):
        return None
    dtype = tvm.DataType(str(buffer.dtype))
    bits = 8 if str(dtype) == "bool" else dtype.bits * dtype.lanes
    return math.ceil(math.prod(int(d) for d in buffer.shape) * bits / 8)


def call_ops(attrs) -> int | None:
    """2 x the multiply-adds of one call: a GEMM's M·N·K (times its batch; a 4-bit weight-only GEMM's
    too, and the float GEMMs': FP32, its implicit-GEMM convolutions, BF16, FP8 weights), a depthwise
    convolution's output size times its window. None for the kernels not in :data:`COMPUTE_OPS`."""
    op, shape = attrs.get("lowprec.op", None), attrs.get("lowprec.shape", None)
    if op not in COMPUTE_OPS or shape is None or not all(isinstance(s, int) or hasattr(s, "value") for s in shape):
        return None  # not a GEMM, or a symbolic M: its work is known at run time
    count = 2 * math.prod(int(s) for s in shape)
    return count * max(int(attrs.get("lowprec.batch", 0)), 1) if op == "qgemm" else count


def param_buffers(func) -> list:
    """The buffers of ``func``'s parameters (a TVM 0.27 PrimFunc parameter carries its buffer's type)."""
    from tvm.tirx.buffer import BufferType

    return [p for p in func.params if isinstance(getattr(p, "ty", None), BufferType)]


def param_bytes(func) -> int | None:
    """The bytes of all of ``func``'s parameter buffers, each whole; None where a shape is symbolic."""
    sizes = [buffer_bytes(b) for b in param_buffers(func)]
    return None if any(size is None for size in sizes) else sum(sizes)
