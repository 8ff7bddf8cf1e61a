"""Our tensor intrinsics in a user's own MetaSchedule space (issue: a library for TVM scripts): a
uint8 x int8 GEMM the user wrote in TVMScript, B in the intrinsic's packed layout, tensorized by
MetaSchedule's own ``MultiLevelTilingWithIntrin`` with the registered name the row's data gives; the
instruction from the perf model's assembly table, the result exact against numpy where the host runs it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import tvm_lowprec
from tvm_lowprec.perfmodel import INTRIN_ASM
from tvm_lowprec.targets import host_supports, resolve_target

ROW = "x86-avx512-vnni"


def _dense(m: int, n: int, k: int, lanes: int, kstep: int):
    @T.prim_func(s_tir=True)
    def dense(A: T.Buffer((m, k), "uint8"), B: T.Buffer((n // lanes, k // kstep, lanes, kstep), "int8"),
              C: T.Buffer((m, n), "int32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, r in T.grid(m, n, k):
            with T.sblock("compute"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    C[vi, vj] = 0
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vr]) * T.Cast(
                    "int32", B[vj // lanes, vr // kstep, vj % lanes, vr % kstep])

    return dense


def test_a_users_metaschedule_space_tensorizes_with_our_intrinsic(rng):
    from tvm.s_tir import meta_schedule as ms

    spec = resolve_target(ROW)
    recipe = spec.gemm
    lanes, kstep = recipe.lanes, recipe.kstep
    name = recipe.a_operands["uint8"].intrin  # the registered name, from the row's data
    m, n, k = 32, 4 * lanes, 16 * kstep
    target = tvm_lowprec.tvm_target(ROW)
    rule = ms.schedule_rule.MultiLevelTilingWithIntrin(
        name, structure="SSRSRS", tile_binds=None, max_innermost_factor=64, vector_load_lens=None, reuse_read=None,
        reuse_write=ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"))
    postprocs = [ms.postproc.RewriteReductionBlock(), ms.postproc.RewriteTensorize()]
    context = ms.TuneContext(mod=tvm.IRModule({"main": _dense(m, n, k, lanes, kstep)}), target=target, task_name="main",
                             space_generator=ms.space_generator.PostOrderApply(sch_rules=[rule], postprocs=postprocs,
                                                                               mutator_probs={}))
    sch = context.generate_design_space()[0]
    for postproc in context.space_generator.postprocs:
        assert postproc.apply(sch)
    assert "Tensorize" in [inst.kind.name for inst in sch.trace.insts]
    lib = tvm.compile(sch.mod, target=target)
    asm = INTRIN_ASM[recipe.name]
    assert any(asm.mnemonic in line and asm.reg in line for line in lib.mod.inspect_source("asm").splitlines())
    if not host_supports(spec):
        pytest.skip(f"this host lacks {ROW}'s features: the instruction was checked, the run is not")
    a = rng.integers(0, 256, (m, k)).astype("uint8")
    b = rng.integers(-128, 128, (n // lanes, k // kstep, lanes, kstep)).astype("int8")
    c = tvm.runtime.tensor(np.zeros((m, n), "int32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    want = a.astype(np.int32) @ b.transpose(1, 3, 0, 2).reshape(k, n).astype(np.int32)
    np.testing.assert_array_equal(c.numpy(), want)
