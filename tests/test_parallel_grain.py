"""Kernels too small to share between threads run serially (tvm_lowprec.parallel_grain), larger ones
keep their parallel loops, and the results are the same either way; the statement walker they use
(tvm_lowprec.tir_nest) needs no Python stack however deep the nest."""

import sys

import numpy as np
import pytest
from tvm import tirx

import tvm_lowprec
from tvm_lowprec.parallel_grain import GRAIN_US, serial_microseconds, serialize_small_kernels
from tvm_lowprec.tir_nest import map_nest

from models import qlinear_matmul


def _parallel_loops(stmt) -> int:
    found = []

    def visit(node):
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
            found.append(node)
        return None

    map_nest(stmt, visit)
    return len(found)


def _gemm_kernels(compiled):
    return [f for f in compiled._lowered.functions.values()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and f.attrs.get("lowprec.op", None) == "qgemm"]


@pytest.mark.parametrize("m,k,n,parallel", [(9, 48, 64, False), (256, 512, 512, True)])
def test_a_gemm_is_parallel_only_when_its_work_is_worth_a_launch(rng, m, k, n, parallel):
    """9x48x64 (about 0.5 us of work) has no parallel loop left; 256x512x512 (hundreds of us) keeps
    them. Both exact against onnx.reference at two threads."""
    from onnx.reference import ReferenceEvaluator

    model = qlinear_matmul(m, k, n)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", num_threads=2)
    (gemm,) = _gemm_kernels(compiled)
    assert (serial_microseconds(gemm) >= GRAIN_US) == parallel
    assert (_parallel_loops(gemm.body) > 0) == parallel
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    np.testing.assert_array_equal(compiled(a)[0], ReferenceEvaluator(model).run(None, {"a": a})[0])


def test_serialize_leaves_a_kernel_with_a_symbolic_shape_alone():
    from tvm.script import tirx as T

    @T.prim_func
    def func(x: T.handle, y: T.handle):
        n = T.int32()
        X = T.match_buffer(x, (n,), "int8")
        Y = T.match_buffer(y, (n,), "int8")
        for i in T.parallel(n):
            Y[i] = X[i]

    assert serial_microseconds(func) is None
    assert _parallel_loops(serialize_small_kernels(func).body) == 1


def test_the_walker_rebuilds_a_nest_deeper_than_the_recursion_limit():
    depth = sys.getrecursionlimit() + 500
    buf = tirx.decl_buffer((1,), "int32", name="buf")
    loops = [tirx.Var(f"i{d}", "int32") for d in range(depth)]
    stmt = tirx.BufferStore(buf, tirx.IntImm("int32", 1), [tirx.IntImm("int32", 0)])
    for var in reversed(loops):
        stmt = tirx.For(var, 0, 1, tirx.ForKind.PARALLEL if var is loops[-1] else tirx.ForKind.SERIAL, stmt)

    def serial(node):
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
            return tirx.For(node.loop_var, node.min, node.extent, tirx.ForKind.SERIAL, node.body)
        return None

    assert _parallel_loops(stmt) == 1
    rebuilt = map_nest(stmt, serial)
    assert _parallel_loops(rebuilt) == 0 and not rebuilt.same_as(stmt)
    assert map_nest(rebuilt, serial).same_as(rebuilt)  # nothing to change: the same object back
