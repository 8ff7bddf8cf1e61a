"""Intel AMX's tile instructions executed on any x86-64 host (issue 27, step 3): a TIR kernel calling
LLVM's AMX intrinsics (``ldtilecfg``, ``tilezero``, ``tileloadd64``, ``tdpbusd`` and its signedness
variants, ``tilestored64``, ``tilerelease``) compiles for Sapphire Rapids to the real instructions, and the
same build with each call replaced by its semantics over an emulated tile file
(:mod:`tvm_lowprec.intrin.amx_semantics`) equals numpy exactly, at full and partial tile shapes, over
several K steps and inside parallel tasks (each with its own tiles, as on the hardware). A wrong
semantics (the unsigned operand sign-extended) must be caught. Nothing here runs AMX natively: a process
must ask Linux for the tile state first (``arch_prctl``), which the AMX row's loader is to do."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_lowprec.emulation import EmulationError, known_semantics, load_emulated
from tvm_lowprec.intrin.amx_semantics import AMX_SEMANTICS, AmxSemantics, tile_config

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
SEMANTICS = {**known_semantics(), **AMX_SEMANTICS}


def _kernel(m: int, n: int, k_bytes: int, steps: int, tasks: int, op: str, a_dtype: str, b_dtype: str):
    """``tasks`` parallel tasks, each: C[task] (m x n int32) = sum over ``steps`` K blocks of A (m rows of
    ``k_bytes`` per block) times B (the block's ``k_bytes / 4`` rows of ``4n`` bytes, AMX's pair layout)."""
    kb = k_bytes * steps

    @T.prim_func
    def amx(A: T.Buffer((tasks, m, kb), a_dtype), B: T.Buffer((tasks, steps, k_bytes // 4, 4 * n), b_dtype),
            C: T.Buffer((tasks, m, n), "int32"), cfg: T.Buffer((64,), "uint8")):
        T.func_attr({"global_symbol": "amx", "tirx.noalias": True})
        for t in T.parallel(tasks):
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(0)))
            for s in range(steps):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(1), T.address_of(A[t, 0, s * k_bytes]),
                                              T.int64(kb)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(2), T.address_of(B[t, s, 0, 0]),
                                              T.int64(4 * n)))
                T.evaluate(T.call_llvm_intrin("void", f"llvm.x86.{op}", T.int8(0), T.int8(1), T.int8(2)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(0), T.address_of(C[t, 0, 0]),
                                          T.int64(4 * n)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))

    return tvm.compile(tvm.IRModule({"amx": amx}), target=TARGET)


def _run(m, n, k_bytes, steps=1, tasks=1, op="tdpbusd", semantics=None, seed=0):
    a_dtype, b_dtype = {"tdpbusd": ("uint8", "int8"), "tdpbssd": ("int8", "int8"), "tdpbsud": ("int8", "uint8"),
                        "tdpbuud": ("uint8", "uint8")}[op]
    lib = _kernel(m, n, k_bytes, steps, tasks, op, a_dtype, b_dtype)
    rng = np.random.default_rng(seed)
    info = {d: np.iinfo(d) for d in ("uint8", "int8")}
    a = rng.integers(info[a_dtype].min, info[a_dtype].max + 1, (tasks, m, k_bytes * steps)).astype(a_dtype)
    w = rng.integers(info[b_dtype].min, info[b_dtype].max + 1, (tasks, k_bytes * steps, n)).astype(b_dtype)
    # AMX's B operand: per K block, k_bytes / 4 rows, each n groups of the 4 consecutive K bytes of one column
    b = np.ascontiguousarray(w.reshape(tasks, steps, k_bytes // 4, 4, n).transpose(0, 1, 2, 4, 3)
                             ).reshape(tasks, steps, k_bytes // 4, 4 * n)
    cfg = np.frombuffer(tile_config({0: (m, 4 * n), 1: (m, k_bytes), 2: (k_bytes // 4, 4 * n)}), np.uint8).copy()
    module, report = load_emulated(lib.mod, SEMANTICS if semantics is None else semantics)
    out = tvm.runtime.tensor(np.full((tasks, m, n), 7, np.int32))
    module["amx"](*(tvm.runtime.tensor(x) for x in (a, b)), out, tvm.runtime.tensor(cfg))
    want = np.einsum("tmk,tkn->tmn", a.astype(np.int64), w.astype(np.int64))
    return lib, report, out.numpy(), want


@pytest.mark.parametrize("m,n,k_bytes,steps,tasks", [(16, 16, 64, 1, 1), (16, 16, 64, 3, 1), (7, 10, 48, 2, 1),
                                                     (16, 16, 64, 2, 3)],
                         ids=["full-tile", "three-k-steps", "partial-tiles", "parallel-tasks"])
def test_amx_tile_kernel_is_exact_emulated_and_real_in_assembly(m, n, k_bytes, steps, tasks):
    lib, report, got, want = _run(m, n, k_bytes, steps, tasks)
    np.testing.assert_array_equal(got, want)
    asm = lib.mod.inspect_source("asm")
    for mnemonic in ("ldtilecfg", "tilezero", "tileloadd", "tdpbusd", "tilestored", "tilerelease"):
        assert mnemonic in asm, mnemonic
    # every AMX call of the real build replaced (the vacuity guard: the same counts, and some)
    assert report.found == report.replaced and report.replaced["llvm.x86.tdpbusd"] >= 1


@pytest.mark.parametrize("op", ["tdpbssd", "tdpbsud", "tdpbuud"])
def test_the_signedness_variants_are_exact(op):
    _, _, got, want = _run(16, 8, 32, op=op, seed=3)
    np.testing.assert_array_equal(got, want)


def test_a_wrong_semantics_is_caught():
    """The control: ``tdpbusd`` with its unsigned activations sign-extended gives other numbers."""
    wrong = {**SEMANTICS, "llvm.x86.tdpbusd": AmxSemantics("tdpbusd", a_ext="sext", b_ext="sext")}
    _, _, got, want = _run(16, 16, 64, semantics=wrong)
    assert not np.array_equal(got, want)


def test_tile_config_refuses_shapes_amx_has_not():
    assert tile_config({0: (16, 64)})[:1] == b"\x01" and tile_config({3: (2, 8)})[48 + 3] == 2
    with pytest.raises(ValueError, match="tile 0"):
        tile_config({0: (17, 64)})
    with pytest.raises(ValueError, match="tile 9"):
        tile_config({9: (1, 4)})


def test_an_intrinsic_without_semantics_is_refused_not_run():
    semantics = {k: v for k, v in SEMANTICS.items() if k != "llvm.x86.tilerelease"}
    with pytest.raises(EmulationError, match="tilerelease"):
        _run(16, 16, 64, semantics=semantics)
