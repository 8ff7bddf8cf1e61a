"""x86 dot-product intrinsics: desc/impl pairs made by factories, one pair per operand shape.

- ``vpdpbusd`` (AVX-512 VNNI, 512-bit; AVX-VNNI or AVX-512VL VNNI, 256-bit): ``C[lanes] += A[4]u8 . B[lanes,4]s8``.
  The s8-activation variant flips the sign bit of the broadcast activation (``a ^ 0x80 == a + 128``
  as u8), so the described computation is ``(A + 128) * B`` and the kernel subtracts
  ``128 * colsum(B)`` in its epilogue: exact, no extra pass over A.
- ``vpmaddwd`` (AVX2 / AVX-512BW without VNNI): ``C[lanes] += A[2]i16 . B[lanes,2]s8``. Operands are
  widened to int16 first, so products never saturate (``pmaddubsw``, the usual fallback, saturates
  u8 x s8 pair sums to int16 and gives wrong results for full-range weights).
- ``vpmaddubsw`` + ``vpmaddwd`` by ones: only for constant weights proven not to saturate (each pair's
  positive and negative parts within 128); the row says so in ``weight_pair_bound`` and declines others.

TVM's own ``dot_16x4_vnni`` passes ``int32x16`` operands, which the LLVM 22 inside the 0.27 wheel
rejects; these impls pass byte vectors, as the intrinsic now expects.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .._tvmscript import cheap_frame_inspection
from ..hwspec import AOperand, GemmIntrin
from ..isa import IntrinAsm
from .dot import broadcast_impl, dot_desc, register
from .semantics import DotSemantics


def _vpdpbusd(lanes: int, llvm_name: str):
    def product(a, b, c):
        return tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, c, a, b)

    return product


def _pmaddubsw(lanes: int, llvm_ubsw: str, llvm_wd: str):
    """u8 x s8 byte pairs summed in int16 (exact within the row's weight bound), then pairs to int32."""

    def product(a, b, c):
        pairs = tirx.call_llvm_pure_intrin(f"int16x{lanes * 2}", llvm_ubsw, a, b)
        ones = tirx.Broadcast(tirx.const(1, "int16"), lanes * 2)
        return c + tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_wd, pairs, ones)

    return product


def _int16_pairs_impl(lanes: int, b_dtype: str, combine):
    """Two int16 activations broadcast to every lane against ``[lanes, 2]`` weights (int8 widened here,
    or int16 as packed): ``C = combine(C, a, b)`` on the int16 vectors."""
    kstep, n16 = 2, lanes * 2
    wide = b_dtype == "int16"

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((kstep,), "int16", offset_factor=1),
        B: T.Buffer((lanes, kstep), b_dtype, offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:kstep], B[0:lanes, 0:kstep])
            T.writes(C[0:lanes])
            a2 = T.reinterpret(A.vload([0], "int16x2"), dtype="int32")
            a_b = T.reinterpret(T.broadcast(a2, lanes), dtype=f"int16x{n16}")
            b16 = B.vload([0, 0], dtype=f"int16x{n16}") if wide else T.cast(B.vload([0, 0], dtype=f"int8x{n16}"), f"int16x{n16}")
            C[T.ramp(T.int32(0), 1, lanes)] = combine(C.vload([0], dtype=f"int32x{lanes}"), a_b, b16)

    return impl


def _pmaddwd_impl(lanes: int, llvm_name: str, b_dtype: str):
    """``vpmaddwd``, then ``vpaddd`` into the accumulator."""
    return _int16_pairs_impl(lanes, b_dtype, lambda c, a, b: c + tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, a, b))


# The instructions' documented semantics (Intel SDM), for emulated execution on hosts without them.
def _vpdpbusd_semantics(lanes: int) -> DotSemantics:
    """VPDPBUSD: each int32 lane += four u8 x s8 products, wrapping (the non-saturating form)."""
    return DotSemantics(lanes, 4, 8, 32, a_ext="zext", b_ext="sext", accumulate=True)


def _pmaddwd_semantics(lanes: int) -> DotSemantics:
    """VPMADDWD: each int32 lane = two s16 x s16 products summed (wraps only for 4 x -32768)."""
    return DotSemantics(lanes, 2, 16, 32, a_ext="sext", b_ext="sext")


def _pmaddubsw_semantics(lanes16: int) -> DotSemantics:
    """VPMADDUBSW: each int16 lane = two u8 x s8 products summed, saturated to int16."""
    return DotSemantics(lanes16, 2, 8, 16, a_ext="zext", b_ext="sext", saturate=True)


# How each row's accumulator update reads in AT&T assembly (tvm_lowprec.isa.IntrinAsm): vpdpbusd
# accumulates in place; vpmaddwd needs a temporary and a vpaddd; vpmaddubsw also a ones vector
_VNNI_STEP = ("vpdpbusd %{r}{b}, %{r}{a}, %{r}{acc}",)
_MADDWD_STEP = ("vpmaddwd %{r}{b}, %{r}{a}, %{r}{tmp}", "vpaddd %{r}{tmp}, %{r}{acc}, %{r}{acc}")
_UBSW_STEP = ("vpmaddubsw %{r}{b}, %{r}{a}, %{r}{tmp}", "vpmaddwd %{r}{ones}, %{r}{tmp}, %{r}{tmp}",
              "vpaddd %{r}{tmp}, %{r}{acc}, %{r}{acc}")


def _vnni_row(name: str, lanes: int, llvm_name: str, features: tuple[str, ...], asm: IntrinAsm) -> GemmIntrin:
    operands = {}
    for a_dtype, offset in (("uint8", 0), ("int8", 128)):
        iname = f"lowprec_{name}_{a_dtype}_{lanes}x4"
        impl = broadcast_impl(lanes, 4, a_dtype, a_dtype == "int8", "uint8", _vpdpbusd(lanes, llvm_name))
        register(iname, dot_desc(lanes, 4, a_dtype, offset), impl)
        operands[a_dtype] = AOperand(storage=a_dtype, offset=offset, intrin=iname)
    return GemmIntrin(name, lanes, 4, lanes * 32, operands, features=features, asm=asm,
                      emulation={llvm_name: _vpdpbusd_semantics(lanes)}, lane_product=_vpdpbusd(lanes, llvm_name))


def _int16_row(name: str, lanes: int, llvm_name: str, features: tuple[str, ...], impl, semantics,
               asm: IntrinAsm | None = None) -> GemmIntrin:
    """An int16-pair instruction's row: ``impl(lanes, llvm_name, b_dtype)`` for int8 weights (widened
    in the loop) and for int16 ones (widened at pack time)."""
    names = {}
    for b_dtype, suffix in (("int8", ""), ("int16", "_wideb")):
        names[b_dtype] = register(
            f"lowprec_{name}_int16{suffix}_{lanes}x2",
            dot_desc(lanes, 2, "int16", 0, b_dtype),
            impl(lanes, llvm_name, b_dtype),
        )
    # both activation dtypes are widened to int16 by the kernel's prepare step: no offset needed
    operand = AOperand(storage="int16", offset=0, intrin=names["int8"], intrin_wide_b=names["int16"])
    return GemmIntrin(name, lanes, 2, lanes * 32, {"uint8": operand, "int8": operand}, features=features,
                      emulation={llvm_name: semantics(lanes)}, asm=asm)


def _pmaddwd_row(name: str, lanes: int, llvm_name: str, features: tuple[str, ...]) -> GemmIntrin:
    reg = {16: "zmm", 8: "ymm"}[lanes]
    asm = IntrinAsm("vpmaddwd", _MADDWD_STEP, reg, 32 if reg == "zmm" else 16)
    return _int16_row(name, lanes, llvm_name, features, _pmaddwd_impl, _pmaddwd_semantics, asm)


def _pmaddubsw_row(name: str, lanes: int, llvm_ubsw: str, llvm_wd: str, features: tuple[str, ...]) -> GemmIntrin:
    operands = {}
    for a_dtype, offset in (("uint8", 0), ("int8", 128)):
        iname = f"lowprec_{name}_{a_dtype}_{lanes}x4"
        impl = broadcast_impl(lanes, 4, a_dtype, a_dtype == "int8", "uint8", _pmaddubsw(lanes, llvm_ubsw, llvm_wd))
        register(iname, dot_desc(lanes, 4, a_dtype, offset), impl)
        operands[a_dtype] = AOperand(storage=a_dtype, offset=offset, intrin=iname)
    emulation = {llvm_ubsw: _pmaddubsw_semantics(lanes * 2), llvm_wd: _pmaddwd_semantics(lanes)}
    reg = {16: "zmm", 8: "ymm"}[lanes]
    return GemmIntrin(name, lanes, 4, lanes * 32, operands, features=features, weight_pair_bound=128,
                      emulation=emulation, asm=IntrinAsm("vpmaddubsw", _UBSW_STEP, reg, 32 if reg == "zmm" else 16))


# TVMScript parses 24 prim_funcs here: without the cheap frame inspection that costs seconds.
with cheap_frame_inspection():
    # One row per instruction shape. Names are what TargetSpec rows and Compiled.kernels() show.
    VNNI_512 = _vnni_row("vpdpbusd_zmm", 16, "llvm.x86.avx512.vpdpbusd.512", ("avx512f", "avx512bw", "avx512vnni"),
                         IntrinAsm("vpdpbusd", _VNNI_STEP, "zmm", 32))
    # 256-bit vpdpbusd: LLVM selects the VEX (AVX-VNNI) encoding when AVX-512VL is absent.
    VNNI_256 = _vnni_row("vpdpbusd_ymm", 8, "llvm.x86.avx512.vpdpbusd.256", ("avx2", "avxvnni"),
                         IntrinAsm("vpdpbusd", tuple("{{vex}} " + s for s in _VNNI_STEP), "ymm", 16))
    # the same instruction EVEX-encoded (AVX-512 VL): the narrow-GEMM recipe of the AVX-512 VNNI row
    VNNI_256_VL = _vnni_row("vpdpbusd_ymm_vl", 8, "llvm.x86.avx512.vpdpbusd.256", ("avx512vl", "avx512vnni"),
                            IntrinAsm("vpdpbusd", _VNNI_STEP, "ymm", 32))
    PMADDWD_512 = _pmaddwd_row("vpmaddwd_zmm", 16, "llvm.x86.avx512.pmaddw.d.512", ("avx512f", "avx512bw"))
    PMADDWD_256 = _pmaddwd_row("vpmaddwd_ymm", 8, "llvm.x86.avx2.pmadd.wd", ("avx2",))

    # vpmaddubsw sums two u8 x s8 products in int16: twice vpmaddwd's density, exact only for weights
    # whose pairs stay within 128 (7-bit weights always do: ONNX Runtime's reduce_range=True).
    PMADDUBSW_512 = _pmaddubsw_row(
        "vpmaddubsw_zmm", 16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512", ("avx512f", "avx512bw")
    )
    PMADDUBSW_256 = _pmaddubsw_row("vpmaddubsw_ymm", 8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", ("avx2",))

X86_INTRINSICS = {
    row.name: row for row in (VNNI_512, VNNI_256, VNNI_256_VL, PMADDWD_512, PMADDWD_256, PMADDUBSW_512, PMADDUBSW_256)
}


# ---------------------------------------------------------------------------------------------
# int16 x int8 with the accumulation fused: ``vpdpwssd`` (AVX-512 VNNI): ``C[lanes] += A[2]i16 .
# B[lanes,2]`` in one instruction (``vpmaddwd`` + ``vpaddd`` otherwise), wrapping as ``vpmaddwd`` does
# (only 4 x -32768 pairs overflow; 8-bit weights never do). The int16 GEMM
# (:mod:`tvm_lowprec.kernels.qgemm16`) of the AVX-512 VNNI row uses it; the desc is the ``vpmaddwd``
# rows' own. Not in :data:`X86_INTRINSICS` (the 8-bit GEMMs' rows). No 256-bit row: LLVM splits a ymm
# ``vpdpwssd`` into ``vpmaddwd`` + ``vpaddd`` for the AVX-VNNI (Alder Lake-class) cores.


def _vpdpwssd_impl(lanes: int, llvm_name: str, b_dtype: str):
    """``vpdpwssd``: the products and the accumulation in one instruction."""
    return _int16_pairs_impl(lanes, b_dtype, lambda c, a, b: tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, c, a, b))


def _vpdpwssd_semantics(lanes: int) -> DotSemantics:
    """VPDPWSSD: each int32 lane += two s16 x s16 products, wrapping (the non-saturating form)."""
    return DotSemantics(lanes, 2, 16, 32, a_ext="sext", b_ext="sext", accumulate=True)


def _vpdpwssd_row(name: str, lanes: int, llvm_name: str, features: tuple[str, ...]) -> GemmIntrin:
    return _int16_row(name, lanes, llvm_name, features, _vpdpwssd_impl, _vpdpwssd_semantics)


with cheap_frame_inspection():
    VPDPWSSD_512 = _vpdpwssd_row("vpdpwssd_zmm", 16, "llvm.x86.avx512.vpdpwssd.512", ("avx512f", "avx512bw", "avx512vnni"))

X86_INT16_INTRINSICS = {row.name: row for row in (VPDPWSSD_512,)}
