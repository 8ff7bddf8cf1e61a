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


# Target intrinsics that TVM's own codegen writes for some rows (not a tensor intrinsic's impl): part
# of what :func:`tvm_lowprec.emulation.known_semantics` knows, so those builds run emulated too.
CODEGEN_SEMANTICS = {"llvm.x86.avx512.mask.vcvtph2ps.512": HalfToFloatSemantics()}
