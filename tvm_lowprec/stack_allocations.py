"""Small buffers on the stack: the TIR pipeline the kernels of a CPU row are built with.

TVM's ``LowerTVMBuiltin`` turns every allocation of a kernel into a ``TVMBackendAllocWorkspace`` /
``TVMBackendFreeWorkspace`` pair (a call into the runtime's workspace pool each), except a ``global``
buffer under 1024 bytes, which stays a stack ``alloca``. Inside a parallel loop the pair runs once per
iteration. A GEMM's row tiles are such iterations, and their buffers miss the exception: the
accumulator tile is 1024 bytes or more (4 x 4 vectors of 16 int32), and the intrinsic's locals
(the broadcast A operand) are ``local`` buffers. So a GEMM with few multiply-adds per tile paid six
runtime calls per tile: SqueezeNet's 225x64x16 layer (57 tiles) ran in 10.1 us, 3.5 us with the same
code and four iterations (Zen 4, one thread).

:data:`PIPELINE` is TVM's default ``s_tir`` pipeline followed by :func:`keep_on_stack`, which marks every
allocation of a constant size up to :data:`STACK_BYTES` ``disable_lower_builtin`` (TVM's own escape
from that lowering): LLVM allocates it in the kernel's (or the parallel body's) stack frame, once.
The kernels' code is otherwise the same.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .kernel_cost import buffer_bytes
from .tir_nest import map_nest

PIPELINE = "lowprec"
# the largest allocation kept on the stack: a 6x4 tile of zmm accumulators is 1.5 KiB, an 8-bit A
# panel copy of a few rows a few KiB; a thread's stack is megabytes (TVM's pool threads: the
# platform's default)
STACK_BYTES = 8192
DISABLE_LOWER = "disable_lower_builtin"  # TVM's kDisableLowerTVMBuiltin


def keep_on_stack(func: tirx.PrimFunc, limit: int = STACK_BYTES) -> tirx.PrimFunc:
    """``func`` with its constant-size allocations of at most ``limit`` bytes marked to stay on the stack."""

    def rewrite(alloc):
        if not isinstance(alloc, tirx.AllocBuffer):
            return None
        size = buffer_bytes(alloc.buffer)
        annotations = dict(alloc.annotations) if alloc.annotations is not None else {}
        if size is None or size > limit or DISABLE_LOWER in annotations:
            return alloc
        return tirx.AllocBuffer(alloc.buffer, {**annotations, DISABLE_LOWER: tirx.IntImm("int32", 1)})

    body = map_nest(func.body, rewrite)
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline_factory(**kwargs):
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    passes, finalize_host, finalize_device = default_s_tir_pipeline(**kwargs)
    stack = tirx.transform.prim_func_pass(lambda f, _mod, _ctx: keep_on_stack(f), opt_level=0,
                                          name="lowprec.KeepOnStack")
    return tvm.transform.Sequential([passes, stack]), finalize_host, finalize_device


def register() -> str:
    """Register :data:`PIPELINE` with TVM's TIR pipelines (once) and return its name, for
    ``tvm.tirx.build(..., pipeline=...)`` and ``tvm.compile(..., tir_pipeline=...)``."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    if PIPELINE not in PIPELINE_MAP:
        register_tir_pipeline(PIPELINE, _pipeline_factory)
    return PIPELINE
