"""Devices as data: one :class:`Backend` per kind of device a target row builds for (CPU, CUDA).

A backend holds what differs by device and nothing else does: the schedule rules its kernels are tried
against, TVM's lowering of its Relax module, how a GEMM's layout is chosen, how the compiled module is
built and made runnable, the runtime device it runs on, how a row of it runs on this host (its
executor), and which of the library's services it has (saving, isolated kernel timing, the copy-bandwidth
column). A row reaches its backend through ``spec.backend`` (its ``device`` names it); the modules that
used to test ``spec.device == "cuda"`` ask the backend instead, so a new device is one entry here plus
its rules, lowering and build.

The references are ``"module:attribute"`` strings, resolved when first used: the schedule rules and the
kernels import the target rows, which import this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Mapping


def _resolve(ref: str):
    module, _, path = ref.partition(":")
    value = importlib.import_module(module)
    for name in path.split("."):
        value = getattr(value, name)
    return value


@dataclass(frozen=True)
class Backend:
    """What one device kind brings (module docstring).

    ``tvm_kinds``: the TVM target kinds built for it; ``rules``, ``lowering``, ``layout``, ``build``,
    ``execution``, ``missing``: ``"module:attribute"`` references to its schedule rule list, TVM's
    lowering pipeline module (``dataflow_lower_passes``, ``finalize_passes``), the GEMM layout choice
    (``(problem, spec, b_signed) -> GemmLayout``), the build (the keyword arguments of
    ``tvm_lowprec._build``'s tail -> ``Compiled``), the execution mode on this host (``spec -> str``) and
    why a build cannot run here (``spec -> str``); ``runtime_device``: TVM's device kind a runnable build
    runs on; ``runs_as``: the execution name of such a build; the flags: the services it has."""

    name: str
    tvm_kinds: tuple[str, ...]
    rules: str
    lowering: str
    layout: str
    build: str
    execution: str
    missing: str
    runtime_device: str
    runs_as: str
    savable: bool = False  # tvm_lowprec.save / load (the library and its kernels' sources)
    isolated_profile: bool = False  # Compiled.profile(isolated=True): each kernel timed alone
    copy_bandwidth: bool = False  # the profile's % of this host's copy bandwidth
    row_sums_first: bool = False  # a GEMM's activation row sums made before it where its accumulator is large

    def schedule_rules(self) -> tuple:
        return tuple(_resolve(self.rules))

    def lowering_pipeline(self):
        return _resolve(self.lowering)

    def choose_layout(self, problem, spec, b_signed=None):
        return _resolve(self.layout)(problem, spec, b_signed)

    def build_compiled(self, **kwargs):
        return _resolve(self.build)(**kwargs)

    def execution_mode(self, spec) -> str:
        return _resolve(self.execution)(spec)

    def cannot_run(self, spec) -> str:
        return _resolve(self.missing)(spec)

    def device(self):
        import tvm

        return tvm.device(self.runtime_device, 0)


def _cpu_execution(spec) -> str:
    from .emulation import cpu_execution_mode

    return cpu_execution_mode(spec)


def _cuda_execution(spec) -> str:
    from .cuda.run import tvm_cuda_available

    return "cuda" if tvm_cuda_available() else "compile-only"


def _cpu_missing(spec) -> str:
    from .targets import host_features

    missing = sorted(set(spec.code_features) - set(host_features()))
    return (f"this host lacks {missing} for {spec.name}, and the build cannot be emulated here; compile for a row "
            "this host runs, or run it on a machine that has them")


def _cuda_missing(spec) -> str:
    from .cuda.run import cuda_device_available

    return (f"{spec.name} needs a CUDA device that TVM's runtime can use, and this host has none "
            f"({cuda_device_available()[1]}); the build is compile-only here (its PTX and cubin: Compiled.cuda)")


BACKENDS: Mapping[str, Backend] = {
    "cpu": Backend("cpu", ("llvm",), rules="tvm_lowprec.schedule:DEFAULT_RULES",
                   lowering="tvm.relax.backend.cpu_generic:pipeline",
                   layout="tvm_lowprec.kernels.qgemm:GemmLayout._choose_cpu", build="tvm_lowprec:_build_cpu",
                   execution="tvm_lowprec.backends:_cpu_execution", missing="tvm_lowprec.backends:_cpu_missing",
                   runtime_device="cpu", runs_as="native", savable=True, isolated_profile=True, copy_bandwidth=True,
                   row_sums_first=True),
    "cuda": Backend("cuda", ("cuda",), rules="tvm_lowprec.schedule:CUDA_RULES",
                    lowering="tvm.relax.backend.cuda:pipeline",
                    layout="tvm_lowprec.kernels.qgemm:GemmLayout._choose_mma", build="tvm_lowprec:_build_cuda",
                    execution="tvm_lowprec.backends:_cuda_execution", missing="tvm_lowprec.backends:_cuda_missing",
                    runtime_device="cuda", runs_as="cuda"),
}


def backend_for(spec) -> Backend:
    """The backend of a target row (its ``device``)."""
    return BACKENDS[spec.device]


def backend_for_target(target) -> Backend:
    """The backend building for a ``tvm.target.Target`` (its kind; a host of another kind: the CPU's)."""
    kind = target.kind.name
    return next((b for b in BACKENDS.values() if kind in b.tvm_kinds), BACKENDS["cpu"])


__all__ = ["BACKENDS", "Backend", "backend_for", "backend_for_target"]
