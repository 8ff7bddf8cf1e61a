"""Recorded x86 hosts: the ``flags`` line of ``/proc/cpuinfo`` and the LLVM CPU name of machines this
package runs on, so that a process can behave "as on another host" (``TVM_LOWPREC_HOST_FEATURES=zen3``,
or the test suite's ``--host-features zen3``): :func:`tvm_lowprec.targets.host_features` then returns
the recorded host's features, ``"native"`` resolves to that host's row and is built for its ``mcpu``.

Simulating a host never runs an instruction the real CPU lacks: what runs natively is decided from the
recorded features *and* the real ones (:func:`tvm_lowprec.targets.runnable_features`); a row the recorded
host has but the real CPU lacks (AMX or AVX512_FP16 simulated on a Zen 4) runs emulated or not at all.

The flag lines are as Linux writes them (underscored AVX/AMX names: ``avx512_vnni``); the virtualized
ones carry ``hypervisor``, as the cloud machines the suite runs on do.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

#: the environment variable naming the recorded host a process runs "as on" (unset or empty: the real one)
HOST_FEATURES_ENV = "TVM_LOWPREC_HOST_FEATURES"

_BASE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 "
)

# AMD EPYC 7763 (Milan, Zen 3) in a KVM guest: AVX2 and FMA, no AVX-512, no VNNI of any width
ZEN3 = _BASE + (
    "ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext invpcid_single vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 "
    "erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr "
    "rdpru wbnoinvd arat npt nrip_save umip pku ospke vaes vpclmulqdq rdpid fsrm"
)

# AMD EPYC 9R14 (Genoa, Zen 4) in a KVM guest, read on the 2-core development machine: AVX-512 with
# VNNI, BF16, VBMI/VBMI2, no AVX-VNNI (VEX), no AMX, no AVX512_FP16
ZEN4 = _BASE + (
    "ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext cpuid_fault vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms "
    "invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl "
    "xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni "
    "vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm"
)

# AMD EPYC 9R45 (Turin, Zen 5) in a KVM guest: Zen 4's AVX-512 plus AVX-VNNI, VP2INTERSECT, MOVDIRI
ZEN5 = _BASE + (
    "ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext perfctr_core ssbd ibrs ibpb stibp vmmcall fsgsbase tsc_adjust "
    "bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd "
    "sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 clzero xsaveerptr "
    "wbnoinvd arat npt nrip_save avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid movdiri movdir64b fsrm avx512_vp2intersect flush_l1d"
)

# Intel Xeon Platinum 8488C (Sapphire Rapids) in a KVM guest: AVX-512 VNNI/BF16/FP16, AVX-VNNI, AMX
SPR = _BASE + (
    "ss ht syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl xtopology nonstop_tsc cpuid "
    "tsc_known_freq pni pclmulqdq monitor ssse3 fma cx16 pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd "
    "ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq "
    "rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 "
    "xsaves avx_vnni avx512_bf16 wbnoinvd ida arat avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg tme avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear "
    "serialize amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)

# Intel Xeon Platinum 8375C (Ice Lake server) in a KVM guest: AVX-512 VNNI and VBMI, no BF16, no AVX-VNNI
ICELAKE = _BASE + (
    "ss ht syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl xtopology nonstop_tsc cpuid "
    "aperfmperf tsc_known_freq pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd "
    "ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq "
    "rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 "
    "xsaves wbnoinvd ida arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg tme avx512_vpopcntdq rdpid md_clear flush_l1d arch_capabilities"
)

# Intel Xeon Platinum 8175M (Skylake-SP) in a KVM guest: AVX-512 F/BW/VL, no VNNI
SKYLAKE_AVX512 = _BASE + (
    "ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf "
    "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer "
    "aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single pti fsgsbase tsc_adjust "
    "bmi1 hle avx2 smep bmi2 erms invpcid rtm mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd "
    "avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves ida arat pku ospke"
)

# Intel Core i7-12700 (Alder Lake client), bare metal: AVX-VNNI (VEX, ymm) without AVX-512
ALDERLAKE = _BASE + (
    "ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl "
    "xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est "
    "tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave "
    "avx f16c rdrand lahf_lm abm 3dnowprefetch cpuid_fault epb ssbd ibrs ibpb stibp ibrs_enhanced "
    "tpr_shadow flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed "
    "adx smap clflushopt clwb intel_pt sha_ni xsaveopt xsavec xgetbv1 xsaves split_lock_detect avx_vnni "
    "dtherm ida arat pln pts hwp hwp_notify hwp_act_window hwp_epp hwp_pkg_req hfi umip pku ospke waitpkg "
    "gfni vaes vpclmulqdq rdpid movdiri movdir64b fsrm md_clear serialize arch_lbr ibt flush_l1d "
    "arch_capabilities"
)


@dataclass(frozen=True)
class RecordedHost:
    """One recorded machine: ``flags`` (its ``/proc/cpuinfo`` line, after the colon) and ``cpu`` (the
    LLVM CPU name ``llvm_get_system_cpu()`` gives there: the ``mcpu`` of its ``native`` target)."""

    name: str
    cpu: str
    flags: str
    about: str

    @functools.cached_property
    def features(self) -> frozenset[str]:
        from . import cpuinfo_features

        return cpuinfo_features(self.flags)


RECORDED_HOSTS: dict[str, RecordedHost] = {
    h.name: h
    for h in (
        RecordedHost("zen3", "znver3", ZEN3, "AMD EPYC 7763 (Zen 3): AVX2 only"),
        RecordedHost("zen4", "znver4", ZEN4, "AMD EPYC 9R14 (Zen 4): AVX-512 VNNI, BF16, VBMI"),
        RecordedHost("zen5", "znver5", ZEN5, "AMD EPYC 9R45 (Zen 5): AVX-512 VNNI, BF16, VBMI, AVX-VNNI"),
        RecordedHost("spr", "sapphirerapids", SPR, "Intel Xeon 8488C (Sapphire Rapids): AVX-512 VNNI, BF16, FP16, AMX"),
        RecordedHost("icelake", "icelake-server", ICELAKE, "Intel Xeon 8375C (Ice Lake): AVX-512 VNNI, no BF16"),
        RecordedHost("skylake-avx512", "skylake-avx512", SKYLAKE_AVX512, "Intel Xeon 8175M (Skylake-SP): AVX-512BW, no VNNI"),
        RecordedHost("alderlake", "alderlake", ALDERLAKE, "Intel Core i7-12700 (Alder Lake): AVX-VNNI, no AVX-512"),
    )
}


def recorded_host(name: str) -> RecordedHost:
    """The recorded host ``name`` (a key of :data:`RECORDED_HOSTS`)."""
    try:
        return RECORDED_HOSTS[name]
    except KeyError:
        raise ValueError(f"unknown recorded host {name!r} (from {HOST_FEATURES_ENV} or --host-features); "
                         f"recorded: {', '.join(RECORDED_HOSTS)}") from None


def simulated_host() -> RecordedHost | None:
    """The recorded host this process runs as (``TVM_LOWPREC_HOST_FEATURES``, read at each call), or None."""
    name = os.environ.get(HOST_FEATURES_ENV, "").strip()
    return recorded_host(name) if name else None
