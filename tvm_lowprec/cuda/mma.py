"""PTX ``mma.sync`` forms as data: one frozen row per instruction shape and operand types.

A row says what the instruction computes (``m x n x k``, operand and accumulator dtypes), how PTX
spells it, and the oldest SM architecture that has it. Code that emits an mma asks this table
(:func:`require_mma`) instead of branching on the architecture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import LowPrecError


class UnsupportedMmaError(LowPrecError, ValueError):
    """An mma form asked for on an SM architecture that lacks it (names both)."""


# PTX type suffix of each TVM dtype an mma operand may have.
_PTX_TYPE = {
    "int8": "s8",
    "uint8": "u8",
    "int4": "s4",
    "uint4": "u4",
    "int32": "s32",
    "float32": "f32",
    "float16": "f16",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
}

_BITS = {"int8": 8, "uint8": 8, "int4": 4, "uint4": 4, "float8_e4m3fn": 8, "float8_e5m2": 8, "float16": 16}


@dataclass(frozen=True)
class MmaForm:
    """One ``mma.sync.aligned`` instruction form (A row-major, B column-major)."""

    name: str
    m: int
    n: int
    k: int
    a_dtype: str
    b_dtype: str
    c_dtype: str
    min_sm: int  # the oldest SM architecture (as 80, 89, 90) whose PTX ISA has this form

    def __post_init__(self):
        for dtype in (self.a_dtype, self.b_dtype, self.c_dtype):
            if dtype not in _PTX_TYPE:
                raise ValueError(f"{self.name}: no PTX type for dtype {dtype!r}")
        bits = _BITS.get(self.a_dtype, 0)
        # every m16n8kK form reads 256 bits of A per row: K * bits == 256
        if (self.m, self.n) != (16, 8) or self.k * bits != 256:
            raise ValueError(f"{self.name}: m{self.m}n{self.n}k{self.k} is not a 256-bit-row form")
        if self.min_sm < 80:
            raise ValueError(f"{self.name}: min_sm {self.min_sm} is below sm_80")

    @property
    def shape(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}"

    @property
    def ptx(self) -> str:
        """The PTX instruction, as it appears in the PTX text (``.row.col``, D and C of c_dtype)."""
        c, a, b = (_PTX_TYPE[d] for d in (self.c_dtype, self.a_dtype, self.b_dtype))
        return f"mma.sync.aligned.{self.shape}.row.col.{c}.{a}.{b}.{c}"


MMA_FORMS: tuple[MmaForm, ...] = (
    # Ampere integer tensor cores: 8-bit operands, 32 of K per instruction
    MmaForm("s8s8s32_m16n8k32", 16, 8, 32, "int8", "int8", "int32", 80),
    MmaForm("u8s8s32_m16n8k32", 16, 8, 32, "uint8", "int8", "int32", 80),
    # 4-bit operands: twice the K per instruction (dropped again on sm_100's tcgen05, still in PTX)
    MmaForm("s4s4s32_m16n8k64", 16, 8, 64, "int4", "int4", "int32", 80),
    MmaForm("u4s4s32_m16n8k64", 16, 8, 64, "uint4", "int4", "int32", 80),
    # FP8 mma.sync came with Ada (sm_89); Hopper keeps it next to wgmma
    MmaForm("e4m3e4m3f32_m16n8k32", 16, 8, 32, "float8_e4m3fn", "float8_e4m3fn", "float32", 89),
    MmaForm("e5m2e5m2f32_m16n8k32", 16, 8, 32, "float8_e5m2", "float8_e5m2", "float32", 89),
)

MMA_BY_NAME = {form.name: form for form in MMA_FORMS}


def sm_number(arch) -> int:
    """``"sm_90"``, ``"sm_90a"``, ``"90"`` or ``90`` -> 90."""
    match = re.fullmatch(r"(?:sm_|compute_)?(\d+)[a-z]?", str(arch).strip())
    if not match:
        raise ValueError(f"not an SM architecture: {arch!r} (expected e.g. 'sm_80')")
    return int(match.group(1))


def find_mma(a_dtype: str, b_dtype: str, c_dtype: str) -> MmaForm:
    """The form with these operand dtypes (last matching row wins)."""
    found = [f for f in MMA_FORMS if (f.a_dtype, f.b_dtype, f.c_dtype) == (a_dtype, b_dtype, c_dtype)]
    if not found:
        raise UnsupportedMmaError(f"no mma form for {a_dtype} x {b_dtype} -> {c_dtype}")
    return found[-1]


def require_mma(form, arch) -> MmaForm:
    """Return ``form`` (a row or its name) if ``arch`` has it, else raise :class:`UnsupportedMmaError`.

    Examples
    --------
    >>> require_mma("s8s8s32_m16n8k32", "sm_80").ptx
    'mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32'
    """
    if isinstance(form, str):
        if form not in MMA_BY_NAME:
            raise UnsupportedMmaError(f"unknown mma form {form!r}; known: {sorted(MMA_BY_NAME)}")
        form = MMA_BY_NAME[form]
    sm = sm_number(arch)
    if sm < form.min_sm:
        raise UnsupportedMmaError(
            f"mma form {form.name} ({form.ptx}) needs sm_{form.min_sm} or newer; "
            f"target architecture sm_{sm} lacks it"
        )
    return form


def forms_for(arch) -> tuple[MmaForm, ...]:
    """All forms that ``arch`` has."""
    sm = sm_number(arch)
    return tuple(f for f in MMA_FORMS if sm >= f.min_sm)


WARP = 32
MMA_M = MMA_N = 16  # one scheduled mma tile = two m16n8 instructions
MMA_K = 32  # 8-bit operands: 32 of K per instruction
VECTOR_BYTES = 16  # per-thread global->shared load width


@dataclass(frozen=True)
class GemmTiles:
    """Block tile (``block_m x block_n``, K step ``block_k``) of warp tiles (``warp_m x warp_n``).

    In a target row's table, ``min_m`` says from which M the row applies (later rows refine, as for
    the CPU tiles) and ``why`` gives its reason; neither takes part in comparisons.
    """

    block_m: int
    block_n: int
    block_k: int
    warp_m: int
    warp_n: int
    min_m: int = field(default=1, compare=False)
    why: str = field(default="", compare=False)

    def __post_init__(self):
        if self.warp_m % MMA_M or self.warp_n % MMA_N or self.block_k % MMA_K:
            raise ValueError(f"{self}: warp tile must be a multiple of 16x16 and block_k of 32")
        if self.block_m % self.warp_m or self.block_n % self.warp_n:
            raise ValueError(f"{self}: block tile must be a multiple of the warp tile")
        # each warp's lanes load 16 bytes per step: the A and B tiles must split evenly among them
        step = self.warps * WARP * VECTOR_BYTES
        if (self.block_m * self.block_k) % step or (self.block_n * self.block_k) % step:
            raise ValueError(f"{self}: A/B shared tiles are not a multiple of {step} bytes")

    @property
    def warps(self) -> int:
        return (self.block_m // self.warp_m) * (self.block_n // self.warp_n)

    def check_shape(self, m: int, n: int, k: int) -> None:
        for name, dim, tile in (("M", m, self.block_m), ("N", n, self.block_n), ("K", k, self.block_k)):
            if dim <= 0 or dim % tile:
                raise ValueError(f"{name}={dim} is not a positive multiple of {tile} (tiles {self}); pad it")
