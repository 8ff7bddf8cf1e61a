"""4-bit weight dot products: ``C[lanes] += sum_{h<2, j<4} A[h, j] * nibble(B[lanes, j], h)``.

The weights are unsigned 4-bit values (0..15; int4 weights arrive shifted by 8, their zero point
with them) packed two to a byte: byte ``B[l, j]`` holds ``k = j`` in its low nibble and ``k = 4 + j``
in its high one, so one vector load gives ``lanes x 8`` weights and two masks give two ``lanes x 4``
byte vectors, each in the ``[lane][4]`` order of a broadcast dot product. The activations are int8
(quantized per block on the fly). Weights in ``0..15`` are exact in the *unsigned* operand of both
x86 recipes, the activations in the signed one:

- ``vpdpbusd`` (VNNI): ``C = vpdpbusd(vpdpbusd(C, lo, a[0:4]), hi, a[4:8])``; no offset, no correction.
- ``vpmaddubsw`` + ``vpmaddwd`` by ones (AVX2, AVX-512BW): each int16 lane sums two products of at
  most ``15 * 128``; a call sums the halves of up to 4 groups (32 k) in int16 before its one
  ``vpmaddwd``: at most ``16 * 15 * 128 = 30720``, so never saturates, whatever the activations (the
  8-bit path cannot say that of full-range weights).

An intrinsic takes ``groups`` consecutive groups of 8 weights (1, 2 or 4): the kernel uses the most
that divide its block, so one ``vpmaddwd`` serves up to 32 k.
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


def nibble_desc(lanes: int, groups: int):
    if groups == 1:  # no unit loop: tensorize matches the kernel's lane loop, the group fixed outside
        return _one_group_desc(lanes)

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((groups, 2, 4), "int8", offset_factor=1),
        B: T.Buffer((groups, lanes, 4), "uint8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:groups, 0:2, 0:4], B[0:groups, 0:lanes, 0:4])
            T.writes(C[0:lanes])
            for g, i, h, j in T.grid(groups, lanes, 2, 4):
                with T.sblock("update"):  # block vars in the kernel block's order: lanes, then the reduction
                    vi, vg, vh, vj = T.axis.remap("SRRR", [i, g, h, j])
                    C[vi] = C[vi] + T.cast(A[vg, vh, vj], "int32") * T.cast(nibble(B[vg, vi, vj], vh), "int32")

    return desc


def _one_group_desc(lanes: int):
    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((1, 2, 4), "int8", offset_factor=1),
        B: T.Buffer((1, lanes, 4), "uint8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:1, 0:2, 0:4], B[0:1, 0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i, h, j in T.grid(lanes, 2, 4):
                with T.sblock("update"):
                    vi, vh, vj = T.axis.remap("SRR", [i, h, j])
                    C[vi] = C[vi] + T.cast(A[0, vh, vj], "int32") * T.cast(nibble(B[0, vi, vj], vh), "int32")

    return desc


def _halves(A, B, lanes: int, groups: int):
    """Per group and half: (the weights' byte vector, the 4 activation bytes broadcast to every lane)."""
    nbytes = lanes * 4
    mask = T.broadcast(T.uint8(15), nbytes)
    out = []
    for g in range(groups):
        packed = B.vload([g, 0, 0], dtype=f"uint8x{nbytes}")
        halves = (T.bitwise_and(packed, mask), T.bitwise_and(T.shift_right(packed, T.broadcast(T.uint8(4), nbytes)), mask))
        for h, w in enumerate(halves):
            a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([g, h, 0], "int8x4"), dtype="int32"), lanes),
                              dtype=f"int8x{nbytes}")
            out.append((w, a))
    return out


def nibble_impl(lanes: int, groups: int, product):
    """Load ``groups`` vectors of ``lanes * 4`` packed bytes, split the nibbles, broadcast each half's 4
    activation bytes and ``C = product(C, [(w, a), ...])`` (byte vectors: weights u8, activations s8)."""

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((groups, 2, 4), "int8", offset_factor=1),
        B: T.Buffer((groups, lanes, 4), "uint8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:groups, 0:2, 0:4], B[0:groups, 0:lanes, 0:4])
            T.writes(C[0:lanes])
            C[T.ramp(T.int32(0), 1, lanes)] = product(C.vload([0], dtype=f"int32x{lanes}"), _halves(A, B, lanes, groups))

    return impl


def accumulate_twice(lanes: int, llvm_name: str):
    """An accumulating 4-way byte dot product (``vpdpbusd``; Arm's ``sdot``), once per half."""

    def product(c, halves):
        for w, a in halves:
            c = tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, c, w, a)
        return c

    return product


def pmaddubsw_product(lanes: int, llvm_ubsw: str, llvm_wd: str):
    """The halves' ``vpmaddubsw`` pair sums added in int16 (at most ``2 * GROUPS * 2 * 15 * 128 =
    30720`` in magnitude: exact), then one ``vpmaddwd`` by ones into the int32 lanes."""

    def product(c, halves):
        pairs = [tirx.call_llvm_pure_intrin(f"int16x{lanes * 2}", llvm_ubsw, w, a) for w, a in halves]
        total = pairs[0]
        for p in pairs[1:]:
            total = total + p
        ones = tirx.Broadcast(tirx.const(1, "int16"), lanes * 2)
        return c + tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_wd, total, ones)

    return product


# groups of 8 weights per call: up to 4, so that vpmaddubsw's int16 sums stay exact (see above)
GROUPS = (1, 2, 4)


def register_nibble(name: str, lanes: int, product) -> dict:
    """One intrinsic per group count: ``{groups: registered name}``."""
    with cheap_frame_inspection():
        return {g: register(f"{name}_{lanes}x{8 * g}", nibble_desc(lanes, g), nibble_impl(lanes, g, product))
                for g in GROUPS}
