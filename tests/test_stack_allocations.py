"""Small buffers stay on the stack (tvm_lowprec.stack_allocations): a GEMM's row tiles, each an iteration
of a parallel loop, no longer call the runtime's workspace pool for their accumulator tile and the
intrinsic's locals, and the results are unchanged."""

import numpy as np
import pytest
import tvm
from tvm import tirx

import tvm_lowprec
from tvm_lowprec.stack_allocations import DISABLE_LOWER, STACK_BYTES, keep_on_stack
from tvm_lowprec.tir_nest import map_nest

from models import qlinear_matmul


def _workspace_calls(ll: str) -> int:
    """Calls of the workspace pool in LLVM IR (through the function pointer TVM's module holds)."""
    return sum(1 for line in ll.splitlines() if " load " in line and "@__TVMBackendAllocWorkspace" in line)


def test_small_constant_allocations_are_marked_and_large_ones_left():
    from tvm.script import tirx as T

    @T.prim_func
    def func(x: T.Buffer((4096,), "int32"), y: T.Buffer((4096,), "int32")):
        for i in T.parallel(4):
            small = T.alloc_buffer((256,), "int32")  # 1024 bytes: TVM's own rule sends it to the pool
            big = T.alloc_buffer((STACK_BYTES // 4 + 1,), "int32")
            for j in range(16):
                small[j] = x[i * 1024 + j]
                big[j] = x[i * 1024 + j]
            for j in range(16):
                y[i * 1024 + j] = small[j] + big[j]

    marked = {}

    def collect(stmt):
        if isinstance(stmt, tirx.AllocBuffer):
            marked[stmt.buffer.name] = DISABLE_LOWER in (stmt.annotations or {})
        return None

    map_nest(keep_on_stack(func).body, collect)
    assert marked == {"small": True, "big": False}


@pytest.mark.host_dependent
def test_a_short_gemm_calls_no_workspace_pool_per_tile(rng):
    """A 225x16 by 16x64 GEMM (SqueezeNet's expand layer: 57 row tiles of four multiply-add steps):
    no TVMBackendAllocWorkspace call left in its kernel, where TVM's default pipeline has them; exact
    against onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    from tvm_lowprec import native_build

    model = qlinear_matmul(225, 16, 64)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert _workspace_calls(compiled.inspect_source("ll")) == 0
    a = rng.integers(0, 256, (225, 16)).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a)[0], ReferenceEvaluator(model).run(None, {"a": a})[0])
    lowered = compiled._lowered  # the same kernels through TVM's default TIR pipeline
    default = tvm.compile(lowered, target=compiled.spec.tvm_target(2), relax_pipeline=None)
    assert native_build.tir_pipeline(compiled.spec.tvm_target(2)) != "default"
    assert _workspace_calls("\n".join(m.inspect_source("ll") for m in [default.mod, *default.mod.imports]
                                      if m.kind == "llvm")) > 0
