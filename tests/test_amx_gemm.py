"""The AMX int8 GEMM micro-kernel (:mod:`tvm_lowprec.kernels.amx_gemm`, issue 27): its Sapphire Rapids
build holds the tile instructions (one ``ldtilecfg`` per task, four ``tdpbusd`` per 64 bytes of K), and
run emulated on any x86-64 host (each AMX intrinsic replaced by Intel's semantics) it equals numpy's
int64 product exactly; the process permission for the tile data is asked for, and a refusal is an error
that names it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_lowprec.amx import AmxPermissionError, request_permission
from tvm_lowprec.emulation import known_semantics, load_emulated
from tvm_lowprec.intrin.amx_semantics import AMX_SEMANTICS
from tvm_lowprec.kernels.amx_gemm import build_amx_gemm, pack_b
from tvm_lowprec.targets import real_host_features

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})


@pytest.mark.parametrize("m,n,k,a_dtype", [(32, 32, 64, "uint8"), (64, 96, 192, "uint8"), (96, 32, 128, "int8")])
def test_amx_gemm_is_exact_and_runs_on_the_tiles(m, n, k, a_dtype):
    lib = tvm.compile(tvm.IRModule({"amx_gemm": build_amx_gemm(m, n, k, a_dtype)}), target=TARGET)
    asm = lib.mod.inspect_source("asm")
    dot = "tdpbusd" if a_dtype == "uint8" else "tdpbssd"
    assert asm.count("ldtilecfg") >= 1 and asm.count(dot) >= 4 and "tilestored" in asm and "tilerelease" in asm
    module, report = load_emulated(lib.mod, {**known_semantics(), **AMX_SEMANTICS})
    assert report.replaced[f"llvm.x86.{dot}"] == asm.count(dot)  # every tile product emulated, none left
    rng = np.random.default_rng(m + n + k)
    info = np.iinfo(a_dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    c = tvm.runtime.tensor(np.full((m, n), -1, np.int32))
    module["amx_gemm"](tvm.runtime.tensor(a), tvm.runtime.tensor(pack_b(w)), c)
    np.testing.assert_array_equal(c.numpy(), a.astype(np.int64) @ w.astype(np.int64))


def test_shapes_the_tiles_do_not_cover_are_refused():
    with pytest.raises(ValueError, match="multiples of 32"):
        build_amx_gemm(48, 32, 64)
    with pytest.raises(ValueError, match="K must be a multiple of 64"):
        pack_b(np.zeros((96, 32), np.int8))


def test_permission_for_the_tile_data_is_asked_and_a_refusal_named():
    if "amxint8" in real_host_features():
        request_permission()  # granted on an AMX host with Linux 5.16+
    else:
        with pytest.raises(AmxPermissionError, match="arch_prctl"):
            request_permission()
