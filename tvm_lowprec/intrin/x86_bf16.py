"""x86 bf16 pair dot product: ``vdpbf16ps`` (AVX512_BF16), the float GEMM of :mod:`tvm_lowprec.kernels.bf16_gemm`.

``C[lanes] f32 += A[1] * B[lanes, 1] + A[0] * B[lanes, 0]`` on bf16 values: one pair of activations
(a 32-bit word) broadcast to every lane against ``lanes`` pairs of weights, one pair per 32-bit
lane. The desc states the products on the ``uint16`` bits (:func:`bf16_value`); the instruction's
own rounding (two FMAs, the odd pair first, denormals read as zero and results flushed) is what
:class:`~tvm_lowprec.intrin.semantics.Bf16DotSemantics` says and the emulated builds run.

**Why an imported LLVM function, not ``call_llvm_pure_intrin``.** LLVM 17 and later type the
intrinsic's operands ``<32 x bfloat>``, and TVM 0.27 cannot make such a value: its lowering turns
every ``bfloat16`` expression into float32 (``BF16ComputeLegalize``, which promotes a call's
arguments too) and its LLVM codegen has no ``bfloat`` type (a ``bfloat16x32`` reinterpret crashes
it). So the impl calls ``lowprec_dpbf16ps_<bits>`` on ``<32 x i16>`` words, a four-line LLVM IR
function that bitcasts them and calls the intrinsic; the schedule rule attaches that IR to the
kernel with TVM's ``pragma_import_llvm`` (codegen links it into the module as ``available_externally``
and ``alwaysinline``), so the built kernel calls ``@llvm.x86.avx512bf16.dpbf16ps.512`` directly:
the IR that emulation rewrites and the assembly (``vdpbf16ps``, the activation pair broadcast by
``vbroadcastss``) are what a C compiler makes of ``_mm512_dpbf16_ps``.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .._tvmscript import cheap_frame_inspection
from ..hwspec import Bf16Intrin
from .dot import register
from .semantics import Bf16DotSemantics

IMPORT_PRAGMA = "pragma_import_llvm"  # the loop annotation TVM's LLVM codegen links LLVM IR from


def bf16_value(bits):
    """The float32 value of bf16 ``bits`` (a ``uint16`` expression): the bits in a float32's top half."""
    return tirx.reinterpret("float32", tirx.Cast("uint32", bits) << tirx.const(16, "uint32"))


def _helper(name: str, lanes: int, llvm_name: str) -> str:
    """LLVM IR of ``name(acc, a, b)``: the intrinsic on ``<2*lanes x i16>`` words read as bf16."""
    n2, v = 2 * lanes, f"<{lanes} x float>"
    words, bf = f"<{n2} x i16>", f"<{n2} x bfloat>"
    return "\n".join([
        f"define {v} @{name}({v} %acc, {words} %a, {words} %b) {{",
        f"  %ab = bitcast {words} %a to {bf}",
        f"  %bb = bitcast {words} %b to {bf}",
        f"  %r = call {v} @{llvm_name}({v} %acc, {bf} %ab, {bf} %bb)",
        f"  ret {v} %r",
        "}",
        f"declare {v} @{llvm_name}({v}, {bf}, {bf})",
        ""])


def _desc(lanes: int):
    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((2,), "uint16", offset_factor=1),
        B: T.Buffer((lanes, 2), "uint16", offset_factor=1),
        C: T.Buffer((lanes,), "float32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + bf16_value(A[vk]) * bf16_value(B[vi, vk])

    return desc


def _impl(lanes: int, helper: str):
    """The activation pair as one 32-bit word broadcast to every lane, the ``lanes`` weight pairs as one
    contiguous vector: the instruction's third operand, which may be memory, so a weight vector that
    one row uses (GEMV) is read by the instruction itself (the 1x8 tile's K loop: 32 ``vdpbf16ps``
    with a memory operand, no vector load; with the weights as the second operand it had 32 loads)."""
    n2 = 2 * lanes

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((2,), "uint16", offset_factor=1),
        B: T.Buffer((lanes, 2), "uint16", offset_factor=1),
        C: T.Buffer((lanes,), "float32", offset_factor=1),
    ):
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="uint32")
            a_b = T.reinterpret(T.broadcast(pair, lanes), dtype=f"uint16x{n2}")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_pure_extern(
                f"float32x{lanes}", helper, C.vload([0], dtype=f"float32x{lanes}"), a_b, B.vload([0, 0], dtype=f"uint16x{n2}"))

    return impl


def _vdpbf16ps_row(name: str, lanes: int, registers: int, features: tuple[str, ...]) -> Bf16Intrin:
    llvm_name = f"llvm.x86.avx512bf16.dpbf16ps.{lanes * 32}"
    helper = f"lowprec_dpbf16ps_{lanes * 32}"
    iname = register(f"lowprec_{name}_bf16_{lanes}x2", _desc(lanes), _impl(lanes, helper))
    return Bf16Intrin(name, lanes, lanes * 32, registers, iname, _helper(helper, lanes, llvm_name), features,
                      {llvm_name: Bf16DotSemantics(lanes)})


with cheap_frame_inspection():
    # 512-bit only: the 256-bit form needs AVX512VL as well, and every CPU with AVX512_BF16 has zmm
    VDPBF16PS_512 = _vdpbf16ps_row("vdpbf16ps_zmm", 16, 32, ("avx512f", "avx512bf16"))

X86_BF16_INTRINSICS = {row.name: row for row in (VDPBF16PS_512,)}
