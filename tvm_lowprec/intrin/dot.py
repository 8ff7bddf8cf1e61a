"""What every broadcast dot-product intrinsic shares: its desc, the broadcast impl and registration.

A broadcast dot product computes ``C[lanes] += sum_k (A[k] + offset) * B[lanes, k]`` for k < kstep:
``kstep`` activation bytes broadcast to every lane against one contiguous ``[lanes, kstep]`` weight
tile (``vpdpbusd``, ``vpmaddubsw``, ``sdot``, ``usdot``, ``smull`` + ``sadalp``). An instruction
that takes activations of the other signedness sees them with their sign bit flipped (``a ^ 0x80``:
``a + 128`` as u8, ``a - 128`` as s8), which the desc states as ``offset`` and the kernel's column
correction takes back.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T


def dot_desc(lanes: int, kstep: int, a_dtype: str, a_offset: int, b_dtype: str = "int8"):
    shifted = a_offset != 0

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((kstep,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, kstep), b_dtype, offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:kstep], B[0:lanes, 0:kstep])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, kstep):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + (
                        (T.cast(A[vk], "int32") + a_offset) if shifted else T.cast(A[vk], "int32")
                    ) * T.cast(B[vi, vk], "int32")

    return desc


def _flip_mask(kstep: int) -> int:
    """The sign bit of each of ``kstep`` packed bytes, as a signed ``8 * kstep``-bit constant."""
    bits = 8 * kstep
    mask = int.from_bytes(b"\x80" * kstep, "little")
    return mask - (1 << bits) if mask >= 1 << (bits - 1) else mask


def broadcast_impl(lanes: int, kstep: int, a_dtype: str, flip: bool, a_bytes: str, product):
    """Broadcast ``kstep`` activation bytes (sign-flipped when ``flip``) to all ``lanes``, load the
    ``lanes * kstep`` weight bytes, ``C = product(a, b_s8, C)`` with the activation bytes typed
    ``a_bytes`` (the instruction's own signedness)."""
    nbytes, word = lanes * kstep, f"int{8 * kstep}"

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((kstep,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, kstep), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:kstep], B[0:lanes, 0:kstep])
            T.writes(C[0:lanes])
            packed = T.reinterpret(A.vload([0], f"{a_dtype}x{kstep}"), dtype=word)
            a_b = T.broadcast(T.bitwise_xor(packed, tirx.const(_flip_mask(kstep), word)) if flip else packed, lanes)
            C[T.ramp(T.int32(0), 1, lanes)] = product(
                T.reinterpret(a_b, dtype=f"{a_bytes}x{nbytes}"),
                B.vload([0, 0], dtype=f"int8x{nbytes}"),
                C.vload([0], dtype=f"int32x{lanes}"),
            )

    return impl


def register(name, desc, impl):
    TensorIntrin.register(name, desc, impl, override=True)
    return name
