"""Target rows: they validate themselves, resolve from every accepted form, and pick tiles by M."""

import dataclasses

import pytest
import tvm

import tvm_lowprec
from tvm_lowprec.hwspec import GemmIntrin, TargetSpec, Tile
from tvm_lowprec.targets import registered_targets, resolve_target

from conftest import TARGETS


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_row_is_consistent(spec):
    assert spec.gemm.lanes * 32 == spec.gemm.vector_bits
    assert set(spec.gemm.features) <= set(spec.features)
    assert spec.tile_for(1).mr == 1
    for m in (1, 2, 3, 16, 1024):
        tile = spec.tile_for(m)
        assert tile.min_m <= m


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_every_row_resolves_by_name(spec):
    assert resolve_target(spec.name) is spec


def test_native_resolves_to_a_row_this_host_runs():
    spec = resolve_target("native")
    assert tvm_lowprec.host_supports(spec)


def test_dict_and_tvm_target_resolve_by_features():
    assert resolve_target({"kind": "llvm", "mcpu": "znver4"}).gemm.name == "vpdpbusd_zmm"
    assert resolve_target(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})).gemm.name == "vpmaddwd_ymm"
    assert resolve_target({"kind": "llvm", "mcpu": "alderlake"}).gemm.name == "vpdpbusd_ymm"


def test_unknown_target_names_the_choices():
    with pytest.raises(ValueError, match="x86-avx2"):
        resolve_target("x86-sse2")


def test_rows_refuse_bad_numbers():
    gi = registered_targets()["x86-avx2"].gemm
    with pytest.raises(ValueError, match="saturating"):
        dataclasses.replace(gi, saturates=True)
    with pytest.raises(ValueError, match="lanes"):
        GemmIntrin("bad", 16, 4, 256, gi.a_operands)
    with pytest.raises(ValueError, match="spill"):
        Tile(1, mr=8, nr=8)
    with pytest.raises(ValueError, match="min_m=1"):
        TargetSpec("t", {"kind": "llvm"}, ("avx2",), gi, (Tile(4, 4, 3),))


def test_a_rows_features_must_cover_its_intrinsic():
    vnni = registered_targets()["x86-avx512-vnni"].gemm
    with pytest.raises(ValueError, match="needs"):
        TargetSpec("t", {"kind": "llvm"}, ("avx2",), vnni, (Tile(1, 1, 4),))
