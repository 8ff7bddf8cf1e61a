"""256-entry byte table lookups, ``lanes`` bytes at a time: the kernel of a float chain of one 8-bit
tensor folded into a table (:mod:`tvm_lowprec.quant.lookup_tables`, :mod:`tvm_lowprec.kernels.lookup`).

Every instruction here permutes bytes of registers by a byte index; the table is packed at compile
time into the layout the instruction reads (:meth:`~tvm_lowprec.hwspec.LookupIntrin.pack`):

* ``vpermi2b`` (AVX-512 VBMI) looks up 128 entries held in two zmm registers by the low 7 bits of
  each index; two of them cover the 256 entries and the index's top bit picks one (``vpmovb2m`` +
  a masked move): 64 lanes in 2 permutes.
* ``vpshufb`` (AVX2 ymm, AVX-512BW zmm) looks up 16 entries within each 128-bit lane by the low
  nibble of each index. Each 16-entry slice ``j`` of the table is replicated to every 128-bit lane and
  looked up by ``idx & 15``; a binary tree of 15 byte blends on the index's high nibble picks the
  slice's result, bit 4 first (``vpblendvb`` tests each byte's sign: bits 4-6 are moved there by a
  16-bit shift, 3 in all): 35 instructions per 32/64 lanes. The first form, an OR of the 16 slices
  each masked by a saturating add (``sub``, ``adds``, ``pshufb``, ``or``: 64), ran 1.3-1.6x slower
  (Zen 3, one thread: 102400 bytes 29-36 -> 18-22 us, 1.8 MB 487-493 -> 373-387 us).
* ``tbl``/``tbx`` (AArch64 Neon) look up 64 entries in four q registers; ``tbx`` leaves lanes whose
  index is out of range unchanged, so a ``tbl`` of entries 0-63 and three ``tbx`` of the indices
  minus 64, 128, 192 cover the table: 16 lanes in 4 lookups and 3 subtractions.

No desc/impl pair: TVM's tensorize cannot match a load whose index is another load (the comparator
does not map the inner buffer's offset), so the kernel writes each row's vector expression itself
(:func:`vector_lookup`) and its scalar tail as the loop ``Y[i] = T[slot(X[i])]``. Each row declares
the semantics of the x86 intrinsics it calls, so the rows run emulated where the host lacks them
(:mod:`.semantics`).

Measured on the Zen 5 host, 1x240x240x32 uint8, one thread: ``vpermi2b`` 0.040 ms (92 GB/s read +
written), ``vpshufb`` ymm 0.23 ms, TVM's scalar ``take`` 0.45 ms; ``vpshufb`` zmm 0.071 ms at 2 threads.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..hwspec import LookupIntrin
from .semantics import BytePermuteSemantics, ByteShuffleSemantics


def code_of(x, in_dtype: str):
    """The table index of an 8-bit value: its bits read as uint8, as int32 (int8 -128 is code 128)."""
    bits = T.reinterpret("uint8", x) if in_dtype == "int8" else x
    return T.Cast("int32", bits)


def vector_lookup(intrin, X, Tab, in_dtype: str, out_dtype: str, start):
    """The ``lanes`` looked-up values of ``X[start : start + lanes]``, as one vector expression."""
    lanes = intrin.lanes
    idx = X.vload([start], f"{in_dtype}x{lanes}")
    idx = T.reinterpret(idx, dtype=f"uint8x{lanes}") if in_dtype != "uint8" else idx

    def load(offset, n):
        row = Tab.vload([offset], f"{out_dtype}x{n}")
        return T.reinterpret(row, dtype=f"uint8x{n}") if out_dtype != "uint8" else row

    out = intrin.emit(load, idx)
    return T.reinterpret(out, dtype=f"{out_dtype}x{lanes}") if out_dtype != "uint8" else out


def _splat(value: int, lanes: int):
    return tirx.Broadcast(tirx.const(value, "uint8"), lanes)


def _vpermi2b(lanes: int):
    llvm = "llvm.x86.avx512.vpermi2var.qi.512"

    def emit(load, idx):
        def half(base):  # entries base .. base+127, by the index's low 7 bits
            return tirx.call_llvm_pure_intrin(f"uint8x{lanes}", llvm, load(base, lanes), idx, load(base + lanes, lanes))

        return tirx.Select(idx >= _splat(128, lanes), half(128), half(0))

    return emit, {llvm: BytePermuteSemantics(lanes)}


def _vpshufb(lanes: int, llvm: str):
    def emit(load, idx):
        low = idx & _splat(0x0F, lanes)
        level = [tirx.call_llvm_pure_intrin(f"uint8x{lanes}", llvm, load(lanes * j, lanes), low) for j in range(16)]
        for bit in (4, 5, 6, 7):  # a binary tree of blends on the index's high nibble, lowest bit first
            level = [tirx.Select(_bit_set(idx, bit, lanes), level[2 * k + 1], level[2 * k]) for k in range(len(level) // 2)]
        return level[0]

    return emit, {llvm: ByteShuffleSemantics(lanes)}


def _bit_set(idx, bit: int, lanes: int):
    """Lanes whose index has ``bit`` set, as the sign of each byte (what ``vpblendvb`` tests): the index
    shifted left by ``7 - bit`` in 16-bit lanes (each byte's top bit comes from its own bits)."""
    moved = idx
    if bit < 7:
        wide = T.reinterpret(idx, dtype=f"uint16x{lanes // 2}")
        moved = T.reinterpret(wide << tirx.Broadcast(tirx.const(7 - bit, "uint16"), lanes // 2), dtype=f"uint8x{lanes}")
    return T.reinterpret(moved, dtype=f"int8x{lanes}") < tirx.Broadcast(tirx.const(0, "int8"), lanes)


def _tbl(lanes: int):
    def emit(load, idx):
        def quarter(q):
            return [load(64 * q + 16 * r, lanes) for r in range(4)]

        out = tirx.call_llvm_pure_intrin(f"uint8x{lanes}", "llvm.aarch64.neon.tbl4", *quarter(0), idx)
        for q in (1, 2, 3):  # out-of-range lanes (the other quarters' indices) keep what they have
            out = tirx.call_llvm_pure_intrin(f"uint8x{lanes}", "llvm.aarch64.neon.tbx4", out, *quarter(q),
                                             idx - _splat(64 * q, lanes))
        return out

    return emit, {}  # AArch64: the real instructions run under qemu-aarch64


def _row(name: str, lanes: int, replicate: int, features: tuple[str, ...], min_ops: int, made, asm: str,
         why: str) -> LookupIntrin:
    emit, emulation = made
    return LookupIntrin(name, lanes, replicate, emit, features, min_ops, emulation, why, asm)


VPERMI2B_ZMM = _row("vpermi2b_zmm", 64, 1, ("avx512f", "avx512bw", "avx512vbmi"), 2, _vpermi2b(64), r"vperm[it]2b\s+[^\n]*%zmm",
                    "2 permutes + a masked move per 64 bytes: fewer instructions than any chain's float arithmetic")
VPSHUFB_ZMM = _row("vpshufb_zmm", 64, 4, ("avx512f", "avx512bw"), 3, _vpshufb(64, "llvm.x86.avx512.pshuf.b.512"),
                   r"vpshufb\s+[^\n]*%zmm",
                   "16 slices + 15 blends + 4 index operations per 64 bytes, about what a lone requantization's "
                   "float arithmetic takes (an instruction count, not timed): from 3 operators the lookup has fewer")
VPSHUFB_YMM = _row("vpshufb_ymm", 32, 2, ("avx2",), 3, _vpshufb(32, "llvm.x86.avx2.pshuf.b"), r"vpshufb\s+[^\n]*%ymm",
                   "16 slices + 15 blends + 4 index operations per 32 bytes, about what a lone requantization's "
                   "float arithmetic takes (an instruction count, not timed): from 3 operators the lookup has fewer")
TBL_V16 = _row("tbl_v16", 16, 1, ("neon",), 3, _tbl(16), r"tbl\s+v\d+\.16b",
               "4 table lookups + 3 subtractions per 16 bytes")
