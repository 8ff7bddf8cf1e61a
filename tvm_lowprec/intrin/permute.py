"""Float32 lane permutes (``vpermps``): a 16-entry float table held in registers, looked up for a
whole vector of indices at once (:class:`~tvm_lowprec.hwspec.RegisterPermute`).

The 8-bit softmax needs ``exp(-s * d)`` for ``d = q_max - q`` in 0..255. Written ``d = 16 h + l``,
that is ``H[h] * L[l]`` with ``H[h] = exp(-16 s h)`` and ``L[l] = exp(-s l)``: two 16-entry tables,
computed at compile time in float64 and rounded to float32, and one product, within 2 ulp of the
exactly rounded ``exp(-s * d)`` (``tests/test_row_ops.py`` checks every ``d`` over scales from 1e-3 to
10). Each table is one zmm register (``vpermps`` zmm: 16 entries) or two ymm registers (``vpermps``
ymm: 8 entries, the index's bit 3 picks one): 2 permutes, a shift and a multiply per 16 lanes, against
about 20 instructions for the range reduction and degree-7 polynomial it replaces
(:func:`~tvm_lowprec.kernels.qsoftmax.neg_exp`). A 256-entry table would need a gather per element
(``vgatherdps``), slower than the polynomial.

The tables are vector constants in the code (no buffer argument); LLVM keeps them in registers across
the kernel's loop.
"""

from __future__ import annotations

from tvm import tirx

from ..hwspec import RegisterPermute
from .semantics import FloatPermuteSemantics

TABLE = 16  # entries of each of the exponential's two tables (a 4-bit digit of d)


def _vector(values):
    """A float32 vector constant."""
    return tirx.Shuffle([tirx.FloatImm("float32", float(v)) for v in values],
                        [tirx.IntImm("int32", i) for i in range(len(values))])


def table_registers(row: RegisterPermute, table) -> list:
    """A 16-entry float32 ``table`` (a sequence of Python floats) as the vector constants of ``row``'s
    registers (one zmm, two ymm): a kernel binds them once and passes the bound values to
    :func:`table_lookup` (each inlined constant is 16 immediates for TVM's simplifier to walk)."""
    return [_vector(table[k:k + row.lanes]) for k in range(0, TABLE, row.lanes)]


def table_lookup(row: RegisterPermute, table, idx):
    """``table[idx & 15]`` for an ``int32x<row.lanes>`` vector ``idx`` and a 16-entry float32
    ``table`` (an array of floats, or a list of its :func:`table_registers`, bound): one permute per
    register of entries, then a binary tree of selects on the index bits above the register's."""
    lanes = row.lanes
    registers = table if isinstance(table, list) else table_registers(row, table)  # a list: the registers
    parts = [tirx.call_llvm_pure_intrin(f"float32x{lanes}", row.llvm, register, idx) for register in registers]
    bit = lanes
    while len(parts) > 1:
        picked = (idx & tirx.Broadcast(tirx.const(bit, "int32"), lanes)) != tirx.Broadcast(tirx.const(0, "int32"), lanes)
        parts = [tirx.Select(picked, parts[2 * k + 1], parts[2 * k]) for k in range(len(parts) // 2)]
        bit *= 2
    return parts[0]


def _row(name: str, lanes: int, llvm: str, features: tuple[str, ...], register: str) -> RegisterPermute:
    return RegisterPermute(name, lanes, llvm, features, {llvm: FloatPermuteSemantics(lanes)},
                           rf"vperm(ps|d)\s+[^\n]*%{register}", f"{16 // lanes} permute(s) per 16-entry table")


VPERMPS_ZMM = _row("vpermps_zmm", 16, "llvm.x86.avx512.permvar.sf.512", ("avx512f",), "zmm")
VPERMPS_YMM = _row("vpermps_ymm", 8, "llvm.x86.avx2.permps", ("avx2",), "ymm")
