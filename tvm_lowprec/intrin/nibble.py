"""4-bit weight dot products: ``C[lanes] += sum_{h<2, j<4} A[h, j] * nibble(B[lanes, j], h)``.

The weights are unsigned 4-bit values (0..15; int4 weights arrive shifted by 8, their zero point
with them) packed two to a byte: byte ``B[l, j]`` holds ``k = j`` in its low nibble and ``k = 4 + j``
in its high one, so one vector load gives ``lanes x 8`` weights and two masks give two ``lanes x 4``
byte vectors, each in the ``[lane][4]`` order of a broadcast dot product. The activations are int8
(quantized per block on the fly). Weights in ``0..15`` are exact in the *unsigned* operand of both
x86 recipes, the activations in the signed one:

- ``vpdpbusd`` (VNNI): ``C = vpdpbusd(vpdpbusd(C, lo, a[0:4]), hi, a[4:8])``; no offset, no correction.
- ``vpmaddubsw`` + ``vpmaddwd`` by ones (AVX2, AVX-512BW): each int16 lane sums two products of at
  most ``15 * 128``, and the two halves' sums add to at most ``4 * 15 * 128 = 7680``: never saturates,
  whatever the activations (the 8-bit path cannot say that of full-range weights).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .._tvmscript import cheap_frame_inspection
from .dot import register


def nibble(byte, half):
    """The ``half``-th 4-bit value (0: low, 1: high) of a uint8 ``byte``, as uint8 (kernel and desc
    share this expression, so that tensorize sees the same computation)."""
    return tirx.bitwise_and(tirx.shift_right(byte, tirx.Cast("uint8", half * 4)), tirx.const(15, "uint8"))


def nibble_desc(lanes: int):
    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((2, 4), "int8", offset_factor=1),
        B: T.Buffer((lanes, 4), "uint8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2, 0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i, h, j in T.grid(lanes, 2, 4):
                with T.sblock("update"):
                    vi, vh, vj = T.axis.remap("SRR", [i, h, j])
                    C[vi] = C[vi] + T.cast(A[vh, vj], "int32") * T.cast(nibble(B[vi, vj], vh), "int32")

    return desc


def nibble_impl(lanes: int, product):
    """Load ``lanes * 4`` packed bytes, split the nibbles, broadcast each half's 4 activation bytes and
    ``C = product(C, lo, a_lo, hi, a_hi)`` (byte vectors: weights u8, activations s8)."""
    nbytes = lanes * 4

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((2, 4), "int8", offset_factor=1),
        B: T.Buffer((lanes, 4), "uint8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2, 0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            packed = B.vload([0, 0], dtype=f"uint8x{nbytes}")
            mask = T.broadcast(T.uint8(15), nbytes)
            lo = T.bitwise_and(packed, mask)
            hi = T.bitwise_and(T.shift_right(packed, T.broadcast(T.uint8(4), nbytes)), mask)
            a_lo = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0, 0], "int8x4"), dtype="int32"), lanes),
                                 dtype=f"int8x{nbytes}")
            a_hi = T.reinterpret(T.broadcast(T.reinterpret(A.vload([1, 0], "int8x4"), dtype="int32"), lanes),
                                 dtype=f"int8x{nbytes}")
            C[T.ramp(T.int32(0), 1, lanes)] = product(C.vload([0], dtype=f"int32x{lanes}"), lo, a_lo, hi, a_hi)

    return impl


def accumulate_twice(lanes: int, llvm_name: str):
    """An accumulating 4-way byte dot product (``vpdpbusd``; Arm's ``sdot``), once per half."""

    def product(c, lo, a_lo, hi, a_hi):
        c = tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, c, lo, a_lo)
        return tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, c, hi, a_hi)

    return product


def pmaddubsw_product(lanes: int, llvm_ubsw: str, llvm_wd: str):
    def product(c, lo, a_lo, hi, a_hi):
        pairs = (tirx.call_llvm_pure_intrin(f"int16x{lanes * 2}", llvm_ubsw, lo, a_lo)
                 + tirx.call_llvm_pure_intrin(f"int16x{lanes * 2}", llvm_ubsw, hi, a_hi))  # |sum| <= 7680
        ones = tirx.Broadcast(tirx.const(1, "int16"), lanes * 2)
        return c + tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_wd, pairs, ones)

    return product


def register_nibble(name: str, lanes: int, product) -> str:
    with cheap_frame_inspection():
        return register(name, nibble_desc(lanes), nibble_impl(lanes, product))
