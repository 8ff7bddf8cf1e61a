"""Target registry: names -> frozen :class:`TargetSpec` rows, plus host detection for ``"native"``."""

from __future__ import annotations

import dataclasses

import functools
from typing import Mapping

from ..hwspec import AOperand, CudaTargetSpec, GemmIntrin, GemmRecipe, TargetSpec, Tile
from ..isa import ISAS, host_isa
from .arm import ARM_TARGETS
from .cuda import CUDA_TARGETS
from .hosts import HOST_FEATURES_ENV, RECORDED_HOSTS, RecordedHost, recorded_host, simulated_host
from .x86 import X86_TARGETS

_REGISTRY: dict[str, TargetSpec] = {}


def register_target(spec: TargetSpec) -> TargetSpec:
    """Add a target row; its name and aliases must be new."""
    for key in (spec.name, *spec.aliases):
        if key in _REGISTRY and _REGISTRY[key] is not spec:
            raise ValueError(f"target name {key!r} is already registered")
        _REGISTRY[key] = spec
    return spec


def unregister_target(name: str) -> None:
    """Remove the row ``name`` (canonical) and its aliases; an unknown name is a ``KeyError``."""
    spec = _REGISTRY[name]
    for key in (spec.name, *spec.aliases):
        if _REGISTRY.get(key) is spec:
            del _REGISTRY[key]


for _spec in (*X86_TARGETS, *ARM_TARGETS, *CUDA_TARGETS):
    register_target(_spec)


def registered_targets(device: str | None = None) -> dict[str, TargetSpec]:
    """Canonical name -> spec, in registration order; ``device`` (``"cpu"``, ``"cuda"``) keeps that kind only."""
    return {s.name: s for s in _REGISTRY.values() if device is None or s.device == device}


def llvm_feature_name(flag: str, isa: str = "x86") -> str:
    """A Linux ``/proc/cpuinfo`` feature under LLVM's (and the target rows') name, as the family ``isa``
    spells them (:attr:`tvm_lowprec.isa.Isa.feature_names`): x86 writes the AVX and AMX extensions with
    underscores (``avx512_vnni``, ``amx_int8``), LLVM without; AArch64 writes ``asimd``, ``asimddp``."""
    return ISAS[isa].llvm_feature(flag)


def cpuinfo_features(flags: str, isa: str = "x86") -> frozenset[str]:
    """The features of one feature line of ``/proc/cpuinfo`` (the part after the colon: x86's ``flags``,
    AArch64's ``Features``), LLVM names."""
    return ISAS[isa].cpuinfo_features(flags)


@functools.lru_cache(maxsize=1)
def real_host_features() -> frozenset[str]:
    """CPU features of the machine we really run on (the ``/proc/cpuinfo`` feature line of its family,
    :attr:`tvm_lowprec.isa.Isa.cpuinfo_field`, LLVM names), whatever host is simulated: what decides,
    with :func:`host_features`, which code may run natively."""
    isa = host_isa()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if isa is not None and line.split(":", 1)[0].strip() == isa.cpuinfo_field:
                    return isa.cpuinfo_features(line.split(":", 1)[1])
    except OSError:
        pass
    import tvm

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target))


def host_features() -> frozenset[str]:
    """CPU features of the host (``/proc/cpuinfo`` flags, LLVM names): the machine we run on, or the
    recorded host named by ``TVM_LOWPREC_HOST_FEATURES`` (:mod:`tvm_lowprec.targets.hosts`), which
    ``"native"`` is then resolved for. What may *run* natively: :func:`runnable_features`."""
    simulated = simulated_host()
    return simulated.features if simulated is not None else real_host_features()


def runnable_features() -> frozenset[str]:
    """The features code built here may use and still run natively in this process: :func:`host_features`,
    and, where a recorded host is simulated, only those the real CPU has too (simulating a Sapphire
    Rapids' AMX on a Zen 4 leaves those rows emulated or compile-only, never a SIGILL)."""
    features = host_features()
    return features & real_host_features() if simulated_host() is not None else features


def host_cpu() -> str:
    """The LLVM CPU name of the host (the ``mcpu`` of ``"native"``): the simulated host's recorded one,
    else ``llvm_get_system_cpu()``. Retargeting emulated code reads the real CPU instead
    (:func:`tvm_lowprec.emulation.host_cpu`)."""
    simulated = simulated_host()
    if simulated is not None:
        return simulated.cpu
    import tvm

    return str(tvm.target.codegen.llvm_get_system_cpu())


def host_supports(spec: TargetSpec) -> bool:
    """True when this machine's CPU can execute code built for ``spec``: it has every feature the spec's
    kernels may use, its optional recipes' included (:attr:`TargetSpec.code_features`: the VNNI row's
    bf16 GEMM needs AVX512_BF16, which a Cascade Lake lacks; its ``native`` spec drops that recipe).
    Under a simulated host: only where both it and the real CPU have them (:func:`runnable_features`).
    Never for a GPU row: see :func:`tvm_lowprec.cuda.run.cuda_device_available`."""
    return spec.device == "cpu" and set(spec.code_features) <= runnable_features()


def _isa_name(feature: str) -> str:
    """A feature's name as LLVM and ``/proc/cpuinfo`` both reduce to (``amx-tile``, ``amx_tile`` -> ``amxtile``)."""
    return feature.lower().replace("-", "").replace("_", "").replace(".", "")


def _lacking_here(cpu: str, keep) -> list[str]:
    """Under a simulated host: ``-f`` for each extension that LLVM's ``cpu`` switches on, the recorded host
    has and this machine lacks (not those in ``keep``, the spec's own): LLVM uses some unasked (SSE4a's
    ``insertq`` for plain shuffles under ``znver3``, AVX-VNNI for multiply-adds under ``sapphirerapids``),
    so ``native`` built as on a Zen 3 must not fault on an Intel CPU, nor as on a Sapphire Rapids on a Zen
    4. Tuning flags (not extensions a recorded host lists) stay. Without a simulated host: ``[]``."""
    simulated = simulated_host()
    if simulated is None:
        return []
    import tvm

    implied = tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": cpu}))
    recorded = {_isa_name(f) for f in simulated.features}
    real = {_isa_name(f) for f in real_host_features()}
    return [f"-{f}" for f in sorted(str(f) for f in implied)
            if f not in keep and _isa_name(f) in recorded and _isa_name(f) not in real]


def native_target() -> TargetSpec:
    """The fastest registered x86 row whose features this machine has (rows are listed best first),
    without the optional recipes this machine lacks (:meth:`TargetSpec.for_cpu`)."""
    host = host_features()
    for spec in registered_targets("cpu").values():
        if set(spec.features) <= host:
            cpu = host_cpu()
            derived = spec.for_cpu(host)
            # LLVM names the CPU from its family and model, which a hypervisor or a CPU newer than the
            # LLVM may misreport (a 2-core KVM Xeon with AMX and AVX512_BF16 reads "rocketlake", which
            # has neither): the features this spec's kernels use are switched on by name, so its
            # code never needs the CPU name to imply them (vdpbf16ps on "rocketlake" aborted LLVM)
            # under a simulated host, its CPU name's extensions that this machine lacks switched off
            llvm = {"kind": "llvm", "mcpu": cpu,
                    "mattr": [f"+{f}" for f in derived.code_features] + _lacking_here(cpu, derived.code_features)}
            # every row field carried over (a new field reaches ``native`` without an edit here)
            return dataclasses.replace(derived, name=f"native({spec.name})", llvm=llvm, aliases=(),
                                       description=f"this host ({cpu}) via {spec.name}", base=spec.name)
    raise RuntimeError(
        "no registered target fits this CPU (need at least AVX2); host flags: "
        + " ".join(sorted(host_features()))
    )


def resolve_target(target) -> TargetSpec:
    """A registered name, ``"native"``, a :class:`TargetSpec`, a ``tvm.target.Target`` or a dict."""
    if isinstance(target, (TargetSpec, CudaTargetSpec)):
        return target
    if target is None or target == "native":
        return native_target()
    if isinstance(target, str):
        if target in _REGISTRY:
            return _REGISTRY[target]
        raise ValueError(
            f"unknown target {target!r}; registered: {sorted(registered_targets())} or 'native'"
        )
    import tvm

    if isinstance(target, Mapping):
        target = tvm.target.Target(dict(target))
    if isinstance(target, tvm.target.Target):
        return _spec_from_tvm_target(target)
    raise TypeError(f"target must be a name, a dict, a tvm.target.Target or a TargetSpec, not {type(target)}")


def _spec_from_tvm_target(target) -> TargetSpec:
    import tvm

    if target.kind.name == "cuda":
        return _cuda_spec(target)
    if target.kind.name != "llvm":
        raise ValueError(f"target kind {target.kind.name!r} has no registered integer GEMM yet")
    features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target)}
    for spec in registered_targets("cpu").values():
        if set(spec.features) <= features:
            return dataclasses.replace(spec.for_cpu(features), name=f"{spec.name}@{target.attrs.get('mcpu', 'generic')}",
                                       llvm=dict(target.export()), aliases=(), description=f"user target via {spec.name}")
    raise ValueError(f"target {target} has none of the instruction sets tvm-lowprec needs (at least AVX2)")


def _cuda_spec(target) -> CudaTargetSpec:
    """The newest registered GPU row the target's architecture runs (``sm_86`` -> ``cuda-sm80``)."""
    from ..cuda.mma import sm_number

    arch = target.attrs.get("arch", None)
    if arch is None:
        raise ValueError(f"CUDA target {target} has no 'arch' (e.g. {{'kind': 'cuda', 'arch': 'sm_90'}})")
    sm = sm_number(str(arch))
    rows = [s for s in registered_targets("cuda").values() if sm_number(s.arch) <= sm]
    if not rows:
        raise ValueError(f"CUDA architecture sm_{sm} has no integer tensor-core row (sm_80 or newer needed)")
    best = max(rows, key=lambda s: sm_number(s.arch))
    return CudaTargetSpec(name=f"{best.name}@sm_{sm}", arch=f"sm_{sm}", mma=best.mma, tiles=best.tiles,
                          fp8_mma=best.fp8_mma, int4_mma=best.int4_mma, description=f"user target via {best.name}", base=best.name)


__all__ = [
    "AOperand",
    "CudaTargetSpec",
    "GemmIntrin",
    "GemmRecipe",
    "HOST_FEATURES_ENV",
    "RECORDED_HOSTS",
    "RecordedHost",
    "TargetSpec",
    "Tile",
    "cpuinfo_features",
    "host_cpu",
    "host_features",
    "host_supports",
    "llvm_feature_name",
    "unregister_target",
    "native_target",
    "real_host_features",
    "recorded_host",
    "register_target",
    "registered_targets",
    "resolve_target",
    "runnable_features",
    "simulated_host",
]
