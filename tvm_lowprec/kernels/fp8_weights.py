"""Float32 matmul with float8 weights kept as bytes: ``Y[m, n] = scale[n] * sum_k X[m, k] * w[k, n]``.

The weights stay one byte each in memory, packed at compile time into column panels (each step of
K reads the panel's codes contiguously, a whole task streams one contiguous block), and are widened
in registers by integer operations that vectorize. Two vectors of codes are interleaved byte by
byte, so one load of ``uint16`` words holds both: the code in a word's high byte already sits where
float16 wants its top byte, the low one is shifted up by 8.

- **e5m2** is float16 with its low mantissa byte cut off: ``word & 0xFF00`` (high code) and
  ``word << 8`` (low code) *are* the float16 values.
- **e4m3fn** shares float16's layout up to the exponent bias (7 against 15): with its code in the
  high byte, an arithmetic shift right by 1 keeps the sign in bit 15 and moves exponent and mantissa
  to bits 13..7; clearing bit 14 (the copy of the sign) and the low bits leaves the float16 of
  ``value * 2**-8``, exactly, for normals and subnormals alike (both formats mark subnormals by a
  zero exponent field, so e4m3fn's land on float16's). Its NaN codes (``0x7F``, ``0xFF``) would read
  as +-480 here, so the weight-only rewrite refuses them at compile time.

float16 -> float32 is then one ``vcvtph2ps`` (F16C, AVX-512F). The format's power of two
(:attr:`Fp8Decode.factor`) is folded into the per-column scale: scaling a float sum by a power of
two commutes with every rounding, so this costs nothing in accuracy (short of float32 underflow).

Why words (measured with llvm-mca znver3, GEMV inner loop): a GEMV is bound by the vector pipes, not
by memory; widening each vector from its own bytes (``vpmovsxbw``/``vpmovzxbw``, shift, mask) took
13410 cycles per 200 iterations for e4m3fn, 12217 for e5m2; from shared words 11912 and 8216.

This file builds the computation and packs the weights; the schedule is
:mod:`tvm_lowprec.schedule.fp8_weights`, the Relax rewrite :mod:`tvm_lowprec.quant.weight_fp8`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from ..intrin.semantics import CODEGEN_SEMANTICS

OP = "fp8_weights"  # the PrimFunc's ``lowprec.op``: what the schedule rule recognises
DECISION_ATTR = "lowprec.weight_only"  # the decision on the IR: the float8 format the kernel widens


def _u16(value: int):
    return tirx.const(value, "uint16")


def _e4m3fn_high(word):
    # arithmetic shift: the sign stays in bit 15 and is copied into bit 14, which is then cleared
    shifted = tirx.reinterpret("int16", word) >> tirx.const(1, "int16")
    return tirx.reinterpret("uint16", shifted) & _u16(0xBF80)


def _e4m3fn_low(word):
    return _e4m3fn_high(word << _u16(8))


def _e5m2_high(word):
    return word & _u16(0xFF00)


def _e5m2_low(word):
    return word << _u16(8)


@dataclass(frozen=True)
class Fp8Decode:
    """One float8 format widened through float16: ``bits[high](word)`` is the ``uint16`` bits of a
    float16 that, times ``factor``, is exactly the value of the word's low (``high`` 0) or high (1)
    code. ``nan_codes``: codes whose float16 reading is a number although the format's value is NaN;
    a weight holding one must be refused first."""

    name: str
    bits: tuple[Callable, Callable]
    factor: float
    nan_codes: tuple[int, ...] = ()

    def half(self, word, high: int):
        """float16 of a code of the ``uint16`` expression ``word``: ``value / factor``."""
        return tirx.reinterpret("float16", self.bits[high](word))

    def value(self, word, high: int):
        """float32 value of a code of ``word``, exactly (infinities and NaN: see ``nan_codes``)."""
        return self.half(word, high).astype("float32") * tirx.const(self.factor, "float32")


# why: e4m3fn bias 7, float16 bias 15: every exponent is 8 lower (2**-8); e5m2 has float16's exponent,
# infinities and NaNs, so it needs no correction and refuses nothing
DECODES = {
    "float8_e4m3fn": Fp8Decode("float8_e4m3fn", (_e4m3fn_low, _e4m3fn_high), 256.0, nan_codes=(0x7F, 0xFF)),
    "float8_e5m2": Fp8Decode("float8_e5m2", (_e5m2_low, _e5m2_high), 1.0),
}


@dataclass(frozen=True)
class Fp8Tile:
    """A register tile for one vector width (the row's ``GemmIntrin.vector_bits``), chosen by M:
    ``mr`` rows x ``nr`` float32 vectors of accumulators. ``registers``: the vector register file
    the tile must fit, with one broadcast row and the widened weight vectors that stay live: ``nr``
    when several rows reuse them, two in flight for a single row (each is used once, right away)."""

    vector_bits: int
    registers: int
    min_m: int
    mr: int
    nr: int
    why: str = ""

    def __post_init__(self):
        live_weights = self.nr if self.mr > 1 else 2
        if self.mr * self.nr + live_weights + 1 > self.registers:
            raise ValueError(f"{self}: {self.mr}x{self.nr} accumulators + {live_weights} weights + 1 broadcast "
                             f"do not fit {self.registers} registers")


# Measured on Zen 3 (AVX2, one thread, tiles swept at 16x4096x1024 and 1x4096x4096): the GEMV is
# bound by the vector pipes, not by memory (the same GB/s of fp8 weights from L2 as from DRAM, 12-13
# per core before the word layout); nr = 4, 8 or 12 all reach that bound. For M > 1 each widened
# vector feeds mr FMAs, and 6x2 (the BLIS AVX2 shape) beat 4x2, 4x3, 3x4, 2x4 and 8x1.
# Last matching row wins (IREE-style); a width with no rows declines (the matmul stays float).
FP8_TILES = (
    Fp8Tile(256, 16, 1, mr=1, nr=8, why="GEMV: 8 accumulators, weights streamed once per task"),
    Fp8Tile(256, 16, 2, mr=2, nr=4, why="two rows share each widened vector: 8 + 4 + 1 = 13 ymm"),
    Fp8Tile(256, 16, 6, mr=6, nr=2, why="12 accumulators + 2 weights + broadcast = 15 of 16 ymm, no spill"),
    Fp8Tile(512, 32, 1, mr=1, nr=8, why="GEMV: 8 zmm accumulators (untimed: no AVX-512 host here)"),
    Fp8Tile(512, 32, 2, mr=2, nr=8, why="16 accumulators + 8 weights + broadcast = 25 of 32 zmm"),
    Fp8Tile(512, 32, 6, mr=6, nr=4, why="24 accumulators + 4 weights + broadcast = 29 of 32 zmm"),
)


def tile_for(vector_bits: int, m: int) -> Fp8Tile | None:
    """The last row for this vector width whose ``min_m`` is at most ``m``; None when none fits."""
    chosen = None
    for row in FP8_TILES:
        if row.vector_bits == vector_bits and row.min_m <= m:
            chosen = row
    return chosen


def _even_split(total: int, most: int) -> int:
    """The smallest block size that keeps the ``ceil(total / most)`` blocks of size ``most``: the
    same number of tiles with the least padding (M = 7 with 6-row tiles: two of 4, not two of 6)."""
    return -(-total // -(-total // most))


class ColumnPanels:
    """Sizes shared by the float GEMMs whose weights are packed in column panels (float8 here,
    :mod:`.fp32_gemm`, :mod:`.bf16_gemm`): a panel of ``nr`` vectors of ``lanes`` columns, M padded to
    whole row tiles of ``mr``, N to whole panels. Mixed into frozen dataclasses with those fields."""

    m: int
    n: int
    lanes: int
    mr: int
    nr: int

    @property
    def panel(self) -> int:
        return self.nr * self.lanes

    @property
    def mp(self) -> int:
        return -(-self.m // self.mr) * self.mr

    @property
    def np_(self) -> int:
        return -(-self.n // self.panel) * self.panel


@dataclass(frozen=True)
class Fp8Layout(ColumnPanels):
    """The decision, stored on the PrimFunc: ``lanes`` float32 lanes per vector, a register tile of
    ``mr`` rows x ``nr`` vectors (``panel = nr * lanes`` columns; ``nr`` even: vectors come in pairs
    that share their words), padded sizes ``mp``, ``np_`` (padding columns hold weight 0; padding rows
    re-read the last row and are not stored), ``k_unroll`` steps of K per unrolled loop body."""

    fmt: str
    m: int
    n: int
    k: int
    lanes: int
    mr: int
    nr: int
    k_unroll: int

    def __post_init__(self):
        if self.fmt not in DECODES:
            raise ValueError(f"no float8 decode for {self.fmt!r} (have {sorted(DECODES)})")
        if min(self.m, self.n, self.k, self.lanes, self.mr, self.nr, self.k_unroll) < 1 or self.k % self.k_unroll:
            raise ValueError(f"bad float8 weight layout {self}")
        if self.nr % 2:
            raise ValueError(f"float8 weight layout {self}: vectors come in pairs, nr must be even")


    @property
    def packed_shape(self) -> tuple[int, int, int]:
        """``uint16`` words: ``[N / panel, K, panel / 2]``, each holding the codes of two columns."""
        return (self.np_ // self.panel, self.k, self.panel // 2)

    def word_of(self, n):
        """(index into the packed words, 0 for the low byte or 1 for the high byte) of column ``n``:
        vector pair ``i`` of a panel shares ``lanes`` words, vector ``2i`` in their low bytes."""
        j = n % self.panel
        return (n // self.panel, j // (2 * self.lanes) * self.lanes + j % self.lanes), j // self.lanes % 2

    @staticmethod
    def choose(fmt: str, m: int, n: int, k: int, vector_bits: int) -> Fp8Layout | None:
        """The tile for M (:data:`FP8_TILES`), shrunk to pad M and N least; None for a width without rows."""
        tile = tile_for(vector_bits, m)
        if tile is None:
            return None
        lanes = vector_bits // 32
        mr = _even_split(m, min(tile.mr, m))
        nr = _even_split(-(-n // lanes), tile.nr)
        nr += nr % 2  # vectors come in pairs: one load of words feeds two
        k_unroll = next(u for u in (4, 2, 1) if k % u == 0 and u * mr * nr <= 32)
        return Fp8Layout(fmt, m, n, k, lanes, mr, nr, k_unroll)

    def attrs(self) -> dict:
        return {"lowprec.op": OP, "op_pattern": 8, DECISION_ATTR: self.fmt, "lowprec.shape": [self.m, self.n, self.k],
                "lowprec.tile": [self.mr, self.nr], "lowprec.vector": self.lanes, "lowprec.k_unroll": self.k_unroll}


def pack_fp8_weights(w_bytes: np.ndarray, layout: Fp8Layout) -> np.ndarray:
    """``w_bytes[K, N]`` (uint8 float8 codes) -> :attr:`Fp8Layout.packed_shape` words (one byte per
    weight still: in memory each panel's step of K is its ``panel`` codes, pairs of vectors
    interleaved byte by byte), zero codes in the padding."""
    k, n = w_bytes.shape
    lay = layout
    padded = np.zeros((k, lay.np_), np.uint16)
    padded[:, :n] = w_bytes
    pairs = padded.reshape(k, lay.np_ // lay.panel, lay.nr // 2, 2, lay.lanes)
    words = pairs[:, :, :, 0, :] | pairs[:, :, :, 1, :] << 8
    return np.ascontiguousarray(words.reshape(k, lay.np_ // lay.panel, lay.panel // 2).transpose(1, 0, 2))


def column_scale(scale: np.ndarray, layout: Fp8Layout) -> np.ndarray:
    """The per-column scale the kernel multiplies by (the format's factor folded in), padded to ``np_``."""
    s = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (layout.n,)).astype(np.float64)
    out = np.zeros((layout.np_,), np.float32)
    out[: layout.n] = (s * DECODES[layout.fmt].factor).astype(np.float32)  # a power of two: exact
    return out


def build_fp8_weights(layout: Fp8Layout, name: str = "fp8_weights"):
    """The unscheduled PrimFunc ``(X[M, K] float32, Wp uint16, scale[Np] float32) -> Y[M, N] float32``."""
    lay, dec = layout, DECODES[layout.fmt]
    X = te.placeholder((lay.m, lay.k), "float32", name="X")
    Wp = te.placeholder(lay.packed_shape, "uint16", name="W_packed")
    scale = te.placeholder((lay.np_,), "float32", name="scale")
    k = te.reduce_axis((0, lay.k), name="k")

    def x_at(m):
        return X[tirx.min(m, lay.m - 1) if lay.mp != lay.m else m, k]

    def product(m, n):
        (panel, word), high = lay.word_of(n)
        w = Wp[panel, k, word]
        half = tirx.Select(high == 0, dec.half(w, 0), dec.half(w, 1))  # high: one per vector, folded
        return te.sum(x_at(m) * half.astype("float32"), axis=k)

    acc = te.compute((lay.mp, lay.np_), product, name="fp8_gemm")
    out = te.compute((lay.m, lay.n), lambda m, n: acc[m, n] * scale[n], name="fp8_epilogue")
    func = te.create_prim_func([X, Wp, scale, out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs())


# LLVM intrinsic -> semantics, for the AVX-512 builds of this kernel (part of emulation.known_semantics())
EMULATION = {name: CODEGEN_SEMANTICS[name] for name in ("llvm.x86.avx512.mask.vcvtph2ps.512",)}
