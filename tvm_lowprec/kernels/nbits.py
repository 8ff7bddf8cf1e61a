"""Weight-only GEMM with 4-bit weights: ``Y[M, N] = X[M, K] @ W[K, N]``, ``W = (q - z) * s`` per block.

``q`` are unsigned 4-bit values packed two to a byte, ``s`` (float32) and ``z`` one per block of
``block`` consecutive K values and output column (ONNX's blocked DequantizeLinear, ORT's
``MatMulNBits``). Per K block ``b`` and column ``n`` the kernel forms one partial sum and scales it:

- ``activations="float"``: ``P = sum_k x_k q_k`` in float32 (the weights widened in registers), and
  ``Y += s (P - z sum_k x_k)``; or, with ``widen_block`` (several row tiles), each block of a task is
  dequantized once, ``w = s q - s z`` in float32, into a buffer all row tiles read: ``Y += sum_k x_k w_k``;
- ``activations="int8"``: each row's block is quantized on the fly, ``a = rint(x / sa)`` with
  ``sa = max|x| / 127`` (ONNX Runtime's ``accuracy_level=4``), ``P = sum_k a_k q_k`` in int32 on the
  row's 4-bit dot product (:mod:`tvm_lowprec.intrin.nibble`), and ``Y += sa s (P - z sum_k a_k)``.

Layouts (``L`` = the instruction's lanes, ``nr`` lane vectors per task, ``T = N / (nr L)`` tasks,
``G = block / 8``): the weights are packed at compile time as ``[T, K/block, nr, G, L, 4]`` bytes
for the dot product (byte ``[l, j]``: ``k = 8g + j`` low, ``k = 8g + 4 + j`` high; one call takes
consecutive groups of one vector) or ``[T, K/block, G, 4, nr, L]`` for the float path (``L``
consecutive columns per byte vector): each task reads one contiguous stream. Scales and ``s * z``
are ``[T, K/block, nr, L]`` float32. K is padded to whole blocks with zero activations, N to whole
tasks with zero scales, M to whole row tiles with zero rows (the caller slices).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from ..errors import LowPrecError
from ..intrin.nibble import nibble
from .qgemm import round_up

ACTIVATIONS = ("float", "int8")


@dataclass(frozen=True)
class NbitsProblem:
    m: int
    n: int
    k: int
    block: int
    lanes: int
    activations: str = "float"
    intrin: str | None = None  # the 4-bit dot product (activations="int8")
    mr: int = 1  # rows per tile: each weight vector loaded (and widened) once for mr rows
    nr: int = 4  # lane vectors per task: mr * nr independent accumulators
    call_groups: int = 1  # groups of 8 weights per intrinsic call (int8 activations)
    widen_block: bool = False  # float activations: dequantize each task's K block once for all row tiles
    # one zero point for every block (symmetric exports: ORT GenAI's builder writes no zero points, 8 for
    # all): the kernel takes no scaled-zero-point stream and subtracts ``z * sum(a)`` in integers
    zero_point: int | None = None

    def __post_init__(self):
        if self.activations not in ACTIVATIONS:
            raise LowPrecError(f"activations must be one of {ACTIVATIONS}, not {self.activations!r}")
        if self.block < 8 or self.block % 8:
            raise LowPrecError(f"4-bit kernel: block size {self.block} is not a multiple of 8")
        if self.activations == "int8" and self.intrin is None:
            raise LowPrecError("4-bit kernel: int8 activations need the row's 4-bit dot product")
        if self.widen_block and self.activations != "float":
            raise LowPrecError("4-bit kernel: only float activations widen whole blocks")
        if self.groups % self.call_groups:
            raise LowPrecError(f"4-bit kernel: {self.call_groups} groups per call do not divide the block's {self.groups}")

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.block)

    @property
    def groups(self) -> int:
        return self.block // 8

    @property
    def tasks(self) -> int:
        """Runs of ``nr`` lane vectors along N (N padded to whole tasks)."""
        return -(-self.n // (self.lanes * self.nr))

    @property
    def m_padded(self):
        """M in whole row tiles (an expression of a symbolic M)."""
        return round_up(self.m, self.mr)

    @property
    def n_padded(self) -> int:
        return self.tasks * self.nr * self.lanes

    @property
    def lane_major(self) -> bool:
        """Bytes ``[L, 4]`` per group (the dot product's operand) or ``[4, L]`` (float widening)."""
        return self.activations == "int8"

    @property
    def packed_shape(self) -> tuple[int, ...]:
        t, kb, g, nr, L = self.tasks, self.k_blocks, self.groups, self.nr, self.lanes
        return (t, kb, nr, g, L, 4) if self.lane_major else (t, kb, g, 4, nr, L)

    @property
    def param_shape(self) -> tuple[int, ...]:
        return (self.tasks, self.k_blocks, self.nr, self.lanes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m_padded, self.tasks, self.nr, self.lanes)

    @property
    def weight_bytes(self) -> int:
        """What one call reads of the weights: packed nibbles, scales and (unless uniform) scaled zero points."""
        streams = 1 if self.zero_point is not None else 2
        return int(np.prod(self.packed_shape)) + streams * 4 * int(np.prod(self.param_shape))


def pack_nibbles(q: np.ndarray, problem: NbitsProblem) -> np.ndarray:
    """``q[N, K]`` (values 0..15) -> the packed uint8 weights of ``problem``'s layout: each task's
    bytes one contiguous stream, in the order the kernel reads them."""
    p = problem
    if q.min(initial=0) < 0 or q.max(initial=0) > 15:
        raise LowPrecError("4-bit weights must be in 0..15 (shift int4 values by 8, with their zero point)")
    full = np.zeros((p.n_padded, p.k_blocks * p.block), np.uint8)
    full[: p.n, : p.k] = q
    v = full.reshape(p.tasks, p.nr, p.lanes, p.k_blocks, p.groups, 2, 4)
    byte = v[..., 0, :] | (v[..., 1, :] << 4)  # [T, nr, L, Kb, G, 4]
    order = (0, 3, 1, 4, 2, 5) if p.lane_major else (0, 3, 4, 5, 1, 2)
    return np.ascontiguousarray(byte.transpose(order))


def uniform_zero_point(zero_point: np.ndarray) -> int | None:
    """The one integer zero point of every block, or None."""
    values = np.unique(np.asarray(zero_point))
    return int(values[0]) if values.size == 1 and float(values[0]).is_integer() else None


def pack_block_params(scale: np.ndarray, zero_point: np.ndarray, problem: NbitsProblem):
    """Per-block ``scale[N, Kb]`` and ``zero_point[N, Kb]`` -> ``(s, s * z)``, ``[T, Kb, nr, L]`` float32
    (``(s,)`` alone for a problem with a uniform zero point)."""
    p = problem
    s = np.zeros((p.n_padded, p.k_blocks), np.float32)
    z = np.zeros((p.n_padded, p.k_blocks), np.float32)
    s[: p.n] = scale
    z[: p.n] = zero_point

    def lay(v):
        return np.ascontiguousarray(v.reshape(p.tasks, p.nr, p.lanes, p.k_blocks).transpose(0, 3, 1, 2))

    return (lay(s),) if p.zero_point is not None else (lay(s), lay(s * z))


def _blocked_input(X, p: NbitsProblem):
    """``X[m, k]`` seen as ``[Mp, Kb, G, 2, 4]`` (k = block b, group g, half h, j), zero past M and K."""

    def at(m, b, g, h, j):
        k = b * p.block + g * 8 + h * 4 + j
        padded_rows = not isinstance(p.m, int) or p.m_padded != p.m
        conds = ([k < p.k] if p.k % p.block else []) + ([m < p.m] if padded_rows else [])
        if not conds:
            return X[m, k]
        inside = conds[0] if len(conds) == 1 else tirx.all(*conds)
        return tirx.if_then_else(inside, X[tirx.min(m, p.m - 1), tirx.min(k, p.k - 1)], tirx.const(0.0, "float32"))

    return at


def _quantized_rows(x, p: NbitsProblem):
    """int8 activations per (row, block), their scale and their sum (ORT's accuracy_level=4 recipe)."""
    shape = (p.m_padded, p.k_blocks)
    g, h, j = te.reduce_axis((0, p.groups), "g"), te.reduce_axis((0, 2), "h"), te.reduce_axis((0, 4), "j")
    amax = te.compute(shape, lambda m, b: te.max(tirx.abs(x(m, b, g, h, j)), axis=[g, h, j]), name="x_amax")
    scale = te.compute(shape, lambda m, b: amax[m, b] / tirx.const(127.0, "float32"), name="x_scale")

    def quant(m, b, gg, hh, jj):
        inv = tirx.if_then_else(scale[m, b] > 0, tirx.const(1.0, "float32") / scale[m, b], tirx.const(0.0, "float32"))
        v = tirx.nearbyint(x(m, b, gg, hh, jj) * inv)
        return tirx.max(tirx.min(v, tirx.const(127.0, "float32")), tirx.const(-127.0, "float32")).astype("int8")

    qa = te.compute((p.m_padded, p.k_blocks, p.groups, 2, 4), quant, name="x_quant")
    g2, h2, j2 = te.reduce_axis((0, p.groups), "g"), te.reduce_axis((0, 2), "h"), te.reduce_axis((0, 4), "j")
    qsum = te.compute(shape, lambda m, b: te.sum(qa[m, b, g2, h2, j2].astype("int32"), axis=[g2, h2, j2]), name="x_sum")
    return qa, scale, qsum


def _dequantized_block_sums(x, Wp, S, SZ, p: NbitsProblem):
    """``widen_block``: the weights dequantized (``s q - s z``, one rounding of an FMA's worth) per
    (task, block), then per (row, task, block, vector, lane) the block's float dot product."""
    def dequantized(t, b, g, h, j, v, l):
        q = nibble(Wp[t, b, g, j, v, l], h)
        if p.zero_point is not None:  # (q - z) exact, one rounding
            return S[t, b, v, l] * (q.astype("int32") - p.zero_point).astype("float32")
        return S[t, b, v, l] * q.astype("float32") - SZ[t, b, v, l]

    w = te.compute((p.tasks, p.k_blocks, p.groups, 2, 4, p.nr, p.lanes), dequantized, name="w_float")
    g, h, j = te.reduce_axis((0, p.groups), "g"), te.reduce_axis((0, 2), "h"), te.reduce_axis((0, 4), "j")
    return te.compute((p.m_padded, p.tasks, p.k_blocks, p.nr, p.lanes), lambda m, t, b, v, l: te.sum(
        x(m, b, g, h, j) * w[t, b, g, h, j, v, l], axis=[g, h, j]), name="acc")


def _partial_sums(X, Wp, S, SZ, p: NbitsProblem):
    """Per (row, task, block, vector, lane): the block's dot product, and the activations' per-block
    scale (int8 only) and sum (neither for ``widen_block``: its sums are already scaled)."""
    x = _blocked_input(X, p)
    g, h, j = te.reduce_axis((0, p.groups), "g"), te.reduce_axis((0, 2), "h"), te.reduce_axis((0, 4), "j")
    shape = (p.m_padded, p.tasks, p.k_blocks, p.nr, p.lanes)
    if p.lane_major:
        qa, a_scale, a_sum = _quantized_rows(x, p)
        acc = te.compute(shape, lambda m, t, b, v, l: te.sum(
            qa[m, b, g, h, j].astype("int32") * nibble(Wp[t, b, v, g, l, j], h).astype("int32"), axis=[g, h, j]),
            name="acc")
        return acc, a_scale, a_sum
    if p.widen_block:
        return _dequantized_block_sums(x, Wp, S, SZ, p), None, None
    g2, h2, j2 = te.reduce_axis((0, p.groups), "g"), te.reduce_axis((0, 2), "h"), te.reduce_axis((0, 4), "j")
    a_sum = te.compute((p.m_padded, p.k_blocks), lambda m, b: te.sum(x(m, b, g2, h2, j2), axis=[g2, h2, j2]), name="x_sum")
    acc = te.compute(shape, lambda m, t, b, v, l: te.sum(
        x(m, b, g, h, j) * nibble(Wp[t, b, g, j, v, l], h).astype("float32"), axis=[g, h, j]), name="acc")
    return acc, None, a_sum


def build_nbits_gemm(problem: NbitsProblem, name: str = "nbits_gemm"):
    """The unscheduled PrimFunc: ``(X[M, K] f32, W_packed, scale[, scaled_zero_point]) -> Y`` f32 (no
    scaled zero points for a problem with a uniform zero point),
    ``Y`` ``[Mp, T, nr, L]`` (that is ``[Mp, Np]``; rows past M and columns past N are padding)."""
    p = problem
    X = te.placeholder((p.m, p.k), "float32", name="X")
    Wp = te.placeholder(p.packed_shape, "uint8", name="W_packed")
    S = te.placeholder(p.param_shape, "float32", name="scale")
    SZ = None if p.zero_point is not None else te.placeholder(p.param_shape, "float32", name="scaled_zero_point")
    acc, a_scale, a_sum = _partial_sums(X, Wp, S, SZ, p)
    b = te.reduce_axis((0, p.k_blocks), "b")

    def block_term(m, t, v, l, bb):
        if p.widen_block:
            return acc[m, t, bb, v, l]
        if p.zero_point is not None and a_scale is not None:  # int8: P - z sum(a) in int32, exact
            term = S[t, bb, v, l] * (acc[m, t, bb, v, l] - a_sum[m, bb] * p.zero_point).astype("float32")
        elif p.zero_point is not None:
            term = S[t, bb, v, l] * (acc[m, t, bb, v, l] - a_sum[m, bb] * tirx.const(float(p.zero_point), "float32"))
        else:
            term = (S[t, bb, v, l] * acc[m, t, bb, v, l].astype("float32")
                    - SZ[t, bb, v, l] * a_sum[m, bb].astype("float32"))
        return term * a_scale[m, bb] if a_scale is not None else term

    Y = te.compute(p.out_shape, lambda m, t, v, l: te.sum(block_term(m, t, v, l, b), axis=b), name="Y")
    func = te.create_prim_func([X, Wp, S, Y] if SZ is None else [X, Wp, S, SZ, Y])
    attrs = {"lowprec.op": "nbits_gemm", "lowprec.weight_only": f"uint4/{p.activations}",
             "lowprec.vector": [p.lanes, 8 * p.call_groups], "lowprec.tile": [p.mr, p.nr, p.block],
             "lowprec.shape": [p.m, p.n, p.k],
             # the float path has no tensor intrinsic: its name says what LLVM vectorizes
             "lowprec.intrin": p.intrin if p.intrin is not None else
             f"{'block_' if p.widen_block else ''}widen_fma_f32x{p.lanes}"}
    return func.with_attr("global_symbol", name).with_attrs(attrs)


def reference(x: np.ndarray, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, block: int,
              activations: str = "float") -> np.ndarray:
    """numpy model: ``x[M, K]`` f32, ``q[N, K]``, ``scale``/``zero_point`` ``[N, Kb]`` -> ``Y[M, N]``
    (float64 sums; for ``"int8"`` the activations quantized exactly as the kernel does)."""
    m, k = x.shape
    kb = -(-k // block)
    xp = np.zeros((m, kb * block), np.float32)
    xp[:, :k] = x
    xb = xp.reshape(m, kb, block)
    qp = np.zeros((q.shape[0], kb * block), np.float64)
    qp[:, :k] = q
    qb = qp.reshape(-1, kb, block)
    if activations == "int8":
        sa = (np.abs(xb).max(axis=2) / np.float32(127.0)).astype(np.float32)
        inv = np.where(sa > 0, np.float32(1.0) / np.where(sa > 0, sa, 1), 0).astype(np.float32)
        a = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.float64)
        dot = np.einsum("mbk,nbk->mnb", a, qb)
        part = dot - zero_point[None].astype(np.float64) * a.sum(axis=2)[:, None, :]
        return (part * scale[None] * sa[:, None, :]).sum(axis=2)
    dot = np.einsum("mbk,nbk->mnb", xb.astype(np.float64), qb)
    part = dot - zero_point[None].astype(np.float64) * xb.sum(axis=2, dtype=np.float64)[:, None, :]
    return (part * scale[None]).sum(axis=2)
