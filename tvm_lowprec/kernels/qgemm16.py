"""The int16 x int8 GEMM: 16-bit activations (int16, or uint16 shifted into int16) times constant 8-bit
weights, exact, requantized in the epilogue.

``out[m, n] = requant(sum_k A'[m, k] * B'[k, n] + corr[n] + rowcoef[n] * rowsum_A'[m])`` with
``A' = A`` (int16) or ``A - 32768`` (uint16: the sign bit flipped, so ``|A'| <= 32768`` either way),
``B'`` the signed 8-bit weights, and ``corr``/``rowcoef`` the zero-point algebra of
:mod:`tvm_lowprec.quant.zero_points` with ``a_offset = -32768`` for uint16.

**Overflow.** One product is up to ``32768 * 128 = 2**22``: an int32 lane over the whole of K
overflows once ``sum_k |B'[k, n]|`` reaches 2**16 (K = 512 for full-range weights). The weights are
constants, so :func:`plan_accumulation` decides at compile time:

- ``"int32"``: the worst case of every term and of their sum stays below 2**31 for every column:
  one int32 accumulator over all of K, as the 8-bit kernel;
- ``"int64"``: K is cut into chunks (:attr:`QGemm16Problem.chunk` deep, a multiple of the
  instruction's K step, balanced) whose worst case ``32768 * sum_{k in chunk} |B'|`` stays below
  2**31; each chunk's int32 partial is added into an int64 accumulator, and the zero-point terms and
  the bias are added in int64. The float64 requantization is exact for totals below 2**53.

The instruction is the row's ``vpmaddwd`` recipe (int16 pairs against weights widened to int16):
``C[lanes] += A[2]i16 . B[lanes, 2]``, the same intrinsic the 8-bit rows use after widening.
The schedule lives in :mod:`tvm_lowprec.schedule.qgemm16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from ..hwspec import GemmRecipe
from .qgemm import Epilogue, GemmLayout, round_up, _pad_vec, requantize, tile_layout

A_DTYPES = ("int16", "uint16")
A_REACH = 32768  # the largest |A'|: int16 values, or uint16 values shifted by -32768
_INT32_LIMIT = 2**31
_FLOAT64_EXACT = 2**53  # int64 totals convert to float64 exactly below this


def a_shift(a_dtype: str) -> int:
    """What the kernel adds to an activation to make it int16: -32768 for uint16 (the sign bit flipped)."""
    return -32768 if a_dtype == "uint16" else 0


@dataclass(frozen=True)
class QGemm16Problem:
    """One int16 x int8 GEMM: shapes, activation dtype, epilogue, and the accumulation the weights allow
    (:func:`plan_accumulation`)."""

    m: int
    n: int
    k: int
    a_dtype: str
    epilogue: Epilogue
    chunk: int  # K per int32 partial sum: the whole (padded) K when ``acc == "int32"``
    acc: str = "int32"  # "int32", or "int64": int32 partials of ``chunk`` summed in int64
    row_term: bool = False  # the weight zero point is not zero: needs rowsum(A')

    def __post_init__(self):
        if min(self.m, self.n, self.k, self.chunk) < 1:
            raise ValueError(f"GEMM shape must be positive, got M={self.m} N={self.n} K={self.k} chunk={self.chunk}")
        if self.a_dtype not in A_DTYPES:
            raise ValueError(f"activations must be one of {A_DTYPES}, not {self.a_dtype}")
        if self.acc not in ("int32", "int64"):
            raise ValueError(f"accumulator must be int32 or int64, not {self.acc}")
        if self.acc == "int32" and self.chunk < self.k:
            raise ValueError("an int32 accumulator is one chunk over all of K")
        if self.epilogue.kind != "requant" or self.epilogue.mode != "float":
            raise ValueError("the int16 GEMM requantizes in float mode (a fixed-point product of a wide total needs "
                             "more than 64 bits)")

    @property
    def chunks(self) -> int:
        return -(-self.k // self.chunk)


@dataclass(frozen=True)
class AccumulationPlan:
    """What :func:`plan_accumulation` decided for one constant weight matrix."""

    acc: str  # "int32" or "int64"
    chunk: int  # K per int32 partial sum
    b_signed: np.ndarray  # [K, N] int8: B' = B - b_off
    corr: np.ndarray  # [N] int64: bias - za' * CB + K * za' * zb'
    rowcoef: np.ndarray | None  # [N] int32: -zb', or None when zb' == 0 everywhere
    bound: int  # the worst |total| over every column and input


def _chunk(abs_b: np.ndarray, kstep: int) -> int:
    """The deepest balanced chunk (a multiple of ``kstep``) whose ``A_REACH * sum |B'|`` stays below
    2**31 in every column. 511 weights of -128 fit, so a chunk is more than 255 deep (K / ceil(K / 510)
    at worst). Tries chunk counts upwards from the fewest the column totals allow; each try reads the
    column prefix sums at the chunk edges only."""
    k, n = abs_b.shape
    limit = (_INT32_LIMIT - 1) // A_REACH  # the largest sum |B'| one chunk may hold
    prefix = np.zeros((k + 1, n), np.int32)  # (128 * K < 2**31)
    np.cumsum(abs_b, axis=0, dtype=np.int32, out=prefix[1:])
    for chunks in range(max(1, -(-int(prefix[-1].max(initial=0)) // limit)), k + 1):
        size = round_up(-(-k // chunks), kstep)
        edges = np.minimum(np.arange(0, k + size, size), k)
        if int((prefix[edges[1:]] - prefix[edges[:-1]]).max(initial=0)) <= limit:
            return size
    raise AssertionError("unreachable: a chunk of kstep products always fits int32")


def plan_accumulation(b, za: int, zb, a_dtype: str, bias=None, kstep: int = 2) -> AccumulationPlan:
    """Decide the accumulation for constant weights ``b[K, N]`` (int8 or uint8), the activation zero
    point ``za`` and weight zero points ``zb`` (scalar or [N]), from worst cases over every input:

    ``D = sum A'B'`` is within ``A_REACH * sum_k |B'|``; the row term within ``|zb'| * A_REACH * K``;
    ``corr`` is known. int32 when their sum stays below 2**31 in every column, else int64 with K in
    chunks (:func:`_chunk`). Raises ``ValueError`` where even float64 would not be exact (2**53).
    """
    from ..quant.zero_points import signed_weights

    k, n = b.shape
    b_signed, b_off = signed_weights(np.asarray(b))
    za_p = int(za) + a_shift(a_dtype)
    zb_p = np.broadcast_to(np.asarray(zb, np.int64), (n,)) - b_off
    abs_b = np.abs(b_signed.astype(np.int16))
    cb = b_signed.sum(axis=0, dtype=np.int64)
    corr = -za_p * cb + k * za_p * zb_p
    if bias is not None:
        corr = corr + np.broadcast_to(np.asarray(bias, np.int64), (n,))
    # python ints: no int64 wrap in the bound itself
    per_column = [A_REACH * int(s) + abs(int(c)) + abs(int(z)) * A_REACH * k
                  for s, c, z in zip(abs_b.sum(axis=0, dtype=np.int64), corr, zb_p)]
    bound = max(per_column, default=0)
    if bound >= _FLOAT64_EXACT:
        raise ValueError(f"an int16 x int8 GEMM with K={k} could reach {bound}: float64 requantization "
                         "would not be exact")
    rowcoef = None if not np.any(zb_p) else (-zb_p).astype(np.int32)
    if bound < _INT32_LIMIT:
        return AccumulationPlan("int32", round_up(k, kstep), b_signed, corr, rowcoef, bound)
    return AccumulationPlan("int64", _chunk(abs_b, kstep), b_signed, corr, rowcoef, bound)


def int16_operand(recipe: GemmRecipe):
    """The recipe's operand that reads int16 activations as they are (storage int16, no offset)."""
    for operand in recipe.intrin.a_operands.values():
        if operand.storage == "int16" and operand.offset == 0:
            return operand
    raise ValueError(f"intrinsic {recipe.intrin.name} has no int16 activation operand")


def choose_layout(problem: QGemm16Problem, recipe: GemmRecipe) -> GemmLayout:
    """The recipe's tile for M, K padded to whole chunks (zero weights: the padding adds nothing)."""
    gi, tile = recipe.intrin, recipe.tile_for(problem.m)
    if problem.chunk % gi.kstep:
        raise ValueError(f"chunk {problem.chunk} is not a multiple of {gi.name}'s K step {gi.kstep}")
    return tile_layout(gi, int16_operand(recipe), tile, problem.m, problem.n, problem.chunks * problem.chunk,
                       a_storage="int16", a_offset=0)


def qgemm16_params(problem: QGemm16Problem, layout: GemmLayout, plan: AccumulationPlan, mult) -> list:
    """The constant arrays after packed B: ``corr`` (in the accumulator's dtype), ``rowcoef`` (int32)
    with a row term, ``mult`` (float32), each padded to ``np_``."""
    np_ = layout.np_
    params = [_pad_vec(plan.corr.astype(problem.acc), np_, problem.acc)]
    if problem.row_term:
        params.append(_pad_vec(plan.rowcoef, np_, np.int32))
    params.append(_pad_vec(np.broadcast_to(np.asarray(mult, np.float32), (problem.n,)), np_, np.float32))
    return params


def build_qgemm16(problem: QGemm16Problem, layout: GemmLayout, name: str = "qgemm16"):
    """The unscheduled PrimFunc ``(A, B_packed, corr, [rowcoef], mult, out)``.

    Blocks: ``A_prepared`` (the uint16 shift and the padding, when needed), ``gemm[chunks, mp, np_]``
    (int32 partial sums over one chunk each; the reduction split ``(kb, ki)`` so the instruction's
    K step is a loop of its own), ``wide[mp, np_]`` (int64 sum of the partials; absent with an int32
    accumulator), ``rowsum`` (with a row term), ``epilogue``.
    """
    p, lay = problem, layout
    A = te.placeholder((p.m, p.k), p.a_dtype, name="A")
    Bp = te.placeholder(lay.packed_shape, lay.b_storage, name="B_packed")
    corr = te.placeholder((lay.np_,), p.acc, name="corr")
    args = [A, Bp, corr]
    gemm = _chunked_gemm(p, lay, _prepared(p, lay, A), Bp)
    if p.acc == "int64":
        c = te.reduce_axis((0, p.chunks), name="c")
        wide = te.compute((lay.mp, lay.np_), lambda m, n: te.sum(gemm[c, m, n].astype("int64"), axis=c), name="wide")
        acc = lambda m, n: wide[m, n]  # noqa: E731
    else:
        acc = lambda m, n: gemm[0, m, n]  # noqa: E731
    terms = [lambda m, n: corr[n]]
    if p.row_term:
        rowcoef = te.placeholder((lay.np_,), "int32", name="rowcoef")
        kr = te.reduce_axis((0, p.k), name="kr")
        shift = a_shift(p.a_dtype)
        rowsum = te.compute((p.m,), lambda m: te.sum(A[m, kr].astype(p.acc) + shift, axis=kr), name="rowsum")
        args.append(rowcoef)
        terms.append(lambda m, n: rowcoef[n].astype(p.acc) * rowsum[m])
    mult = te.placeholder((lay.np_,), "float32", name="mult")

    def total(m, n):
        x = acc(m, n)
        for term in terms:
            x = x + term(m, n)
        return x

    out = te.compute((p.m, p.n), lambda m, n: requantize(total(m, n), p.epilogue, mult[n]), name="epilogue")
    func = te.create_prim_func(args + [mult, out])
    return func.with_attr("global_symbol", name).with_attrs(_decision_attrs(problem, layout))


def _prepared(p: QGemm16Problem, lay: GemmLayout, A):
    """A as int16 (uint16 shifted by -32768), padded to ``[mp, kp]`` with zeros; A itself when it
    already is."""
    shift = a_shift(p.a_dtype)
    if not shift and lay.mp == p.m and lay.kp == p.k:
        return A

    def prep(m, kk):
        inside = tirx.all(m < p.m, kk < p.k)
        value = A[tirx.min(m, p.m - 1), tirx.min(kk, p.k - 1)]
        value = (value.astype("int32") + shift).astype("int16") if shift else value
        return tirx.if_then_else(inside, value, tirx.const(0, "int16"))

    return te.compute((lay.mp, lay.kp), prep, name="A_prepared")


def _chunked_gemm(p: QGemm16Problem, lay: GemmLayout, a_src, Bp):
    """``gemm[c, m, n] = sum_{k in chunk c} A'[m, k] * B'[k, n]`` in int32 (each chunk within the bound)."""
    steps = p.chunk // lay.kstep
    kb = te.reduce_axis((0, steps), name="kb")
    ki = te.reduce_axis((0, lay.kstep), name="ki")

    def part(c, m, n):
        a = a_src[m, c * p.chunk + kb * lay.kstep + ki].astype("int32")
        b = Bp[n // lay.panel, c * steps + kb, (n // lay.lanes) % lay.nr, n % lay.lanes, ki].astype("int32")
        return te.sum(a * b, axis=[kb, ki])

    return te.compute((p.chunks, lay.mp, lay.np_), part, name="gemm")


def _decision_attrs(problem: QGemm16Problem, layout: GemmLayout) -> dict:
    return {
        "lowprec.op": "qgemm16",
        "lowprec.intrin": layout.intrin,
        "lowprec.intrin_row": layout.intrin_row,
        "lowprec.shape": [problem.m, problem.n, problem.k],
        "lowprec.tile": [layout.mr, layout.nr, 0],
        "lowprec.vector": [layout.lanes, layout.kstep],
        "lowprec.b_storage": layout.b_storage,
        "lowprec.a_dtype": problem.a_dtype,
        "lowprec.epilogue": problem.epilogue.kind,
        "lowprec.requant": problem.epilogue.mode,
        "lowprec.acc": problem.acc,
        "lowprec.chunk": problem.chunk,
    }
