"""What a target instruction computes, written as data and rendered as generic LLVM IR.

Emulated execution (:mod:`tvm_lowprec.emulation`) replaces every call of a target-specific LLVM
intrinsic by a function with the instruction's documented semantics in plain LLVM IR (extensions,
multiplies, shuffles, adds, compares), so a kernel built for a CPU this host lacks runs here with
the same integer results. Each intrinsic row declares the semantics of the LLVM intrinsics its impl
calls (:attr:`tvm_lowprec.hwspec.GemmIntrin.emulation`), next to the impl itself.

Only dot-product shapes are needed so far: ``out[i] = [acc[i] +] sum_{j < group} ext_a(a[g*i+j]) *
ext_b(b[g*i+j])``, computed in int32 with wrap-around (as the instructions do), optionally saturated
to the output width (``vpmaddubsw``'s int16 pair sums).
"""

from __future__ import annotations

from dataclasses import dataclass

_EXTENSIONS = ("zext", "sext")


@dataclass(frozen=True)
class DotSemantics:
    """A grouped dot product of two integer vectors.

    Attributes
    ----------
    lanes : int
        Output elements.
    group : int
        Products summed into each output element (the inputs have ``lanes * group`` elements).
    in_bits, out_bits : int
        Element widths of the two inputs and of the output.
    a_ext, b_ext : {"zext", "sext"}
        How each input's elements are widened (unsigned or signed).
    accumulate : bool
        The intrinsic's first operand is an accumulator of the output type, added with wrap-around.
    saturate : bool
        The int32 sums are clamped to the signed range of ``out_bits`` (else they must fit, or wrap).
    """

    lanes: int
    group: int
    in_bits: int
    out_bits: int
    a_ext: str
    b_ext: str
    accumulate: bool = False
    saturate: bool = False

    def __post_init__(self):
        if self.a_ext not in _EXTENSIONS or self.b_ext not in _EXTENSIONS:
            raise ValueError(f"extensions must be one of {_EXTENSIONS}: {self}")
        if self.in_bits not in (8, 16) or self.out_bits not in (16, 32):
            raise ValueError(f"unsupported widths {self.in_bits} -> {self.out_bits}")
        if self.saturate == (self.out_bits == 32):
            raise ValueError("saturation is to a narrower output only (int32 sums wrap, as the instructions do)")
        if self.accumulate and self.out_bits != 32:
            raise ValueError("only int32 accumulators are supported")

    @property
    def in_type(self) -> str:
        return f"<{self.lanes * self.group} x i{self.in_bits}>"

    @property
    def out_type(self) -> str:
        return f"<{self.lanes} x i{self.out_bits}>"

    def llvm_ir(self, name: str) -> str:
        """``define internal`` of a function ``@name`` with the intrinsic's signature."""
        wide = f"<{self.lanes * self.group} x i32>"
        acc = self.out_type
        params = ([f"{acc} %acc"] if self.accumulate else []) + [f"{self.in_type} %a", f"{self.in_type} %b"]
        body = [
            f"%ax = {self.a_ext} {self.in_type} %a to {wide}",
            f"%bx = {self.b_ext} {self.in_type} %b to {wide}",
            f"%p = mul {wide} %ax, %bx",
        ]
        total = None
        for j in range(self.group):  # the j-th product of every group, as one vector
            picks = ", ".join(f"i32 {self.group * i + j}" for i in range(self.lanes))
            body.append(f"%p{j} = shufflevector {wide} %p, {wide} poison, <{self.lanes} x i32> <{picks}>")
            if total is not None:
                body.append(f"%s{j} = add <{self.lanes} x i32> {total}, %p{j}")
            total = f"%s{j}" if total is not None else f"%p{j}"
        body += self._finish(total)
        return "\n".join([f"define internal {self.out_type} @{name}({', '.join(params)}) alwaysinline {{"]
                         + [f"  {line}" for line in body] + ["}", ""])

    def _finish(self, total: str) -> list[str]:
        v32 = f"<{self.lanes} x i32>"
        if self.accumulate:
            return [f"%r = add {v32} %acc, {total}", f"ret {v32} %r"]
        if not self.saturate:
            return [f"ret {v32} {total}"]
        hi, lo = 2 ** (self.out_bits - 1) - 1, -(2 ** (self.out_bits - 1))

        def splat(value):
            return f"splat (i32 {value})"

        return [
            f"%over = icmp sgt {v32} {total}, {splat(hi)}",
            f"%t = select <{self.lanes} x i1> %over, {v32} {splat(hi)}, {v32} {total}",
            f"%under = icmp slt {v32} %t, {splat(lo)}",
            f"%c = select <{self.lanes} x i1> %under, {v32} {splat(lo)}, {v32} %t",
            f"%r = trunc {v32} %c to {self.out_type}",
            f"ret {self.out_type} %r",
        ]


@dataclass(frozen=True)
class HalfToFloatSemantics:
    """What ``@llvm.x86.avx512.mask.vcvtph2ps.512`` computes, in generic LLVM IR: TVM's x86 codegen
    writes a float16 -> float32 cast of 16 lanes as that intrinsic when the target has AVX-512F
    (8 lanes stay a plain ``fpext``), so the float8-weight kernel's AVX-512 builds (:mod:`tvm_lowprec.kernels.fp8_weights`) call it. Given to
    :func:`tvm_lowprec.emulation.emulated_executable` it lets those builds run on a host without
    AVX-512 (the conversion is exact: the rounding operand does not matter)."""

    lanes: int = 16

    def llvm_ir(self, name: str) -> str:
        n = self.lanes
        return "\n".join([
            f"define internal <{n} x float> @{name}(<{n} x i16> %h, <{n} x float> %pass, i{n} %mask, i32 %rounding) alwaysinline {{",
            f"  %f = bitcast <{n} x i16> %h to <{n} x half>",
            f"  %x = fpext <{n} x half> %f to <{n} x float>",
            f"  %m = bitcast i{n} %mask to <{n} x i1>",
            f"  %r = select <{n} x i1> %m, <{n} x float> %x, <{n} x float> %pass",
            f"  ret <{n} x float> %r",
            "}", ""])


def _define(ret: str, name: str, params: str, body: list[str]) -> str:
    """An always-inlined LLVM IR function of the instruction lines ``body``."""
    return "\n".join([f"define internal {ret} @{name}({params}) alwaysinline {{"] + [f"  {line}" for line in body]
                     + ["}", ""])


@dataclass(frozen=True)
class BytePermuteSemantics:
    """``@llvm.x86.avx512.vpermi2var.qi.512(a, idx, b)`` (VPERMI2B/VPERMT2B, AVX-512 VBMI): lane ``i``
    of the result is byte ``idx[i] & 127`` of the 128-byte concatenation of ``a`` (bytes 0-63) and
    ``b`` (64-127); the index's top bit is ignored."""

    lanes: int = 64

    def llvm_ir(self, name: str) -> str:
        n, v = self.lanes, f"<{self.lanes} x i8>"
        both = f"<{2 * n} x i8>"
        picks = ", ".join(f"i32 {i}" for i in range(2 * n))
        body = [f"%t = shufflevector {v} %a, {v} %b, <{2 * n} x i32> <{picks}>", f"%r0 = bitcast {v} zeroinitializer to {v}"]
        for i in range(n):
            body += [f"%i{i} = extractelement {v} %idx, i32 {i}", f"%m{i} = and i8 %i{i}, {2 * n - 1}",
                     f"%e{i} = extractelement {both} %t, i8 %m{i}", f"%r{i + 1} = insertelement {v} %r{i}, i8 %e{i}, i32 {i}"]
        body.append(f"ret {v} %r{n}")
        return _define(v, name, f"{v} %a, {v} %idx, {v} %b", body)


@dataclass(frozen=True)
class ByteShuffleSemantics:
    """``@llvm.x86.avx2.pshuf.b`` / ``@llvm.x86.avx512.pshuf.b.512(table, idx)`` (VPSHUFB): lane ``i``
    of the result is 0 where ``idx[i]``'s top bit is set, else byte ``idx[i] & 15`` of the 16-byte
    lane of ``table`` that holds lane ``i``."""

    lanes: int

    def llvm_ir(self, name: str) -> str:
        n, v = self.lanes, f"<{self.lanes} x i8>"
        body = [f"%r0 = bitcast {v} zeroinitializer to {v}"]
        for i in range(n):
            base = i - i % 16
            body += [f"%i{i} = extractelement {v} %idx, i32 {i}", f"%l{i} = and i8 %i{i}, 15",
                     f"%w{i} = zext i8 %l{i} to i32", f"%p{i} = add i32 %w{i}, {base}",
                     f"%e{i} = extractelement {v} %table, i32 %p{i}", f"%z{i} = icmp slt i8 %i{i}, 0",
                     f"%s{i} = select i1 %z{i}, i8 0, i8 %e{i}", f"%r{i + 1} = insertelement {v} %r{i}, i8 %s{i}, i32 {i}"]
        body.append(f"ret {v} %r{n}")
        return _define(v, name, f"{v} %table, {v} %idx", body)


@dataclass(frozen=True)
class FloatPermuteSemantics:
    """``@llvm.x86.avx512.permvar.sf.512`` / ``@llvm.x86.avx2.permps(table, idx)`` (VPERMPS): lane
    ``i`` of the result is lane ``idx[i] & (lanes - 1)`` of ``table``."""

    lanes: int

    def llvm_ir(self, name: str) -> str:
        n, v, iv = self.lanes, f"<{self.lanes} x float>", f"<{self.lanes} x i32>"
        body = [f"%r0 = fadd {v} zeroinitializer, zeroinitializer"]
        for i in range(n):
            body += [f"%i{i} = extractelement {iv} %idx, i32 {i}", f"%m{i} = and i32 %i{i}, {n - 1}",
                     f"%e{i} = extractelement {v} %table, i32 %m{i}", f"%r{i + 1} = insertelement {v} %r{i}, float %e{i}, i32 {i}"]
        body.append(f"ret {v} %r{n}")
        return _define(v, name, f"{v} %table, {iv} %idx", body)


# Target intrinsics that TVM's own codegen writes for some rows (not a tensor intrinsic's impl): part
# of what :func:`tvm_lowprec.emulation.known_semantics` knows, so those builds run emulated too.
CODEGEN_SEMANTICS = {"llvm.x86.avx512.mask.vcvtph2ps.512": HalfToFloatSemantics()}


# ---------------------------------------------------------------------------------------------
# bf16 pair dot products (AVX512_BF16). The instruction's definition, from the pseudo-code of
# VDPBF16PS in Intel's "Architecture Instruction Set Extensions and Future Features Programming
# Reference" (May 2019; since then in the SDM, vol. 2): per float32 lane i,
#
#     srcdest.fp32[i] += make_fp32(src1.bfloat16[2*i+1]) * make_fp32(t.bfloat16[1])
#     srcdest.fp32[i] += make_fp32(src1.bfloat16[2*i+0]) * make_fp32(t.bfloat16[0])
#
# ("FP32 FMA with daz in, ftz out and RNE rounding. MXCSR neither consulted nor updated"), where
# make_fp32 puts the bf16 bits in the top half of a float32 and ``t`` is src2's dword i (or dword 0,
# broadcast from memory). So: the odd pair's product first, then the even one's, each a fused
# multiply-add rounded to nearest even; denormal inputs (of both products and of the accumulator) read
# as zero, a denormal result is flushed to a zero of its sign. Bochs implements it the same way
# (cpu/avx/avx512_bf16.cc: two f32_mulAdd, high halves first, denormals-are-zero and
# flush-to-zero set).
#
# "Denormal result" is x86's underflow condition: tininess detected *after* rounding (SDM vol. 1,
# 4.9.1.5: the result rounded to 24 bits with an unbounded exponent is below 2**-126). An IEEE result
# with gradual underflow is below 2**-126 exactly when that holds, except for exact sums in
# [2**-126 - 2**-150, 2**-126 - 2**-151), whose IEEE result is 2**-126 although they are tiny: for a
# result of magnitude 2**-126 the sum is recomputed scaled by 2**24 (exact: where it matters every
# operand is far from overflow) and flushed when that is below 2**-102.
#
# Not modelled: which NaN comes out when several operands are NaN (the SDM's table 5-1 gives
# priorities; here the result is NaN whenever the instruction's is, with LLVM's payload).

_MIN_NORMAL = "0x3810000000000000"  # 2**-126, as LLVM IR writes a float constant (a double's bits)
_SCALE = "0x4170000000000000"  # 2**24
_SCALED_MIN_NORMAL = "0x3990000000000000"  # 2**-102


@dataclass(frozen=True)
class Bf16DotSemantics:
    """What ``@llvm.x86.avx512bf16.dpbf16ps.<bits>`` computes (see the comment above), in generic LLVM
    IR: ``(acc <lanes x float>, a <2*lanes x bfloat>, b <2*lanes x bfloat>) -> <lanes x float>``."""

    lanes: int

    def llvm_ir(self, name: str) -> str:
        n, n2 = self.lanes, 2 * self.lanes
        v, vi = f"<{n} x float>", f"<{n} x i32>"
        odd = ", ".join(f"i32 {2 * i + 1}" for i in range(n))
        even = ", ".join(f"i32 {2 * i}" for i in range(n))
        body = []
        for x in ("a", "b"):  # make_fp32, then denormals-are-zero
            body += [f"%{x}i = bitcast <{n2} x bfloat> %{x} to <{n2} x i16>",
                     f"%{x}w = zext <{n2} x i16> %{x}i to <{n2} x i32>",
                     f"%{x}s = shl <{n2} x i32> %{x}w, splat (i32 16)",
                     *_daz(f"%{x}s", f"%{x}d", f"<{n2} x i32>", n2),
                     f"%{x}f = bitcast <{n2} x i32> %{x}d to <{n2} x float>",
                     f"%{x}1 = shufflevector <{n2} x float> %{x}f, <{n2} x float> poison, <{n} x i32> <{odd}>",
                     f"%{x}0 = shufflevector <{n2} x float> %{x}f, <{n2} x float> poison, <{n} x i32> <{even}>"]
        body += [f"%ci = bitcast {v} %acc to {vi}", *_daz("%ci", "%cd", vi, n), f"%c = bitcast {vi} %cd to {v}"]
        body += _fma_ftz("%a1", "%b1", "%c", "%s1", n)  # the odd pair first
        body += _fma_ftz("%a0", "%b0", "%s1", "%s0", n)
        body.append(f"ret {v} %s0")
        return "\n".join([f"define internal {v} @{name}({v} %acc, <{n2} x bfloat> %a, <{n2} x bfloat> %b) alwaysinline {{"]
                         + [f"  {line}" for line in body] + ["}", ""])


def _daz(bits: str, out: str, ty: str, n: int) -> list[str]:
    """``out``: the float32 bits ``bits`` with a denormal (exponent field 0) replaced by a zero of its sign."""
    t = out[1:]
    return [f"%{t}.e = and {ty} {bits}, splat (i32 2139095040)",  # 0x7F800000
            f"%{t}.z = icmp eq {ty} %{t}.e, zeroinitializer",
            f"%{t}.s = and {ty} {bits}, splat (i32 -2147483648)",  # the sign bit
            f"{out} = select <{n} x i1> %{t}.z, {ty} %{t}.s, {ty} {bits}"]


def _fma_ftz(a: str, b: str, c: str, out: str, n: int) -> list[str]:
    """``out = a * b + c`` rounded once to nearest even, flushed to a signed zero when tiny after rounding."""
    v, vi, t = f"<{n} x float>", f"<{n} x i32>", out[1:]
    fma = f"@llvm.fma.v{n}f32"
    return [
        f"%{t}.r = call {v} {fma}({v} {a}, {v} {b}, {v} {c})",
        f"%{t}.m = call {v} @llvm.fabs.v{n}f32({v} %{t}.r)",
        f"%{t}.lt = fcmp olt {v} %{t}.m, splat (float {_MIN_NORMAL})",  # below 2**-126 however rounded
        f"%{t}.eq = fcmp oeq {v} %{t}.m, splat (float {_MIN_NORMAL})",  # 2**-126: maybe tiny before it rounded up
        f"%{t}.as = fmul {v} {a}, splat (float {_SCALE})",
        f"%{t}.cs = fmul {v} {c}, splat (float {_SCALE})",
        f"%{t}.rs = call {v} {fma}({v} %{t}.as, {v} {b}, {v} %{t}.cs)",
        f"%{t}.ms = call {v} @llvm.fabs.v{n}f32({v} %{t}.rs)",
        f"%{t}.ls = fcmp olt {v} %{t}.ms, splat (float {_SCALED_MIN_NORMAL})",
        f"%{t}.edge = and <{n} x i1> %{t}.eq, %{t}.ls",
        f"%{t}.tiny = or <{n} x i1> %{t}.lt, %{t}.edge",
        f"%{t}.ri = bitcast {v} %{t}.r to {vi}",
        f"%{t}.sign = and {vi} %{t}.ri, splat (i32 -2147483648)",
        f"%{t}.zero = bitcast {vi} %{t}.sign to {v}",
        f"{out} = select <{n} x i1> %{t}.tiny, {v} %{t}.zero, {v} %{t}.r",
    ]
