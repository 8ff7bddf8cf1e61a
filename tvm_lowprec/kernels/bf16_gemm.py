"""Float matmul on bf16 pairs (``vdpbf16ps``): ``Y[m, n] = scale[n] * sum_k bf16(X[m, k]) * W[k, n]``.

For rows whose spec has a bf16 recipe (:attr:`tvm_lowprec.hwspec.TargetSpec.bf16`), with constant
weights ``W`` that are bf16 values: float8 weights (e4m3fn, e5m2: every code is a bf16 value, bf16
having 8 exponent and 7 mantissa bits; :func:`float8_to_bf16`) and the weights of a PTQ layer given
``QuantSpec("bfloat16")`` (rounded to bf16 at compile time: :func:`round_to_bf16`).

The arithmetic, exactly (what ``tests/test_bf16.py`` reproduces bit for bit in numpy):

1. each activation is rounded to bf16 once (the ``bf16_round`` stage, a pass over each row before the
   GEMM), as ``vcvtneps2bf16`` defines it: round to nearest even, a denormal to a zero of its sign,
   NaN kept NaN (:func:`bf16_round_bits`, integer operations any x86 CPU runs);
2. per output, one float32 accumulator from 0, over the K pairs in order (``K`` odd: the last pair's
   second element is a bf16 zero in both operands): the odd product then the even product, each an
   FMA with ``vdpbf16ps``'s rounding (:class:`~tvm_lowprec.intrin.semantics.Bf16DotSemantics`);
3. the epilogue: ``float32(acc * scale[n])``, one rounding.

Against the float32 path (:mod:`.fp8_weights`: exact float32 products, FMA-summed) the only
difference is step 1: each product is off by the activation's rounding, at most 2**-9 relative (see
docs/numerics.md for the measured figure). The weights are exact in both paths.

Layout: weights packed at compile time as ``uint16`` bf16 bits ``[N / panel, ceil(K / 2), nr, lanes, 2]``:
each step of K is one contiguous ``panel`` of pairs (a pair per float32 lane, the instruction's
operand layout), a whole task streams one contiguous block. Two bytes a weight (the float32 path keeps
float8 codes, one byte): widening float8 to bf16 in registers would make subnormal codes bf16
denormals, which the instruction reads as zero. Activations: ``[M, ceil(K / 2), 2]`` bf16 bits, a
pair per 32-bit word, broadcast to every lane.

The schedule is :mod:`tvm_lowprec.schedule.bf16_gemm`; the instruction :mod:`tvm_lowprec.intrin.x86_bf16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from ..intrin.x86_bf16 import bf16_value
from .fp8_weights import DECISION_ATTR, ColumnPanels, _even_split

OP = "bf16_gemm"  # the PrimFunc's ``lowprec.op``: what the schedule rule recognises
SOURCES = ("float8_e4m3fn", "float8_e5m2", "bfloat16")  # what the weights were: the decision's value


# ------------------------------------------------------------------------------ bf16 values, in numpy


def round_to_bf16(x) -> np.ndarray:
    """float32 -> bf16 bits (``uint16``) as ``vcvtneps2bf16`` converts: round to nearest even, a zero or
    denormal to a zero of its sign, infinities kept, NaN quieted (bit 6 set)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    exponent, magnitude = bits & 0x7F800000, bits & 0x7FFFFFFF
    rne = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = np.where(exponent == 0, (bits >> 16) & 0x8000, np.where(magnitude > 0x7F800000, (bits >> 16) | 0x40, rne))
    return out.astype(np.uint16)


def bf16_to_float32(bits) -> np.ndarray:
    """bf16 bits -> their float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def float8_to_bf16(codes, fmt: str) -> np.ndarray:
    """float8 codes (``uint8``) -> the bf16 bits of the same values, exactly (subnormal codes become
    normal bf16 values; e5m2's infinities and NaNs stay; e4m3fn's NaN codes become a bf16 NaN)."""
    from ..quant.float8 import FORMATS

    f = FORMATS[fmt]
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    e, m = (code >> f.mbits) & ((1 << f.ebits) - 1), code & ((1 << f.mbits) - 1)
    values = sign * np.where(e == 0, m * 2.0 ** (1 - f.bias - f.mbits), (1 + m / 2.0**f.mbits) * 2.0 ** (e - f.bias))
    top = (1 << f.ebits) - 1
    if f.has_inf:  # e5m2: IEEE infinities and NaNs in the top exponent
        values = np.where(e == top, np.where(m == 0, sign * np.inf, np.nan), values)
    else:  # e4m3fn: only the all-ones code is NaN
        values = np.where((e == top) & (m == (1 << f.mbits) - 1), np.nan, values)
    table = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: <= 3 mantissa bits
    return table[np.asarray(codes, np.uint8)]


# ------------------------------------------------------------------------------ the kernel


def bf16_round_bits(x):
    """A float32 expression rounded to bf16, as :func:`round_to_bf16` (the ``uint16`` bits)."""
    u32 = "uint32"

    def c(value):
        return tirx.const(value, u32)

    bits = tirx.reinterpret(u32, x)
    high = bits >> c(16)
    rne = (bits + c(0x7FFF) + (high & c(1))) >> c(16)
    nan = tirx.Select((bits & c(0x7FFFFFFF)) > c(0x7F800000), high | c(0x40), rne)
    out = tirx.Select((bits & c(0x7F800000)) == c(0), high & c(0x8000), nan)
    return out.astype("uint16")


@dataclass(frozen=True)
class Bf16Layout(ColumnPanels):
    """The decision, stored on the PrimFunc: ``source`` (what the weights were, :data:`SOURCES`), the
    recipe's tensor intrinsic, ``lanes`` float32 lanes per vector, a register tile of ``mr`` rows x
    ``nr`` vectors (``panel = nr * lanes`` columns), padded sizes ``mp``, ``np_`` (padding columns hold
    weight 0; padding rows re-read the last row and are not stored), ``k2 = ceil(K / 2)`` pairs."""

    source: str
    intrin: str
    m: int
    n: int
    k: int
    lanes: int
    mr: int
    nr: int

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"bf16 GEMM weights must be one of {SOURCES}, not {self.source!r}")
        if min(self.m, self.n, self.k, self.lanes, self.mr, self.nr) < 1:
            raise ValueError(f"bad bf16 GEMM layout {self}")

    @property
    def k2(self) -> int:
        return -(-self.k // 2)

    @property
    def packed_shape(self) -> tuple[int, ...]:
        return (self.np_ // self.panel, self.k2, self.nr, self.lanes, 2)

    @staticmethod
    def choose(source: str, m: int, n: int, k: int, recipe) -> Bf16Layout:
        """The recipe's tile for M (:meth:`~tvm_lowprec.hwspec.GemmRecipe.tile_for`), shrunk to pad M and N least."""
        tile, lanes = recipe.tile_for(m), recipe.intrin.lanes
        mr = _even_split(m, min(tile.mr, m))
        nr = _even_split(-(-n // lanes), tile.nr)
        return Bf16Layout(source, recipe.intrin.intrin, m, n, k, lanes, mr, nr)

    def attrs(self) -> dict:
        return {"lowprec.op": OP, "op_pattern": 8, DECISION_ATTR: self.source, "lowprec.intrin": self.intrin,
                "lowprec.shape": [self.m, self.n, self.k], "lowprec.tile": [self.mr, self.nr], "lowprec.vector": self.lanes}


def pack_bf16_weights(w_bits: np.ndarray, layout: Bf16Layout) -> np.ndarray:
    """``w_bits[K, N]`` (bf16 bits) -> :attr:`Bf16Layout.packed_shape`, zeros in the padding (columns
    beyond N, and the second element of the last pair when K is odd)."""
    k, n = w_bits.shape
    lay = layout
    padded = np.zeros((2 * lay.k2, lay.np_), np.uint16)
    padded[:k, :n] = w_bits
    pairs = padded.reshape(lay.k2, 2, lay.np_ // lay.panel, lay.nr, lay.lanes)
    return np.ascontiguousarray(pairs.transpose(2, 0, 3, 4, 1))


def column_scale(scale, layout: Bf16Layout) -> np.ndarray:
    """The per-column scale (per tensor: broadcast), padded with zeros to ``np_``."""
    out = np.zeros((layout.np_,), np.float32)
    out[: layout.n] = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (layout.n,))
    return out


def build_bf16_gemm(layout: Bf16Layout, name: str = "bf16_gemm"):
    """The unscheduled PrimFunc ``(X[M, K] float32, W_packed uint16, scale[Np] float32) -> Y[M, N] float32``."""
    lay = layout
    X = te.placeholder((lay.m, lay.k), "float32", name="X")
    Wp = te.placeholder(lay.packed_shape, "uint16", name="W_packed")
    scale = te.placeholder((lay.np_,), "float32", name="scale")

    def rounded(i, j, t):
        k = 2 * j + t
        if lay.k % 2 == 0:
            return bf16_round_bits(X[i, k])
        return tirx.Select(k < lay.k, bf16_round_bits(X[i, tirx.min(k, lay.k - 1)]), tirx.const(0, "uint16"))

    xb = te.compute((lay.m, lay.k2, 2), rounded, name="bf16_round")
    kb, t = te.reduce_axis((0, lay.k2), name="kb"), te.reduce_axis((0, 2), name="t")

    def product(m, n):
        row = tirx.min(m, lay.m - 1) if lay.mp != lay.m else m
        w = Wp[n // lay.panel, kb, n % lay.panel // lay.lanes, n % lay.lanes, t]
        return te.sum(bf16_value(xb[row, kb, t]) * bf16_value(w), axis=[kb, t])

    acc = te.compute((lay.mp, lay.np_), product, name="bf16_gemm")
    out = te.compute((lay.m, lay.n), lambda m, n: acc[m, n] * scale[n], name="bf16_epilogue")
    func = te.create_prim_func([X, Wp, scale, out])
    return func.with_attr("global_symbol", name).with_attrs(lay.attrs())
