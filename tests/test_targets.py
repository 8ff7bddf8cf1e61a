"""Target rows: they validate themselves, resolve from every accepted form, and pick tiles by M."""

import dataclasses

import pytest
import tvm

import tvm_lowprec
from tvm_lowprec.hwspec import GemmIntrin, TargetSpec, Tile
from tvm_lowprec.targets import registered_targets, resolve_target
from tvm_lowprec.targets.x86 import VENDOR_ONLY, X86_TARGETS

from conftest import TARGETS


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_row_is_consistent(spec):
    assert spec.gemm.lanes * spec.gemm.rows * 32 == spec.gemm.vector_bits
    assert set(spec.gemm.features) <= set(spec.features)
    assert spec.tile_for(1).mr == spec.gemm.rows  # one row, or one row group of a matrix instruction
    for m in (1, 2, 3, 16, 1024):
        tile = spec.tile_for(m)
        assert tile.min_m <= m


@pytest.mark.parametrize("spec", X86_TARGETS, ids=lambda s: s.name)
def test_a_rows_llvm_cpu_brings_no_one_vendor_extension(spec):
    """The row's code runs on every CPU it names, Intel and AMD: its LLVM target (mcpu and mattr) has
    no feature only one vendor's CPUs have unless the row requires it (znver4 without ``-sse4a`` emitted
    SSE4a's ``insertq``: SIGILL on an Emerald Rapids)."""
    target = spec.tvm_target(1)
    llvm = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    assert not (llvm & set(VENDOR_ONLY)) - set(spec.code_features)


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_every_row_resolves_by_name(spec):
    assert resolve_target(spec.name) is spec


@pytest.mark.host_dependent
def test_native_resolves_to_a_row_this_host_runs():
    from tvm_lowprec import targets

    spec = resolve_target("native")
    assert set(spec.code_features) <= targets.host_features()
    # natively where the real CPU has its features too (always, unless a stronger host is simulated:
    # --host-features, tvm_lowprec.targets.hosts)
    assert tvm_lowprec.host_supports(spec) == (set(spec.code_features) <= targets.real_host_features())


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


# /proc/cpuinfo's flags on the GPU machine's Xeon (LLVM: emeraldrapids), read there on 2026-11-30; the kernel
# writes avx512_vnni, avx_vnni, amx_int8 where LLVM and the rows say avx512vnni, avxvnni, amxint8
XEON_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss "
    "ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch cpuid_fault ssbd "
    "ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq "
    "rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 "
    "xsaves avx_vnni avx512_bf16 wbnoinvd arat avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid bus_lock_detect cldemote movdiri "
    "movdir64b fsrm md_clear serialize tsxldtrk ibt amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d "
    "arch_capabilities "
)


def test_cpuinfo_flags_take_llvm_names_and_pick_the_widest_vnni_row(monkeypatch):
    from tvm_lowprec import targets
    from tvm_lowprec.bench import hostinfo

    features = targets.cpuinfo_features(XEON_FLAGS)
    assert {"avx512vnni", "avxvnni", "avx512bw", "avx512bf16", "amxint8", "avx2"} <= features
    assert not any("_" in f for f in features if f.startswith(("avx", "amx")))
    monkeypatch.setattr(targets, "host_features", lambda: features)
    assert targets.native_target().row == "x86-avx512-vnni"  # was x86-avx-vnni: avx512_vnni went unread
    zen3 = targets.cpuinfo_features("fpu sse sse2 avx avx2 fma bmi2 sha_ni")
    monkeypatch.setattr(targets, "host_features", lambda: zen3)
    assert targets.native_target().row == "x86-avx2" and "sha_ni" in zen3


def test_benchmark_metadata_reads_the_underscored_flags(tmp_path):
    from tvm_lowprec.bench.hostinfo import cpu_info

    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: {XEON_FLAGS}\n\n")
    info = cpu_info(str(path))
    assert info["model"] == "Intel(R) Xeon(R) Processor"
    assert info["flags"] == {"avx2": True, "avx512f": True, "avx512vnni": True, "avx_vnni": True}
