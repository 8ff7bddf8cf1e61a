"""AArch64 dot-product intrinsics: desc/impl pairs, one per instruction and activation dtype.

Each computes ``C[4] += sum_k (A[k] + offset) * B[4, k]`` on one 128-bit vector of int32 accumulators,
with the activation bytes broadcast to every lane (the same shape as the x86 rows, so the kernels,
packing and schedules are shared):

- ``smull`` + ``sadalp`` (Armv8.0 Neon, every AArch64 core): two s8 x s8 products per lane widened
  to int16 (``|p| <= 128 * 128``, never saturating), pairs added into the int32 lanes. kstep 2.
- ``sdot`` (Armv8.2 dot product): four s8 x s8 products per lane, accumulated in int32. kstep 4.
- ``usdot`` (Armv8.6 i8mm): four u8 x s8 products per lane: ONNX's u8 activations as they are. kstep 4.
- ``usmmla`` (Armv8.6 i8mm): a matrix instruction, ``C[2, 2] += A[2, 8] . B[2, 8]^T`` in u8 x s8: twice
  ``usdot``'s products per instruction. Two activation rows per instruction (``GemmIntrin.rows``), so
  its kernel keeps the accumulators in 2 x 2 blocks (:mod:`tvm_lowprec.kernels.qgemm`).

The signed-only instructions take u8 activations with their sign bit flipped (``a ^ 0x80``, which
as s8 is ``a - 128``): the described computation is ``(A - 128) * B`` and the kernel adds
``128 * colsum(B)`` back through its column correction (``offset = -128``), exact and free, as the
VNNI rows do in the other direction for s8 activations on the u8-only ``vpdpbusd`` (and ``usdot``).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .._tvmscript import cheap_frame_inspection
from ..hwspec import AOperand, GemmIntrin, NibbleIntrin
from ..isa import IntrinAsm
from .dot import broadcast_impl, dot_desc, register
from .nibble import accumulate_twice, register_nibble

LANES = 4  # int32 lanes of a 128-bit Neon vector
MMLA_ROWS, MMLA_K = 2, 8  # usmmla: a 2 x 8 by 8 x 2 product into 2 x 2 int32


def _dot(llvm_name: str):
    def product(a, b, c):
        return tirx.call_llvm_pure_intrin(f"int32x{LANES}", llvm_name, c, a, b)

    return product


def _smull_sadalp(a, b, c):
    """Eight s8 x s8 products widened to int16 (exact), adjacent pairs added into the int32 lanes:
    LLVM selects ``smull`` and folds the pairwise add-long and the accumulate into ``sadalp``."""
    products = tirx.call_llvm_pure_intrin("int16x8", "llvm.aarch64.neon.smull.v8i16", a, b)
    return c + tirx.call_llvm_pure_intrin(f"int32x{LANES}", "llvm.aarch64.neon.saddlp.v4i32.v8i16", products)


def _row(name: str, kstep: int, product, signed_only: bool, features: tuple[str, ...], asm: IntrinAsm) -> GemmIntrin:
    """A row whose instruction takes s8 activations (``signed_only``: u8 ones are flipped, offset
    -128) or u8 ones (s8 ones are flipped, offset +128)."""
    operands = {}
    for a_dtype in ("uint8", "int8"):
        flip = (a_dtype == "uint8") == signed_only
        offset = (-128 if signed_only else 128) if flip else 0
        impl = broadcast_impl(LANES, kstep, a_dtype, flip, "int8" if signed_only else "uint8", product)
        iname = register(f"lowprec_{name}_{a_dtype}_{LANES}x{kstep}", dot_desc(LANES, kstep, a_dtype, offset), impl)
        operands[a_dtype] = AOperand(storage=a_dtype, offset=offset, intrin=iname)
    return GemmIntrin(name, LANES, kstep, LANES * 32, operands, features=features, lane_product=product,
                      lane_a_bytes="int8" if signed_only else "uint8", asm=asm)


def _mmla_desc(a_dtype: str, offset: int):
    """``C[2, 2] += sum_k (A[2, k] + offset) * B[2, k]`` for k < 8: two activation rows against two
    weight columns (each ``B`` row is one output column's 8 weights)."""

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((MMLA_ROWS, MMLA_K), a_dtype, offset_factor=1),
        B: T.Buffer((MMLA_ROWS, MMLA_K), "int8", offset_factor=1),
        C: T.Buffer((MMLA_ROWS, MMLA_ROWS), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            for i, j, k in T.grid(MMLA_ROWS, MMLA_ROWS, MMLA_K):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + (T.cast(A[vi, vk], "int32") + offset) * T.cast(B[vj, vk], "int32")

    return desc


def _mmla_impl(a_dtype: str, flip: bool, llvm_name: str):
    """The two activation rows (a row stride apart in ``A``) as one 16-byte vector, sign-flipped to u8
    when ``flip``; the 2 x 8 weight block and the 2 x 2 accumulator block are contiguous (packing)."""

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        A = T.match_buffer(a, (MMLA_ROWS, MMLA_K), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (MMLA_ROWS, MMLA_K), "int8", offset_factor=1)
        C = T.match_buffer(c, (MMLA_ROWS, MMLA_ROWS), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            rows = T.reinterpret(T.Shuffle([A.vload([0, 0], f"{a_dtype}x8"), A.vload([1, 0], f"{a_dtype}x8")],
                                           list(range(16))), dtype="uint8x16")
            a16 = T.bitwise_xor(rows, T.broadcast(T.uint8(0x80), 16)) if flip else rows
            C[0, T.ramp(T.int32(0), 1, 4)] = T.call_llvm_pure_intrin(
                "int32x4", llvm_name, C.vload([0, 0], dtype="int32x4"), a16, B.vload([0, 0], dtype="int8x16")
            )

    return impl


def _mmla_row(name: str, llvm_name: str, features: tuple[str, ...], asm: IntrinAsm) -> GemmIntrin:
    """``usmmla``: u8 activations natively, s8 ones sign-flipped to u8 (offset +128)."""
    operands = {}
    for a_dtype in ("uint8", "int8"):
        flip = a_dtype == "int8"
        offset = 128 if flip else 0
        iname = register(f"lowprec_{name}_{a_dtype}_{MMLA_ROWS}x{MMLA_ROWS}x{MMLA_K}", _mmla_desc(a_dtype, offset),
                          _mmla_impl(a_dtype, flip, llvm_name))
        operands[a_dtype] = AOperand(storage=a_dtype, offset=offset, intrin=iname)
    return GemmIntrin(name, MMLA_ROWS, MMLA_K, 128, operands, features=features, rows=MMLA_ROWS, asm=asm)


with cheap_frame_inspection():
    # each accumulator's update in assembly: one 128-bit vector of 4 int32 accumulators, A broadcast, B
    # loaded; smull: 8 s8 x s8 products into int16 (4 lanes x kstep 2), pairs added into int32 by sadalp
    SMULL = _row("smull_v16", 2, _smull_sadalp, signed_only=True, features=("neon",),
                 asm=IntrinAsm("smull", ("smull {r}{tmp}.8h, {r}{a}.8b, {r}{b}.8b", "sadalp {r}{acc}.4s, {r}{tmp}.8h"),
                               "v", 32, "aarch64"))
    SDOT = _row("sdot_v16", 4, _dot("llvm.aarch64.neon.sdot.v4i32.v16i8"), signed_only=True,
                features=("neon", "dotprod"),
                asm=IntrinAsm("sdot", ("sdot {r}{acc}.4s, {r}{a}.16b, {r}{b}.16b",), "v", 32, "aarch64", ("+dotprod",)))
    USDOT = _row("usdot_v16", 4, _dot("llvm.aarch64.neon.usdot.v4i32.v16i8"), signed_only=False,
                 features=("neon", "dotprod", "i8mm"),
                 asm=IntrinAsm("usdot", ("usdot {r}{acc}.4s, {r}{a}.16b, {r}{b}.16b",), "v", 32, "aarch64", ("+i8mm",)))
    # a matrix instruction: a 2 x 2 int32 block from two 2 x 8 byte operands (twice usdot's products)
    USMMLA = _mmla_row("usmmla_v16", "llvm.aarch64.neon.usmmla.v4i32.v16i8", features=("neon", "dotprod", "i8mm"),
                       asm=IntrinAsm("usmmla", ("usmmla {r}{acc}.4s, {r}{a}.16b, {r}{b}.16b",), "v", 32, "aarch64",
                                     ("+i8mm",)))

ARM_INTRINSICS = {row.name: row for row in (SMULL, SDOT, USDOT, USMMLA)}

# 4-bit weights (:mod:`.nibble`): values 0..15 are s8 values, so sdot takes them in either operand
# and the int8 activations in the other, exact (four products of at most 15 * 128 per lane).
NIBBLE_SDOT = NibbleIntrin("sdot_v16", LANES, register_nibble(
    "lowprec_sdot_v16_u4", LANES, accumulate_twice(LANES, "llvm.aarch64.neon.sdot.v4i32.v16i8")),
    LANES * 32, ("neon", "dotprod"))
