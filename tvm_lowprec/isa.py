"""Instruction-set families as data: how each one's assembly reads (for the loop extraction and
llvm-mca of :mod:`tvm_lowprec.perfmodel`), and how one intrinsic row looks in it (:class:`IntrinAsm`,
carried by the intrinsic row itself: :attr:`tvm_lowprec.hwspec.GemmIntrin.asm`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class AsmSyntax:
    """What the loop extraction and llvm-mca need to know of an assembly dialect."""

    name: str
    triple: str  # llvm-mca -mtriple
    comment: str  # starts a comment to the end of the line
    branch: re.Pattern  # a branch to a label (group 1), conditional or not
    stack_store: re.Pattern  # an instruction storing to the stack (a spill)


SYNTAXES: Mapping[str, AsmSyntax] = {
    # AT&T: ``jne .LBB0_2``; stores name their destination last: ``vmovdqu64 %zmm0, 64(%rsp)``
    "x86": AsmSyntax("x86", "x86_64-unknown-linux-gnu", "#", re.compile(r"^\s*j[a-z]+\s+([.\w$]+)\s*$"),
                     re.compile(r",\s*-?\w*\(%[re]?(sp|bp)\)\s*$")),
    # ``b.ne .LBB4_6``, ``b .L``, ``cbnz x8, .L``, ``tbz w9, #3, .L``; ``#`` starts an immediate, ``//`` a
    # comment; spills: ``str q0, [sp, #16]``, ``stp q1, q2, [x29, #-32]``
    "aarch64": AsmSyntax(
        "aarch64", "aarch64-unknown-linux-gnu", "//",
        re.compile(r"^\s*(?:b(?:\.[a-z]{2})?\s+|cbn?z\s+[wx]\w+\s*,\s*|tbn?z\s+[wx]\w+\s*,\s*#?\w+\s*,\s*)"
                   r"([.\w$]+)\s*$"),
        re.compile(r"^\s*st\w*\s.*\[\s*(sp|x29)\b")),
}


@dataclass(frozen=True)
class IntrinAsm:
    """How one intrinsic row looks in assembly.

    ``mnemonic``: the instruction counted in the loop (one per intrinsic call); ``step``: the
    instructions of one accumulator's update, as templates over ``{r}`` (register class) and the
    registers ``{acc}``, ``{a}``, ``{b}``, ``{ones}``, ``{tmp}``; ``registers``: the vector registers the
    encoding can name (16 for VEX ymm, 32 for EVEX zmm and AArch64's ``v0``-``v31``); ``isa``: the
    :data:`SYNTAXES` entry; ``mattr``: llvm-mca ``-mattr`` features the instructions need on a CPU model
    without them (``usdot`` on cortex-a72: "instruction requires: i8mm").
    """

    mnemonic: str
    step: tuple[str, ...]
    reg: str
    registers: int
    isa: str = "x86"
    mattr: tuple[str, ...] = ()

    @property
    def syntax(self) -> AsmSyntax:
        return SYNTAXES[self.isa]

    def operands(self) -> tuple[str, ...]:
        """The non-accumulator registers the step uses, each once."""
        names = re.findall(r"\{(a|b|ones|tmp)\}", " ".join(self.step))
        return tuple(dict.fromkeys(names))


def _x86_feature_name(flag: str) -> str:
    """Linux writes the AVX and AMX extensions with underscores (``avx512_vnni``, ``avx_vnni``,
    ``avx512_bf16``, ``amx_int8``), LLVM without (``avx512vnni``, ``avxvnni``, ``avx512bf16``, ``amxint8``)."""
    return flag.replace("_", "") if flag.startswith(("avx", "amx")) else flag


@dataclass(frozen=True)
class Isa:
    """One instruction-set family as data: its assembly dialect, the hosts that run it, how Linux lists
    a CPU's features (the ``/proc/cpuinfo`` field and its spellings against LLVM's, which the target rows
    use), and the executors (:mod:`tvm_lowprec.emulation`'s ``execution_mode``) that run its rows on a host
    without their instructions, in order of preference.

    ``triples``: LLVM target triple prefixes of rows built for it (a row without ``mtriple`` is built
    for the host's: :func:`isa_of` gives it :data:`HOST_DEFAULT`); ``machines``: ``platform.machine()``
    of the hosts it is; ``feature_names``: cpuinfo spelling -> LLVM spelling (or a function of the
    spelling); ``executors``: names of off-hardware executors (``"emulated"``: the intrinsics replaced
    by their semantics in LLVM IR, on a host of this family; ``"qemu"``: qemu-user with a cross
    toolchain, :mod:`tvm_lowprec.qemu`)."""

    name: str
    syntax: AsmSyntax
    triples: tuple[str, ...]
    machines: tuple[str, ...]
    cpuinfo_field: str
    feature_names: object  # Mapping[str, str] or Callable[[str], str]
    executors: tuple[str, ...] = ()

    def llvm_feature(self, flag: str) -> str:
        names = self.feature_names
        return names(flag) if callable(names) else names.get(flag, flag)

    def cpuinfo_features(self, listed: str) -> frozenset[str]:
        """The features of one ``/proc/cpuinfo`` feature line (the part after the colon), LLVM names."""
        return frozenset(self.llvm_feature(f) for f in listed.split())


ISAS: Mapping[str, Isa] = {
    "x86": Isa("x86", SYNTAXES["x86"], triples=("x86_64", "i686"), machines=("x86_64", "amd64"),
               cpuinfo_field="flags", feature_names=_x86_feature_name, executors=("emulated",)),
    # Linux on AArch64: ``Features : fp asimd ... asimddp ... i8mm``
    "aarch64": Isa("aarch64", SYNTAXES["aarch64"], triples=("aarch64", "arm64"), machines=("aarch64", "arm64"),
                   cpuinfo_field="Features", feature_names={"asimd": "neon", "asimddp": "dotprod"},
                   executors=("qemu",)),
}
HOST_DEFAULT = "x86"  # the family of a row without ``mtriple`` (built for the host's triple: an x86 row)


def isa_of(spec) -> Isa:
    """The instruction-set family a CPU target row builds code for, from its LLVM triple."""
    triple = str(spec.llvm.get("mtriple", ""))
    return next((isa for isa in ISAS.values() if triple.startswith(isa.triples)), ISAS[HOST_DEFAULT])


def host_isa() -> Isa | None:
    """The family of the machine we run on, or None for one no row is built for."""
    import platform

    machine = platform.machine().lower()
    return next((isa for isa in ISAS.values() if machine in isa.machines), None)


__all__ = ["HOST_DEFAULT", "ISAS", "AsmSyntax", "IntrinAsm", "Isa", "SYNTAXES", "host_isa", "isa_of"]
