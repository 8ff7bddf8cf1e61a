"""A static performance model of the GEMM micro-kernel: LLVM's ``llvm-mca`` on the generated inner loop.

For a target row this host cannot run (or time), build the GEMM kernel exactly as the library does
(:meth:`~tvm_lowprec.kernels.GemmLayout.choose`, :func:`~tvm_lowprec.kernels.build_qgemm`,
:func:`~tvm_lowprec.schedule.schedule_func`, ``tvm.tirx.build``), take its assembly, find the
micro-kernel's innermost loop (the K loop holding the row's dot-product instructions), and let
``llvm-mca`` simulate that loop on a CPU scheduling model. The ceiling comes from ``llvm-mca`` too: a
synthetic block of independent dot-product steps on the same model. Then::

    predicted fraction of peak = (intrinsic instructions per iteration / cycles per iteration)
                                 / (ceiling intrinsic instructions per cycle)

What the model sees and what it does not:

- It sees the loop body as scheduled on the ports: loads, broadcasts, spills, loop overhead, the
  dependency chains of too few accumulators, the front end's dispatch width.
- It does **not** see memory: every load hits L1, so cache misses, the C traffic of K blocks, the
  epilogue, padding and threading are outside it (:attr:`Prediction.padding_efficiency` reports the
  padding waste separately). Bandwidth-bound shapes (GEMV) are predicted optimistic.
- LLVM 14's models: ``icelake-server``, ``sapphirerapids`` and ``cascadelake`` all use the Skylake-SP
  model, ``alderlake`` the Skylake client model; there is no Zen 4/5 model. On AArch64 it has **no
  Neoverse model**: ``neoverse-v1``, ``neoverse-n2``, ``neoverse-n1``, ``cortex-a76`` and ``cortex-a72``
  all run on its Cortex-A57 model (3-wide dispatch, two 128-bit SIMD pipes), so a "neoverse-v1"
  figure is the fraction of that model's own ``sdot`` ceiling, not of a V1's; ``ampere1`` and
  ``cortex-a57`` are models of their own (:func:`sched_model_note`). LLVM 16 and later have Neoverse
  N1/N2/V1 models (``LLVM_MCA=llvm-mca-19``). A row's CPU list is its :attr:`TargetSpec.mca_cpus`;
  :attr:`Prediction.sched_model` names the model ``llvm-mca`` actually used.
- AArch64 kernels are cross-compiled and simulated with ``-mtriple=aarch64``; LLVM 14's llvm-mca parses
  ``sdot``, ``usdot`` and ``usmmla`` (with ``-mattr=+i8mm`` where the CPU model lacks it:
  :attr:`IntrinAsm.mattr`), ``smull`` and ``sadalp``.

Installing ``llvm-mca`` (pip cannot): ``apt-get install llvm-14`` on Debian/Ubuntu gives
``/usr/bin/llvm-mca`` (or ``llvm-mca-14``); any LLVM >= 12 works. Set ``LLVM_MCA`` to pick another
binary. Without it, :func:`predict` raises :class:`McaError`.

Examples
--------
>>> from tvm_lowprec.perfmodel import predict
>>> from tvm_lowprec.targets import registered_targets
>>> p = predict(registered_targets()["x86-avx512-vnni"], 1024, 1024, 1024)  # doctest: +SKIP
>>> p.mca_cpu, p.tile, round(p.fraction, 2)  # doctest: +SKIP
('icelake-server', (4, 4, 512), 0.99)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .errors import LowPrecError
from .hwspec import GemmRecipe, Memory, TargetSpec, Tile
from .isa import SYNTAXES, AsmSyntax, IntrinAsm  # noqa: F401 (re-exported)


# What llvm-mca is run on comes from the registry, not from tables here: a row's CPU models
# (:attr:`TargetSpec.mca_cpus`), its memory side (:attr:`TargetSpec.memory`), each intrinsic row's
# assembly (:attr:`GemmIntrin.asm`). The mappings below are views of it, rebuilt on each access (a row
# registered later is in them).
def _row_table(field_name: str) -> dict:
    from .targets import registered_targets

    return {name: getattr(spec, field_name) for name, spec in registered_targets("cpu").items()
            if getattr(spec, field_name)}


def _intrin_rows() -> dict:
    """Every intrinsic row the library defines (:data:`tvm_lowprec.intrin.ALL_INTRINSICS`) and every one a
    registered CPU target uses (its GEMM recipes, narrow and 16-bit ones included) that says how it looks
    in assembly: name -> :class:`IntrinAsm`."""
    from .intrin import ALL_INTRINSICS
    from .targets import registered_targets

    table = {name: row.asm for name, row in ALL_INTRINSICS.items() if row.asm is not None}
    for spec in registered_targets("cpu").values():
        recipes = (*spec.recipes(), spec.narrow, spec.int16)
        for recipe in recipes:
            if recipe is not None and getattr(recipe.intrin, "asm", None) is not None:
                table[recipe.intrin.name] = recipe.intrin.asm
    return table


_VIEWS = {"MCA_CPUS": lambda: _row_table("mca_cpus"), "ROW_MEMORY": lambda: _row_table("memory"),
          "INTRIN_ASM": _intrin_rows}


def __getattr__(name: str):
    """``MCA_CPUS`` (row -> llvm-mca CPU models), ``ROW_MEMORY`` (row -> :class:`Memory`), ``INTRIN_ASM``
    (intrinsic row -> :class:`IntrinAsm`): read from the registered rows."""
    if name in _VIEWS:
        return _VIEWS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def intrin_asm(intrin: str) -> IntrinAsm:
    """The assembly of intrinsic row ``intrin`` (:attr:`GemmIntrin.asm`)."""
    try:
        return _intrin_rows()[intrin]
    except KeyError:
        raise McaError(f"intrinsic row {intrin!r} of no registered target says how it looks in assembly "
                       "(GemmIntrin.asm)") from None

# llvm-mca resource prefix (:attr:`McaResult.sched_model`) -> the CPU whose scheduling model it is, for
# the AArch64 models the rows above use (:func:`sched_model_note`).
# LLVM 16 and later (``LLVM_MCA=llvm-mca-19``) have Neoverse models of their own.
ARM_SCHED_MODELS: Mapping[str, str] = {
    "A57": "cortex-a57", "A53": "cortex-a53", "CortexA55": "cortex-a55", "Ampere1": "ampere1",
    "N1": "neoverse-n1", "N2": "neoverse-n2", "V1": "neoverse-v1", "V2": "neoverse-v2",
}


CEILING_MAX_ACCUMULATORS = 24  # enough to hide a 5-cycle latency at 2 per cycle (with margin)
DEFAULT_ITERATIONS = 500


class McaError(LowPrecError):
    """llvm-mca is missing, rejected the input, or the kernel has no loop to model."""


@dataclass(frozen=True)
class KernelLoop:
    """The micro-kernel's innermost loop: its label, its body (label to back branch) and how many
    intrinsic instructions one iteration issues."""

    label: str
    body: tuple[str, ...]
    intrinsics: int
    first_line: int  # 1-based line of the label in the full assembly
    isa: str = "x86"  # the :data:`SYNTAXES` entry the body is written in


@dataclass(frozen=True)
class McaResult:
    """What llvm-mca reports for a block repeated ``iterations`` times."""

    iterations: int
    instructions: int
    total_cycles: int
    block_rthroughput: float
    sched_model: str  # prefix of the model's resources: "SKX", "SKL", "Zn3", "HW", ...

    @property
    def cycles_per_iteration(self) -> float:
        return self.total_cycles / self.iterations


@dataclass(frozen=True)
class Prediction:
    """The model's figures for one (row, shape, tile, CPU model).

    Attributes
    ----------
    target, intrin, mca_cpu, sched_model : str
        The row, its intrinsic row, the llvm-mca CPU and the scheduling model that CPU maps to.
    shape : (M, N, K)
    tile : (mr, nr, kblock)
        As built (clipped to the shape, as :meth:`GemmLayout.choose` does).
    rows : int
        Activation rows per intrinsic (2 for a matrix instruction, ``usmmla``): the register tile
        holds ``mr / rows * nr`` accumulators.
    cycles_per_iteration : float
        llvm-mca's total cycles / iterations of the loop body.
    block_rthroughput : float
        llvm-mca's resource bound for one iteration (no dependencies).
    intrinsics_per_iteration : int
    ceiling_per_cycle : float
        Intrinsic instructions per cycle of the synthetic independent block (llvm-mca, same CPU).
    fraction : float
        Predicted fraction of peak of the micro-kernel loop.
    padding_efficiency : float
        ``M*N*K / (Mp*Np*Kp)``: the share of the padded work that is useful.
    bytes_moved : int
        What one call must read and write at least: the packed weights (as stored: int16 where the
        tile widens them), the activations and the outputs (8-bit).
    stack_accesses : int
        Loop instructions storing to the stack (register spills). llvm-mca does not track a value
        through memory, so a spilled accumulator's store-to-load chain is invisible to it: a loop
        with spills is predicted optimistic.
    """

    target: str
    intrin: str
    mca_cpu: str
    sched_model: str
    shape: tuple[int, int, int]
    tile: tuple[int, int, int]
    cycles_per_iteration: float
    block_rthroughput: float
    intrinsics_per_iteration: int
    ceiling_per_cycle: float
    fraction: float
    padding_efficiency: float
    rows: int = 1
    stack_accesses: int = 0
    bytes_moved: int = 0
    loop: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def with_memory(self, memory: Memory) -> float:
        """Predicted fraction of ``memory.peak_gops`` once the call must also move ``bytes_moved``
        (packed weights, activations, outputs) at ``memory.read_gbs``: a roofline, the slower of the
        micro-kernel at :attr:`gemm_fraction` of peak and the stream of bytes."""
        m, n, k = self.shape
        ops = 2.0 * m * n * k
        compute_s = ops / (memory.peak_gops * 1e9 * self.gemm_fraction)
        memory_s = self.bytes_moved / (memory.read_gbs * 1e9)
        return ops / max(compute_s, memory_s) / (memory.peak_gops * 1e9)

    @property
    def cycles_per_k_step(self) -> float:
        """Predicted cycles for one ``kstep``-deep slice of K across the whole ``mr x nr`` register
        tile (an unrolled loop iteration covers several)."""
        mr, nr, _ = self.tile
        return self.cycles_per_iteration / (self.intrinsics_per_iteration / (mr // self.rows * nr))

    @property
    def gemm_fraction(self) -> float:
        """``fraction * padding_efficiency``: the micro-kernel's share of peak spent on useful work."""
        return self.fraction * self.padding_efficiency


# ---------------------------------------------------------------- llvm-mca

def find_llvm_mca() -> str | None:
    """Path of ``llvm-mca``: ``$LLVM_MCA``, else ``llvm-mca`` or a versioned ``llvm-mca-NN`` on PATH."""
    explicit = os.environ.get("LLVM_MCA")
    if explicit:
        return shutil.which(explicit) or (explicit if os.path.isfile(explicit) else None)
    for name in ("llvm-mca", *(f"llvm-mca-{v}" for v in range(22, 11, -1))):
        path = shutil.which(name)
        if path:
            return path
    return None


@functools.lru_cache(maxsize=None)
def mca_version(binary: str | None = None) -> str:
    """The LLVM version of ``binary`` (default: :func:`find_llvm_mca`'s), e.g. ``"14.0.6"``; ``""`` when
    it cannot be told."""
    binary = binary or find_llvm_mca()
    if binary is None:
        return ""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    match = re.search(r"LLVM version (\d+(?:\.\d+)*)", out)
    return match.group(1) if match else ""


def _mca_binary() -> str:
    path = find_llvm_mca()
    if path is None:
        raise McaError("llvm-mca not found: install it with `apt-get install llvm-14` (or set LLVM_MCA)")
    return path


_FIELDS = {"iterations": r"Iterations:\s+(\d+)", "instructions": r"Instructions:\s+(\d+)",
           "total_cycles": r"Total Cycles:\s+(\d+)", "block_rthroughput": r"Block RThroughput:\s+([\d.]+)"}


def run_mca(asm: str, cpu: str, iterations: int = DEFAULT_ITERATIONS, isa: str = "x86",
            mattr: Sequence[str] = ()) -> McaResult:
    """Simulate ``asm`` (one block, repeated) on llvm-mca's model of ``cpu``.

    ``isa`` picks the triple (:data:`SYNTAXES`: ``x86``, ``aarch64``); ``mattr`` adds ``-mattr=``
    features (``("+i8mm",)``) for instructions the CPU model does not have by default.

    Raises
    ------
    McaError
        llvm-mca is missing, or reported an error (quoted with the offending line of ``asm``); it
        exits 0 on some parse errors, so its standard error is checked too.
    """
    cmd = [_mca_binary(), f"-mtriple={SYNTAXES[isa].triple}", f"-mcpu={cpu}", f"-iterations={iterations}",
           *([f"-mattr={','.join(mattr)}"] if mattr else []), "-"]
    proc = subprocess.run(cmd, input=asm, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or "error:" in proc.stderr:
        raise McaError(_explain_mca_error(proc.stderr, asm, cpu))
    values = {}
    for key, pattern in _FIELDS.items():
        match = re.search(pattern, proc.stdout)
        if match is None:
            raise McaError(f"llvm-mca -mcpu={cpu}: no {key!r} in its output:\n{proc.stdout[:500]}")
        values[key] = float(match.group(1)) if key == "block_rthroughput" else int(match.group(1))
    # the first resource's name, less its unit: SKXDivider, Zn3AGU0, A57UnitB, [0.0] CortexA55UnitALU
    model = re.search(r"Resources:\s*\n\[[\d.]+\]\s+-\s+([A-Za-z]+?\d*)(?:Port|ALU|AGU|Divider|FP|Load|Store|Unit)",
                      proc.stdout)
    return McaResult(**values, sched_model=model.group(1) if model else "?")


def _explain_mca_error(stderr: str, asm: str, cpu: str) -> str:
    lines = asm.splitlines()
    match = re.search(r"<stdin>:(\d+):\d+: error: (.*)", stderr)
    if match:
        number = int(match.group(1))
        text = lines[number - 1].strip() if 0 < number <= len(lines) else "?"
        return f"llvm-mca -mcpu={cpu} rejected line {number} `{text}`: {match.group(2)}"
    note = re.search(r"note: instruction:\s*(.*)", stderr)
    first = stderr.strip().splitlines()[0] if stderr.strip() else "exit status != 0"
    return f"llvm-mca -mcpu={cpu}: {first}" + (f" (instruction `{note.group(1).strip()}`)" if note else "")


# ---------------------------------------------------------------- the loop

_LABEL = re.compile(r"^([.\w$]+):")


def _instruction(line: str, isa: str = "x86") -> str:
    """The line without its comment; '' for blank lines and comments."""
    return line.split(SYNTAXES[isa].comment, 1)[0].strip()


def _mnemonic(text: str) -> str:
    words = re.sub(r"^\{\w+\}\s*", "", text).split()
    return words[0] if words else ""


def _loops(lines: Sequence[str], isa: str = "x86") -> list[tuple[int, int, str]]:
    """(label line, back-branch line, label) for every backward branch."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    branch = SYNTAXES[isa].branch
    loops = []
    for i, line in enumerate(lines):
        match = branch.match(_instruction(line, isa))
        if match and labels.get(match.group(1), i + 1) <= i:
            loops.append((labels[match.group(1)], i, match.group(1)))
    return loops


def extract_kernel_loop(asm: str, mnemonic: str, isa: str = "x86") -> KernelLoop:
    """The innermost loop issuing ``mnemonic``; of several (peeled K blocks, remainders), the one
    issuing most of them, the first on a tie. ``isa``: the assembly's dialect (:data:`SYNTAXES`).

    Raises
    ------
    McaError
        No loop of the assembly contains ``mnemonic``.
    """
    lines = asm.splitlines()
    found = []
    for start, end, label in _loops(lines, isa):
        count = sum(_mnemonic(_instruction(line, isa)) == mnemonic for line in lines[start:end + 1])
        if count:
            found.append((start, end, label, count))
    inner = [a for a in found if not any(b is not a and a[0] <= b[0] and b[1] <= a[1] for b in found)]
    if not inner:
        raise McaError(f"no loop in the assembly issues {mnemonic}")
    start, end, label, count = max(inner, key=lambda item: (item[3], -item[0]))
    return KernelLoop(label, tuple(lines[start:end + 1]), count, start + 1, isa)


def mca_block(loop: KernelLoop) -> str:
    """The loop as llvm-mca input: its label and instructions; directives, other labels and comments
    dropped (LLVM 22's ``.loc``/``.p2align`` and the like mean nothing to a throughput model)."""
    kept = [f"{loop.label}:"]
    for line in loop.body[1:]:
        text = _instruction(line, loop.isa)
        if text and not _LABEL.match(text) and not text.startswith("."):
            kept.append(text)
    return "\n".join(kept) + "\n"


# ---------------------------------------------------------------- the ceiling

def ceiling_block(intrin: str) -> str:
    """A block of independent steps of ``intrin``'s assembly: as many accumulators as the encoding's
    registers allow (at most :data:`CEILING_MAX_ACCUMULATORS`), two A registers alternating, and
    temporaries alternating (renaming removes their false dependencies)."""
    spec = intrin_asm(intrin)
    operands = spec.operands()
    fixed = {"a": 2, "b": 1, "ones": 1, "tmp": 2}
    accs = min(CEILING_MAX_ACCUMULATORS, spec.registers - sum(fixed[o] for o in operands))
    base = {}
    reg = accs
    for name in operands:
        base[name] = reg
        reg += fixed[name]
    lines = []
    for i in range(accs):
        regs = {name: base[name] + (i % fixed[name]) for name in operands}
        lines += [step.format(r=spec.reg, acc=i, **regs) for step in spec.step]
    return "\n".join(lines) + "\n"


def ceiling(intrin: str, cpu: str, iterations: int = DEFAULT_ITERATIONS) -> float:
    """Most ``intrin`` instructions per cycle llvm-mca's ``cpu`` model sustains (cached per llvm-mca
    binary: ``LLVM_MCA`` may name another LLVM's, with other models)."""
    return _ceiling(intrin, cpu, iterations, _mca_binary())


@functools.lru_cache(maxsize=None)
def _ceiling(intrin: str, cpu: str, iterations: int, binary: str) -> float:
    block = ceiling_block(intrin)
    info = intrin_asm(intrin)
    per_block = sum(_mnemonic(line) == info.mnemonic for line in block.splitlines())
    return per_block / run_mca(block, cpu, iterations, info.isa, info.mattr).cycles_per_iteration


# ---------------------------------------------------------------- building the kernel

def _recipe(spec: TargetSpec, name: str | None) -> GemmRecipe:
    recipes = spec.recipes()
    if name is None:
        return recipes[0]
    for recipe in recipes:
        if recipe.intrin.name == name:
            return recipe
    raise ValueError(f"{spec.name} has no recipe {name!r}; it has {[r.intrin.name for r in recipes]}")


def spec_with(spec: TargetSpec, recipe: str | None = None, tile=None) -> tuple[TargetSpec, object]:
    """``(spec, b_signed)`` that make :meth:`GemmLayout.choose` take ``recipe`` (default: the row's
    first, the one 7-bit weights get) with ``tile`` (a :class:`Tile` or ``(mr, nr[, kblock])``) as a
    one-row table."""
    import numpy as np

    chosen = _recipe(spec, recipe)
    tiles = chosen.tiles if tile is None else (_as_tile(tile),)
    if chosen.intrin.weight_pair_bound is None:
        return dataclasses.replace(spec, gemm=chosen.intrin, tiles=tiles, bounded=()), None
    return dataclasses.replace(spec, bounded=(GemmRecipe(chosen.intrin, tiles),)), np.zeros((2, 1), np.int8)


def _as_tile(tile) -> Tile:
    if isinstance(tile, Tile):
        return dataclasses.replace(tile, min_m=1)
    return Tile(1, *tile)


def _problem(m: int, n: int, k: int):
    from .kernels.qgemm import Epilogue, QGemmProblem

    return QGemmProblem(m, n, k, "uint8", Epilogue("requant", "uint8", zero_point=128))


def layout_for(spec: TargetSpec, m: int, n: int, k: int, tile=None, recipe: str | None = None):
    """The :class:`~tvm_lowprec.kernels.GemmLayout` :func:`build_asm` builds (the tile as clipped
    to the shape and fitted to N), without building anything."""
    from .kernels.qgemm import GemmLayout

    built_spec, b_signed = spec_with(spec, recipe, tile)
    return GemmLayout.choose(_problem(m, n, k), built_spec, b_signed)


def build_asm(spec: TargetSpec, m: int, n: int, k: int, tile=None, recipe: str | None = None):
    """``(layout, assembly)`` of the uint8 x int8 -> uint8 requantizing GEMM (the benchmark's
    ``QLinearMatMul``) as the library builds it for ``spec``."""
    import tvm

    from .kernels.qgemm import GemmLayout, build_qgemm
    from .schedule import schedule_func

    built_spec, b_signed = spec_with(spec, recipe, tile)
    problem = _problem(m, n, k)
    layout = GemmLayout.choose(problem, built_spec, b_signed)
    sch = schedule_func(build_qgemm(problem, layout), built_spec)
    lib = tvm.tirx.build(sch.mod, target=built_spec.tvm_target(1))
    return layout, lib.inspect_source("asm")


def mca_cpus(spec: TargetSpec) -> tuple[str, ...]:
    """The llvm-mca CPU models ``spec``'s row is predicted for (:attr:`TargetSpec.mca_cpus`)."""
    if not spec.mca_cpus:
        raise McaError(f"no llvm-mca CPU model listed for row {spec.row!r}: give its TargetSpec mca_cpus")
    return spec.mca_cpus


def sched_model_note(cpu: str, sched_model: str) -> str:
    """Whose scheduling model llvm-mca used for ``cpu`` (AArch64 models in :data:`ARM_SCHED_MODELS`):
    ``"own model"``, ``"Cortex-A57 model (none of its own)"``, or ``""`` where it is not known here."""
    owner = ARM_SCHED_MODELS.get(sched_model)
    if owner is None:
        return ""
    if owner == cpu:
        return "own model"
    return f"{owner.replace('cortex-', 'Cortex-').replace('a5', 'A5')} model (none of its own)"


def default_mca_cpu(spec: TargetSpec) -> str:
    """The CPU the code is compiled for when llvm-mca has it among the row's models (``native`` on
    this host: its own CPU), else the row's first model."""
    cpus = mca_cpus(spec)
    own = str(spec.llvm.get("mcpu", ""))
    return own if own in cpus else cpus[0]


def predict(spec: TargetSpec, m: int, n: int, k: int, tile=None, mca_cpu: str | None = None,
            recipe: str | None = None, iterations: int = DEFAULT_ITERATIONS, built=None) -> Prediction:
    """Predict the GEMM micro-kernel's fraction of peak with llvm-mca.

    Parameters
    ----------
    spec : TargetSpec
        A registered row (or ``native``, which stands for its row).
    m, n, k : int
        GEMM shape.
    tile : Tile or tuple, optional
        ``(mr, nr[, kblock])`` or a :class:`Tile` replacing the row's tile table; default: the table's.
    mca_cpu : str, optional
        llvm-mca CPU model; default :func:`default_mca_cpu`.
    recipe : str, optional
        Intrinsic row of one of the spec's recipes; default the first (the one 7-bit weights take).
    iterations : int
        llvm-mca ``-iterations``.
    built : (GemmLayout, str), optional
        :func:`build_asm`'s result for these arguments, to predict one build on several CPU models.

    Returns
    -------
    Prediction

    Examples
    --------
    >>> from tvm_lowprec.targets import registered_targets
    >>> p = predict(registered_targets()["x86-avx2"], 16, 3072, 768, mca_cpu="znver3")  # doctest: +SKIP
    >>> 0 < p.fraction <= 1  # doctest: +SKIP
    True
    """
    cpu = mca_cpu or default_mca_cpu(spec)
    layout, asm = built if built is not None else build_asm(spec, m, n, k, tile, recipe)
    info = intrin_asm(layout.intrin_row)
    loop = extract_kernel_loop(asm, info.mnemonic, info.isa)
    block = mca_block(loop)
    result = run_mca(block, cpu, iterations, info.isa, info.mattr)
    top = ceiling(layout.intrin_row, cpu, iterations)
    achieved = loop.intrinsics / result.cycles_per_iteration
    return Prediction(
        target=spec.row, intrin=layout.intrin_row, mca_cpu=cpu, sched_model=result.sched_model,
        shape=(m, n, k), tile=(layout.mr, layout.nr, layout.kblock),
        cycles_per_iteration=result.cycles_per_iteration, block_rthroughput=result.block_rthroughput,
        intrinsics_per_iteration=loop.intrinsics, ceiling_per_cycle=top, fraction=achieved / top,
        padding_efficiency=m * n * k / (layout.mp * layout.np_ * layout.kp), rows=layout.rows,
        stack_accesses=sum(bool(info.syntax.stack_store.search(line)) for line in block.splitlines()),
        loop=tuple(block.splitlines()),
        bytes_moved=layout.np_ * layout.kp * (2 if layout.b_storage == "int16" else 1) + m * k + m * n,
    )


__all__ = [
    "ARM_SCHED_MODELS", "AsmSyntax", "CEILING_MAX_ACCUMULATORS", "INTRIN_ASM", "IntrinAsm", "KernelLoop",
    "MCA_CPUS", "McaError", "McaResult", "Memory", "Prediction", "ROW_MEMORY", "SYNTAXES", "build_asm", "ceiling",
    "ceiling_block", "default_mca_cpu", "extract_kernel_loop", "find_llvm_mca", "intrin_asm", "layout_for", "mca_block",
    "mca_cpus", "mca_version", "predict", "run_mca", "sched_model_note", "spec_with",
]
