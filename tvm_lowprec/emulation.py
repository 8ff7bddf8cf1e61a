"""Emulated execution: run kernels built for a target row on a host that lacks its instructions.

qemu implements neither VNNI nor AVX-512, so x86 rows are emulated at the LLVM IR level instead:

1. take the LLVM IR of the real build (the same optimized module whose assembly the tests inspect);
2. replace every call of a target-specific intrinsic (``@llvm.x86.*``) by an internal function with
   the instruction's documented semantics in generic IR (:mod:`tvm_lowprec.intrin.semantics`; each
   row declares them in :attr:`~tvm_lowprec.hwspec.GemmIntrin.emulation`);
3. retarget the module to the host CPU: the functions' ``"target-cpu"``/``"target-features"`` and the
   ``tvm_target`` module flag that TVM's loader reads (leaving the flag makes LLVM select for the
   original CPU: SIGILL);
4. load it with TVM's own LLVM IR loader (``tvm_ffi.load_module("x.ll")``) and, for a model, link it
   into a Relax VM executable in place of the real kernel library.

Everything but the replaced instructions is the real build: packing order, tiles, tails, the
epilogue. Every emulated build reports how many calls it replaced against how many calls of each
intrinsic the real build has, and refuses to run an IR with an intrinsic it has no semantics for.
Emulated code is generic and slow: it checks results, it is never timed.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from typing import Mapping

from .errors import LowPrecError
from .isa import isa_of

EMULATED_PREFIX = "lowprec.emu."
_TARGET_INTRINSIC = re.compile(r"@(llvm\.x86\.[\w.]+)\(")
_MODULE_FLAG = re.compile(r'(!\{i32 \d+, !"tvm_target", !")((?:[^"\\]|\\.)*)("\})')


class EmulationError(LowPrecError):
    """The build cannot be emulated here (an intrinsic without semantics, a non-x86 host)."""


@dataclass(frozen=True)
class EmulationReport:
    """What one emulated build replaced.

    Attributes
    ----------
    host_cpu : str
        The LLVM CPU the module was retargeted to.
    found : dict
        LLVM intrinsic -> calls of it in the real build's IR.
    replaced : dict
        LLVM intrinsic -> calls replaced by its generic-IR semantics in the emulated IR.
    """

    host_cpu: str
    found: Mapping[str, int]
    replaced: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.replaced.values())

    def check(self) -> "EmulationReport":
        """Raise unless every call of the real build was replaced (a mismatch would mean code ran
        natively that the host may lack, or that the counting is wrong)."""
        if dict(self.found) != dict(self.replaced):
            raise EmulationError(f"replaced {dict(self.replaced)} calls, the real build has {dict(self.found)}")
        return self


def host_cpu() -> str:
    import tvm

    return str(tvm.target.codegen.llvm_get_system_cpu())


def _host_is_x86_64() -> bool:
    from .isa import ISAS, host_isa

    return host_isa() is ISAS["x86"]


def row_intrinsics(spec) -> tuple:
    """Every intrinsic a CPU row's kernels may call: its GEMM recipes (the narrow one too), its 16-bit
    activation recipe, its 4-bit weight dot product, its bf16 dot product and its byte lookups."""
    extra = (spec.int16, spec.nibble, spec.bf16, getattr(spec, "narrow", None))
    lookups = (spec.lookup, spec.wide_lookup, spec.register_permute)  # intrinsic rows themselves, not recipes
    return (*(r.intrin for r in spec.recipes()), *(r.intrin for r in extra if r is not None),
            *(lookup for lookup in lookups if lookup is not None))


def known_semantics() -> dict:
    """LLVM intrinsic -> semantics, from every registered target row's intrinsics (read each time: a
    row registered later brings its own), and the target intrinsics TVM's own codegen writes."""
    from .intrin.semantics import CODEGEN_SEMANTICS
    from .targets import registered_targets

    table = dict(CODEGEN_SEMANTICS)
    for spec in registered_targets("cpu").values():
        for intrin in row_intrinsics(spec):
            table.update(intrin.emulation)
    return table


def execution_mode(spec) -> str:
    """``"native"`` (this host has the row's instruction set), ``"cuda"`` (a GPU row, and this host
    has a CUDA device that TVM's runtime can use), the first of the row's family's off-hardware
    executors (:attr:`tvm_lowprec.isa.Isa.executors`, :data:`EXECUTORS`) that can run it here:
    ``"emulated"`` (through :func:`emulated_ir`), ``"qemu"`` (an AArch64 row whose kernels run under
    qemu-aarch64: :mod:`tvm_lowprec.qemu`), or else ``"compile-only"``."""
    return spec.backend.execution_mode(spec)


def cpu_execution_mode(spec) -> str:
    """:func:`execution_mode` of a CPU row (the CPU backend's executor)."""
    from .targets import host_supports

    if host_supports(spec):
        return "native"
    return next((name for name in isa_of(spec).executors if EXECUTORS[name](spec)), "compile-only")


def _emulates(spec) -> bool:
    """The row's intrinsics replaced by their semantics in LLVM IR (:func:`emulated_ir`): every intrinsic
    has semantics, and this host is of the row's instruction-set family (the rest of the code is native)."""
    from .isa import host_isa

    needed = set()
    for intrin in row_intrinsics(spec):
        if not intrin.emulation:
            return False
        needed |= set(intrin.emulation)
    return host_isa() is isa_of(spec) and needed <= set(known_semantics())


def _qemu_runs(spec) -> bool:
    """The real instructions under qemu-user, linked by the row's cross toolchain (:mod:`tvm_lowprec.qemu`)."""
    from . import qemu

    return qemu.available()


# Off-hardware executors by name (:attr:`tvm_lowprec.isa.Isa.executors` lists a family's, in order): whether
# each can run a row on this host
EXECUTORS = {"emulated": _emulates, "qemu": _qemu_runs}


def count_intrinsic_calls(ll: str) -> dict:
    """Target-specific intrinsic -> number of call sites in an LLVM IR module's text."""
    counts: dict[str, int] = {}
    for line in ll.splitlines():
        if line.lstrip().startswith("declare"):
            continue
        for name in _TARGET_INTRINSIC.findall(line):
            counts[name] = counts.get(name, 0) + 1
    return counts


def _retarget_flag(match, cpu: str) -> str:
    text = match.group(2).replace("\\22", '"').replace("\\5C", "\\")
    target = json.loads(text)
    target["mcpu"] = cpu
    target.pop("mattr", None)  # the host CPU's own features
    encoded = json.dumps(target, separators=(",", ":")).replace("\\", "\\5C").replace('"', "\\22")
    return match.group(1) + encoded + match.group(3)


def emulated_ir(ll: str, semantics: Mapping[str, object] | None = None, cpu: str | None = None):
    """The LLVM IR ``ll`` with every target intrinsic replaced by its semantics, retargeted to ``cpu``
    (default: this host). Returns ``(ir, EmulationReport)``.

    ``semantics`` (LLVM intrinsic -> object with ``llvm_ir(name)``) defaults to
    :func:`known_semantics`; pass a modified table to test that a wrong semantics is caught.
    """
    semantics = known_semantics() if semantics is None else semantics
    cpu = cpu or host_cpu()
    found = count_intrinsic_calls(ll)
    missing = sorted(set(found) - set(semantics))
    if missing:
        raise EmulationError(f"no emulated semantics for {missing}: add them beside the intrinsic that calls them")
    replaced, definitions = {}, []
    for name in sorted(found):
        ll = re.sub(rf"^declare [^\n]*@{re.escape(name)}\([^\n]*$", "", ll, flags=re.M)
        emulated = EMULATED_PREFIX + name[len("llvm."):]
        if getattr(semantics[name], "state", None):  # a register file in memory, passed to each call
            ll, replaced[name] = re.subn(rf"(?:(?:tail|musttail|notail) )?call (\w+) @{re.escape(name)}\(",
                                         rf"call \1 @{emulated}(ptr %{_STATE}, ", ll)
            ll = ll.replace(f"(ptr %{_STATE}, )", f"(ptr %{_STATE})")
        else:
            ll, replaced[name] = re.subn(rf"@{re.escape(name)}\(", f"@{emulated}(", ll)
        definitions.append(semantics[name].llvm_ir(emulated))
    states = {semantics[name].state for name in found if getattr(semantics[name], "state", None)}
    if len(states) > 1:
        raise EmulationError(f"intrinsics with different emulated register files: {sorted(states)}")
    if states:
        ll = _allocate_state(ll, states.pop())
    ll = re.sub(r'"target-cpu"="[^"]*"', f'"target-cpu"="{cpu}"', ll)
    ll = re.sub(r'"target-features"(="[^"]*")?', '"target-features"=""', ll)
    ll, flags = _MODULE_FLAG.subn(lambda m: _retarget_flag(m, cpu), ll)
    if flags != 1:
        raise EmulationError(f"expected one tvm_target module flag in the LLVM IR, found {flags}")
    left = count_intrinsic_calls(ll)
    if left:
        raise EmulationError(f"target intrinsics left after emulation: {left}")
    return ll + "\n" + "\n".join(definitions), EmulationReport(cpu, found, replaced)


_STATE = "lowprec.emu.state"  # the emulated register file of a stateful instruction set (AMX's tiles)
_DEFINE = re.compile(r"^define [^\n]*\{\n", re.M)


def _allocate_state(ll: str, state_type: str) -> str:
    """``ll`` with the emulated register file allocated at the entry of every function that passes it to
    a replaced call (after the entry block's label, where it has one): per function, so per thread, as
    the hardware's tiles are."""
    out, last = [], 0
    for match in _DEFINE.finditer(ll):
        end = ll.find("\n}\n", match.end())
        body = ll[match.end():end]
        if f"%{_STATE}" not in body:
            continue
        first = body.split("\n", 1)[0]
        at = match.end() + (len(first) + 1 if re.match(r"^[\w.$-]+:", first) else 0)
        out += [ll[last:at], f"  %{_STATE} = alloca {state_type}, align 64\n"]
        last = at
    return "".join(out) + ll[last:]


def load_emulated(lib, semantics=None):
    """A runtime module equivalent to ``lib`` (a TVM LLVM library module, e.g. ``tvm.compile(prim_mod,
    target).mod``) with its target intrinsics emulated on this host. Returns ``(module, report)``."""
    import tvm_ffi

    if not _host_is_x86_64():
        raise EmulationError(f"x86 rows are emulated on x86-64 hosts only, not {platform.machine()}")
    ir, report = emulated_ir(lib.inspect_source("ll"), semantics)
    with tempfile.TemporaryDirectory(prefix="lowprec-emu-") as tmp:
        path = os.path.join(tmp, "kernels.ll")
        with open(path, "w") as f:
            f.write(ir)
        module = tvm_ffi.load_module(path)  # TVM's LLVM IR loader parses the file here
    return module, report.check()


def emulated_executable(lowered, executable, target, semantics=None):
    """A Relax VM executable running ``lowered`` (the module ``tvm.compile`` made ``executable``
    from) with the kernel library of ``executable`` emulated. Returns ``(executable, report)``."""
    from .native_build import link_vm

    kernel_libs = [m for m in executable.mod.imports if m.kind == "llvm"]
    if len(kernel_libs) != 1:
        raise EmulationError(f"expected one LLVM kernel library in the executable, found {len(kernel_libs)}")
    module, report = load_emulated(kernel_libs[0], semantics)
    attrs = dict(lowered.attrs) if lowered.attrs else {}
    if attrs.get("external_mods"):
        raise EmulationError("modules with external (BYOC) libraries cannot be emulated")
    return link_vm(lowered, target, module), report  # the same bytecode tvm.compile emitted
