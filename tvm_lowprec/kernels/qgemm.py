"""The quantized GEMM: ``out[m, n] = epilogue(sum_k A'[m, k] * B'[n, k] + corr[n] + rowcoef[n] * rowsum_A'[m])``.

``A'`` is the activation as the intrinsic sees it (``A + offset``), ``B'`` the weight as signed 8-bit
(``B - 128`` for u8 weights), packed at compile time to the intrinsic's tile. ``corr`` folds the bias
and every zero-point term that depends on ``n`` only; ``rowcoef * rowsum`` is the one term that
depends on the activation row, present only when the weight zero point is not zero. The algebra is in
:func:`tvm_lowprec.quant.zero_points.gemm_corrections`; exact in int32.

This file builds the *computation* (a PrimFunc) and packs weights; the schedule lives in
:mod:`tvm_lowprec.schedule.qgemm`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import te, tirx

from ..hwspec import TargetSpec

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "int32": (-(2**31), 2**31 - 1)}
_REQUANT_DTYPES = ("uint8", "int8", "uint16", "int16")  # 16-bit: the int16 GEMM's outputs (:mod:`.qgemm16`)


@dataclass(frozen=True)
class Epilogue:
    """What the kernel does with its int32 accumulator.

    kind: ``"requant"`` (``clamp(round(acc * mult) + zero_point, qmin, qmax)``, fused activation as the
    clamp bounds), ``"int32"`` (the accumulator itself, as MatMulInteger) or ``"float"``
    (``acc * scale + bias``, for a dequantized output).
    mode: ``"float"`` rounds ``float64(acc) * float32(mult)`` half to even, exactly as ONNX's reference
    QLinearMatMul (ONNX Runtime's MLAS rounds a float32 product instead, so it can differ by one step
    where the product lies within float32 precision of a tie); ``"fixed_point"`` uses an int32 multiplier
    and a right shift (round half up), which can differ from ``"float"`` by one step in the same cases.
    """

    kind: str = "requant"
    out_dtype: str = "uint8"
    zero_point: int = 0
    qmin: int | None = None
    qmax: int | None = None
    mode: str = "float"

    def __post_init__(self):
        if self.kind not in ("requant", "int32", "float"):
            raise ValueError(f"unknown epilogue kind {self.kind!r}")
        if self.mode not in ("float", "fixed_point"):
            raise ValueError(f"unknown requantization mode {self.mode!r}")
        if self.kind == "requant":
            if self.out_dtype not in _REQUANT_DTYPES:
                raise ValueError(f"requantized output must be one of {_REQUANT_DTYPES}, not {self.out_dtype}")
            lo, hi = _QRANGE[self.out_dtype]
            if not lo <= self.zero_point <= hi:
                raise ValueError(f"zero point {self.zero_point} is outside {self.out_dtype}")
            object.__setattr__(self, "qmin", lo if self.qmin is None else max(lo, self.qmin))
            object.__setattr__(self, "qmax", hi if self.qmax is None else min(hi, self.qmax))
            if self.qmin > self.qmax:
                raise ValueError(f"empty output range [{self.qmin}, {self.qmax}]")
        elif self.kind == "int32":
            object.__setattr__(self, "out_dtype", "int32")
        else:
            object.__setattr__(self, "out_dtype", "float32")


@dataclass(frozen=True)
class ConvWindow:
    """A convolution's im2col read in place: the GEMM's A row ``m = (b, oh, ow)``, column ``k = (kh, kw,
    c)`` is ``X[b, oh * sh + kh * dh, ow * sw + kw * dw, c]`` of the padded NHWC input ``X`` (its
    padding, the zero point, written by the copy before the GEMM), so no ``[M, K]`` im2col buffer is
    written and read back. Where ``channels`` is a multiple of the instruction's K step, each step
    reads ``kstep`` contiguous channels of one tap: the same operand as a row of the im2col, at an
    address affine in the row within an output row. A grouped convolution's GEMMs (``groups`` > 1,
    one per group) read the same window, group ``g`` its ``channels`` from channel ``g * channels``."""

    batch: int
    padded_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]
    channels: int  # per tap of one GEMM's depth: one group's channels
    groups: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, *self.padded_hw, self.channels * self.groups)

    @property
    def rows(self) -> int:
        return self.batch * self.out_hw[0] * self.out_hw[1]

    @property
    def depth(self) -> int:
        return self.kernel[0] * self.kernel[1] * self.channels

    def a_index(self, m, k, group=0) -> tuple:
        """Where ``A[m, k]`` (of the GEMM of ``group``) lies in ``X``."""
        (oh_n, ow_n), (kh_n, kw_n), (sh, sw), (dh, dw) = self.out_hw, self.kernel, self.strides, self.dilation
        pixel, tap, c = m % (oh_n * ow_n), k // self.channels, k % self.channels
        return (m // (oh_n * ow_n), pixel // ow_n * sh + tap // kw_n * dh, pixel % ow_n * sw + tap % kw_n * dw,
                c + group * self.channels if self.groups > 1 else c)

    def attr(self) -> list[int]:
        """``lowprec.window``: padded H, W, channels, kernel, strides, dilation, output H, W (and the groups
        of a grouped convolution: one GEMM's records key stays as it was)."""
        groups = [self.groups] if self.groups > 1 else []
        return [*self.padded_hw, self.channels, *self.kernel, *self.strides, *self.dilation, *self.out_hw, *groups]


@dataclass(frozen=True)
class QGemmProblem:
    """One integer GEMM as the graph needs it: shapes, activation dtype, epilogue, row term."""

    m: int
    n: int
    k: int
    a_dtype: str
    epilogue: Epilogue
    row_term: bool = False  # the weight zero point is not zero: needs rowsum(A')
    runtime_a_zero_point: bool = False  # za is a kernel input (dynamic quantization), not a constant
    # > 0: a batch of GEMMs with runtime weights (packed by pack_b at run time; corr per batch)
    batch: int = 0
    # a "float" requantization in float32 (:func:`requant_f32`): only where the weights make it exact
    # (:func:`float32_requant_exact`, checked by the caller that knows them)
    requant_f32: bool = False
    # A read through a convolution's window of its padded NHWC input (no im2col buffer), or None: A is [M, K]
    window: ConvWindow | None = None
    # the batch is a grouped convolution's groups: constant weights, every per-column parameter per group
    # ([batch, N]), and the output ``[M, batch, N]`` (group-major channels, as NHWC has them)
    grouped: bool = False
    # with a row term: the row sums of A are a kernel input ``rowsum`` ([batch.., M] int32, after
    # ``corr``), made by the graph beforehand, so the epilogue joins the GEMM's tiles instead of a pass of
    # its own over the whole int32 accumulator (Whisper's 6x1500x1500 scores: 54 MB out to memory and back)
    rowsum_input: bool = False

    def __post_init__(self):
        if not isinstance(self.m, int) and (self.window is not None or self.batch or self.grouped):
            raise ValueError(f"a symbolic M ({self.m}) is a plain GEMM's: no convolution window, batch or groups")
        if min(self.m if isinstance(self.m, int) else 1, self.n, self.k) < 1 or self.batch < 0:
            raise ValueError(f"GEMM shape must be positive, got M={self.m} N={self.n} K={self.k}")
        w = self.window
        if w is not None and ((self.m, self.k) != (w.rows, w.depth) or self.row_term
                              or (self.batch if not self.grouped else self.batch != w.groups)):
            raise ValueError(f"a GEMM through a convolution window needs M={w.rows} K={w.depth}, no batch but its "
                             f"groups and no row term; got M={self.m} K={self.k} batch={self.batch}")
        if self.grouped and (not self.batch or self.row_term or self.runtime_a_zero_point):
            raise ValueError("a grouped GEMM needs a batch of groups, and no row term or runtime zero point")
        if self.a_dtype not in ("uint8", "int8"):
            raise ValueError(f"activations must be uint8 or int8, not {self.a_dtype}")
        if self.k * 255 * 128 >= 2**31:
            raise ValueError(f"K={self.k} could overflow the int32 accumulator")


def round_up(x, m: int):
    """``x`` rounded up to a multiple of ``m``; a symbolic ``x`` (a TIR variable) gives the expression."""
    if not isinstance(x, int):
        return x if m == 1 else tirx.floordiv(x + (m - 1), m) * m
    return (x + m - 1) // m * m



# The M a layout is chosen for where M is symbolic (a prompt's tokens times the batch, known at run
# time): the tile of a GEMM with many rows (the tile table's rows for small M are GEMV forms)
SYMBOLIC_ROWS = 256


_CHAIN_STEPS = 4  # K steps from which a narrow GEMM's tile grows in M to keep its accumulators


def tile_layout(gi, operand, tile, m: int, n: int, kp: int, kblock: int = 0, a_storage: str | None = None,
                a_offset: int | None = None) -> "GemmLayout":
    """The CPU register layout of a tile: ``mr`` rows (whole row groups of a matrix instruction, at most
    M), ``nr`` column groups (no more than N needs), the int16-weight variant where the tile asks for
    it and the operand has one; M and N padded to whole tiles, K to ``kp``. ``a_storage``/``a_offset``:
    the operand's unless given (the int16 GEMM stores its activations as int16). Where N needs fewer
    column groups than the tile's ``nr``, ``mr`` grows to keep the tile's accumulators (the
    instruction's latency is hidden by as many independent chains): a 4x4 vpdpbusd zmm tile for a
    6-channel convolution is 16x1, not 4x1 (4 chains: 0.8 instructions a cycle of 2; 14400x6x216 on Zen 5
    0.19 -> 0.12 ms). Only where K is at least :data:`_CHAIN_STEPS` instruction steps deep: a shorter
    chain has no latency to hide, and taller tiles only widen the epilogue (32000x1x4 0.012 -> 0.020 ms)."""
    nr = _column_groups(tile.nr, -(-n // gi.lanes))
    keep = tile.mr * tile.nr // nr if kp >= _CHAIN_STEPS * gi.kstep else tile.mr
    mr = round_up(min(max(tile.mr, keep), m), gi.rows)
    wide = tile.wide_b and operand.intrin_wide_b is not None
    return GemmLayout(
        intrin=operand.intrin_wide_b if wide else operand.intrin,
        intrin_row=gi.name,
        lanes=gi.lanes,
        kstep=gi.kstep,
        mr=mr,
        nr=nr,
        kblock=kblock,
        a_storage=operand.storage if a_storage is None else a_storage,
        a_offset=operand.offset if a_offset is None else a_offset,
        b_storage="int16" if wide else "int8",
        mp=round_up(m, mr),
        np_=round_up(n, gi.lanes * nr),
        kp=kp,
        rows=gi.rows,
    )


# Padding of M (rows computed and thrown away) above which a tile takes a height that pads less. Below
# it the other height loses more than it saves: Whisper-tiny's encoder at 500 frames (M = 250, 4 rows
# pad 0.8%; M = 1500, 0.3%) went 12.27 -> 12.66 ms with rows dividing M on Zen 4.
ROW_PADDING_LIMIT = 0.02


def rows_padding_less(layout: "GemmLayout", tile, m: int) -> "GemmLayout":
    """``layout`` with the row tile that pads M least (the tallest of those), from half its ``mr`` up
    to ``tile.grow_rows`` (whole row groups), where ``mr`` pads M by more than
    :data:`ROW_PADDING_LIMIT`; as it is otherwise. ViT's M = 50: 5 rows, not 4 x 13 = 52. A few rows
    with a narrow N (Keras MobileNetV2's 9x160x960, whose 2 x 16-column tile grew to 8 rows to keep
    its accumulators, M padded to 16): 5 rows, 11.7 -> 7.3 us at one thread (Zen 4); 9x960x160 on 4 x
    4 tiles: 3 rows, 8.7 (5 rows) -> 7.4 us."""
    if (layout.mp - m) <= ROW_PADDING_LIMIT * layout.mp:
        return layout
    low = max(layout.rows, round_up((layout.mr + 1) // 2, layout.rows))
    rows = range(low, max(layout.mr, tile.grow_rows) + 1, layout.rows)
    mr = min(rows, key=lambda r: (round_up(m, r), -r))
    return replace(layout, mr=mr, mp=round_up(m, mr))


# A narrow GEMM (fewer B panels than MIN_PANEL_TASKS) shares runs of its row tiles between threads, and
# a run must be a whole divisor of the tiles (tensorize refuses the predicate of a split that is not);
# MAX_RUNS bounds the runs (each run allocates its accumulator tile once). Tiles with no divisor of
# at least MIN_RUNS up to MAX_RUNS get padding rows until they have one (at most PAD_TILES_LIMIT of
# them): Keras MobileNetV2's 2304x96x16 had 461 tiles of 5 rows, a prime, so one run, and two threads
# ran it slower than one (29.8 / 35.4 us, Zen 4); 462 tiles = 42 runs of 11.
MIN_PANEL_TASKS = 8
MAX_RUNS = 64
MIN_RUNS = 8
PAD_TILES_LIMIT = 0.02


def best_runs(tiles: int) -> int:
    """The most runs, up to :data:`MAX_RUNS`, that divide ``tiles`` row tiles."""
    return next(d for d in range(min(MAX_RUNS, tiles), 0, -1) if tiles % d == 0)


def shares_row_tiles(n: int, panel: int, kblock: int, batch: int) -> bool:
    """Whether a GEMM of ``n`` columns in B panels of ``panel`` shares its row tiles, not its panels,
    between threads: fewer than :data:`MIN_PANEL_TASKS` panels, all of K in a tile (``kblock`` 0), no
    batch. The layout (:func:`splittable_rows`) and the schedule (``schedule.qgemm.is_narrow``) both ask."""
    return not kblock and not batch and -(-n // panel) < MIN_PANEL_TASKS


def splittable_rows(layout: "GemmLayout", problem: "QGemmProblem") -> "GemmLayout":
    """``layout`` with M padded to a number of row tiles that has a divisor of at least
    :data:`MIN_RUNS` (up to :data:`MAX_RUNS`) where it is a narrow GEMM's
    (:func:`shares_row_tiles`) and has none, by at most :data:`PAD_TILES_LIMIT` more tiles."""
    tiles = layout.mp // layout.mr
    if tiles < 2 * MIN_RUNS or not shares_row_tiles(problem.n, layout.panel, layout.kblock, problem.batch) or best_runs(tiles) >= MIN_RUNS:
        return layout
    for more in range(tiles + 1, tiles + 1 + int(PAD_TILES_LIMIT * tiles)):
        if best_runs(more) >= MIN_RUNS:
            return replace(layout, mp=more * layout.mr)
    return layout


def window_rows(mr: int, out_w: int, rows: int = 1) -> int:
    """The row tile of a GEMM read through a convolution window (:class:`ConvWindow`): the largest
    whole number of ``rows`` from ``mr / 2`` to ``mr`` that divides the output width, so that no tile
    crosses an output row and its rows' addresses are one base plus constants; ``mr`` where none does.
    Measured (AMX Xeon, 1 thread, 14400x6x216 from a 122x122x24 input): 16 rows 0.21 ms, 15 0.18, 12
    0.10 with K whole, 0.084 with K unrolled, level with the GEMM on an im2col buffer."""
    fits = [d for d in range(max(rows, (mr + 1) // 2), mr + 1) if out_w % d == 0 and d % rows == 0]
    return max(fits) if fits else mr


def _column_groups(table_nr: int, groups: int) -> int:
    """Vectors per B panel: the tile table's ``nr``, or a smaller one (down to half) that pads the
    ``groups`` vectors of N less: N = 24 is 3 ymm vectors, which ``nr`` = 2 pads to 4 (a third of the
    work wasted, and the epilogue masked); ``nr`` = 1 pads nothing."""
    nr = max(1, min(table_nr, groups))
    candidates = range(max(1, (nr + 1) // 2), nr + 1)
    return min(candidates, key=lambda r: (-(-groups // r) * r, -r))


@dataclass(frozen=True)
class GemmLayout:
    """The decision: intrinsic, tile, padded sizes, storage dtypes. Stored on the PrimFunc as attrs."""

    intrin: str
    intrin_row: str
    lanes: int
    kstep: int
    mr: int
    nr: int
    kblock: int
    a_storage: str
    a_offset: int
    b_storage: str
    mp: int
    np_: int
    kp: int
    rows: int = 1  # activation rows per instruction: > 1 keeps the accumulators in rows x lanes blocks
    # "panels": B in CPU micro-panels (:func:`pack_weights`); "nk": B as [N, K], K contiguous, the
    # operand a tensor-core mma loads with ldmatrix (GPU rows)
    b_order: str = "panels"
    block: tuple = ()  # GPU rows: the block/warp tile (block_m, block_n, block_k, warp_m, warp_n)

    @staticmethod
    def choose(problem: QGemmProblem, spec: TargetSpec, b_signed=None) -> "GemmLayout":
        """The layout the spec's device asks for: CPU rows pick the first recipe that accepts the
        weights (``b_signed``: int8 values, or None when they are only known at run time), then its
        tile for M; GPU rows their mma form and block tile."""
        return spec.backend.choose_layout(problem, spec, b_signed)

    @staticmethod
    def _choose_cpu(problem: QGemmProblem, spec: TargetSpec, b_signed=None) -> "GemmLayout":
        recipe = spec.recipe_for(b_signed, problem.n)
        symbolic = not isinstance(problem.m, int)
        tile = recipe.tile_for(SYMBOLIC_ROWS if symbolic else problem.m)
        gi = recipe.intrin
        operand = gi.operand(problem.a_dtype)
        kp = round_up(problem.k, gi.kstep)
        kblock = tile.kblock if tile.kblock and tile.kblock < kp and kp % tile.kblock == 0 else 0
        layout = tile_layout(gi, operand, tile, SYMBOLIC_ROWS if symbolic else problem.m, problem.n, kp, kblock)
        if symbolic:  # whole row tiles of an M known at run time: the last one's rows past M padded
            return replace(layout, mp=round_up(problem.m, layout.mr))
        if problem.window is None:
            return splittable_rows(rows_padding_less(layout, tile, problem.m), problem)
        mr = window_rows(layout.mr, problem.window.out_hw[1], layout.rows)
        return replace(layout, mr=mr, mp=round_up(problem.m, mr))

    @staticmethod
    def _choose_mma(problem: QGemmProblem, spec, b_signed=None) -> "GemmLayout":  # b_signed: every weight is exact on mma
        from ..cuda.mma import MMA_BY_NAME, MMA_N

        form = MMA_BY_NAME[spec.mma[problem.a_dtype]]
        t = spec.tile_for(problem.m, problem.n)
        return GemmLayout(
            intrin=form.name, intrin_row=spec.row, lanes=MMA_N, kstep=form.k, mr=t.block_m, nr=t.block_n // MMA_N,
            kblock=t.block_k, a_storage=problem.a_dtype, a_offset=0, b_storage="int8",
            mp=round_up(problem.m, t.block_m), np_=round_up(problem.n, t.block_n), kp=round_up(problem.k, t.block_k),
            b_order="nk", block=(t.block_m, t.block_n, t.block_k, t.warp_m, t.warp_n),
        )

    @property
    def panel(self) -> int:
        return self.lanes * self.nr

    @property
    def packed_shape(self) -> tuple[int, ...]:
        if self.b_order == "nk":
            return (self.np_, self.kp)
        return (self.np_ // self.panel, self.kp // self.kstep, self.nr, self.lanes, self.kstep)

    def b_index(self, n, k) -> tuple:
        """Where the weight of output column ``n`` and reduction index ``k`` lies in packed B."""
        if self.b_order == "nk":
            return (n, k)
        return (n // self.panel, k // self.kstep, (n // self.lanes) % self.nr, n % self.lanes, k % self.kstep)

    def b_logical(self, *index) -> tuple:
        """The inverse of :meth:`b_index`: ``(n, k)`` of a packed-B index."""
        if self.b_order == "nk":
            return tuple(index)
        p, kb, g, lane, ks = index
        return (p * self.panel + g * self.lanes + lane, kb * self.kstep + ks)

    def needs_prepare(self, problem: QGemmProblem) -> bool:
        if problem.window is not None:  # read in place: rows past M clamp to the last one
            return self.a_storage != problem.a_dtype or self.kp != problem.k
        if not isinstance(problem.m, int):  # a symbolic M: padded to whole row tiles
            return True
        return self.a_storage != problem.a_dtype or self.mp != problem.m or self.kp != problem.k


def pack_weights(b_signed: np.ndarray, layout: GemmLayout) -> np.ndarray:
    """``b_signed[K, N]`` (int8 values) -> the micro-panel layout ``[N/panel, K/kstep, nr, lanes, kstep]``.

    Each ``[lanes, kstep]`` slice is one contiguous intrinsic operand, and a whole panel step
    (``nr * lanes * kstep`` bytes) is contiguous, so the inner loop streams one B panel.
    """
    k, n = b_signed.shape
    padded = np.zeros((layout.kp, layout.np_), layout.b_storage)
    padded[:k, :n] = b_signed
    if layout.b_order == "nk":
        return np.ascontiguousarray(padded.T)
    npanel, kb = layout.np_ // layout.panel, layout.kp // layout.kstep
    t = padded.T.reshape(npanel, layout.nr, layout.lanes, kb, layout.kstep)
    return np.ascontiguousarray(t.transpose(0, 3, 1, 2, 4))


def _pad_vec(v: np.ndarray, n: int, dtype) -> np.ndarray:
    out = np.zeros((n,), dtype)
    out[: v.shape[0]] = v
    return out


def epilogue_params(problem: QGemmProblem, layout: GemmLayout, corr, rowcoef, scale, fbias=None, zcoef=None,
                    with_out_range: bool = True):
    """The per-column constant arrays the PrimFunc takes after packed B, padded to ``np_``, then the
    requantization's ``out_range`` (:func:`out_range_param`; ``with_out_range=False`` leaves it out).

    ``corr=None``: the weights are packed at run time, which makes ``corr`` too (:mod:`.pack_b`).
    """
    np_ = layout.np_
    params = [] if corr is None else [_pad_vec(np.asarray(corr, np.int32), np_, np.int32)]
    if problem.runtime_a_zero_point:
        params.append(_pad_vec(np.asarray(zcoef, np.int32), np_, np.int32))
    if problem.row_term:
        params.append(_pad_vec(np.asarray(rowcoef, np.int32), np_, np.int32))
    ep = problem.epilogue
    if ep.kind == "requant" and ep.mode == "fixed_point":
        from ..quant.requant import fixed_point_multiplier

        mult, shift = fixed_point_multiplier(np.broadcast_to(scale, (problem.n,)))
        params += [_pad_vec(mult, np_, np.int32), _pad_vec(shift, np_, np.int32)]
    elif ep.kind in ("requant", "float"):
        params.append(_pad_vec(np.broadcast_to(np.asarray(scale, np.float32), (problem.n,)), np_, np.float32))
        if ep.kind == "float":
            fb = np.zeros(problem.n, np.float32) if fbias is None else np.asarray(fbias, np.float32)
            params.append(_pad_vec(np.broadcast_to(fb, (problem.n,)), np_, np.float32))
    return params + (out_range_param(ep) if with_out_range else [])


def out_range_param(ep: Epilogue) -> list[np.ndarray]:
    """A requantizing qgemm's last parameter, ``out_range = [zero_point, qmin, qmax]`` (int32): kernels
    of one shape whose layers differ only in these (a transformer's 12 layers) are one kernel, built
    once; [] for the other epilogues."""
    return [np.array([ep.zero_point, ep.qmin, ep.qmax], np.int32)] if ep.kind == "requant" else []


def requantize(acc, ep: Epilogue, mult, shift=None, out_range=None):
    """The requantizing epilogue of one int32 accumulator value (TE expression); ``shift`` in
    ``"fixed_point"`` mode, where ``mult`` is the int32 multiplier; ``out_range``: the kernel's
    ``[zero_point, qmin, qmax]`` parameter (:func:`out_range_param`), else ``ep``'s values inline."""
    if ep.mode == "fixed_point":
        return _requant_fixed(acc, mult, shift, ep, out_range)
    return _requant_float(acc, mult, ep, out_range)


def target_round_to_int() -> str | None:
    """The CPU rows' float-to-int conversion (:attr:`~tvm_lowprec.hwspec.TargetSpec.round_to_int`) when
    the module is built for an LLVM target (the ``with target`` of :func:`tvm_lowprec.compile`); None
    for CUDA or without a target (round, then convert)."""
    target = tvm.target.Target.current(allow_none=True)
    return TargetSpec.round_to_int if target is not None and target.kind.name == "llvm" else None


def quantize_linear(y, scale: float, zero_point: int, qmin: int, qmax: int, out_dtype: str,
                    round_to_int: str | None = None, bounds: tuple[float, float] | None = None):
    """ONNX QuantizeLinear of a float32 TE value (or vector): ``clamp(rint(y / scale) + zero_point)``, half to even.

    ``round_to_int``: an LLVM intrinsic converting float32 to int32 in the current rounding mode
    (:attr:`~tvm_lowprec.hwspec.TargetSpec.round_to_int`): the value is clamped to ``[qmin - zp, qmax -
    zp]`` first, converted, and the zero point added to the integer (the same codes: rounding is monotone
    and fixes integers), one instruction fewer than rounding and converting apart. ``bounds``: an
    interval ``y`` is known to lie in; a clamp it cannot reach is left out."""
    sy = tirx.const(np.float32(scale), "float32")
    v = y if float(np.float32(scale)) == 1.0 else y / sy
    ty = str(v.ty)  # a vector (float32x16): the casts keep its lanes
    lanes = ty[ty.index("x"):] if "x" in ty else ""
    lo, hi = float(qmin - zero_point), float(qmax - zero_point)
    keep_lo = keep_hi = True
    if bounds is not None:  # the clamps ``rint(y / scale)`` cannot reach (with 2^-20 of slack for float32's rounding)
        low, high = (float(b) / float(np.float32(scale)) for b in bounds)
        keep_lo = np.rint(low - abs(low) * 2.0**-20) < lo
        keep_hi = np.rint(high + abs(high) * 2.0**-20) > hi
    if keep_hi:
        v = tirx.min(v, hi)
    if keep_lo:
        v = tirx.max(v, lo)
    if round_to_int:
        q = tirx.call_llvm_pure_intrin("int32" + lanes, round_to_int, v)
        if zero_point:
            q = q + int(zero_point)
    else:
        q = tirx.round(v)  # LLVM nearbyint: half to even
        if zero_point:
            q = q + tirx.const(float(zero_point), "float32")
        q = q.astype("int32" + lanes)
    return q.astype(out_dtype + lanes)


def _out_range(ep: Epilogue, out_range=None):
    """``(zero_point, qmin, qmax)`` of a requantizing epilogue: Python ints from ``ep``, or the loads of
    a kernel's ``out_range`` parameter (:func:`out_range_param`) where it has one."""
    if out_range is None:
        return ep.zero_point, ep.qmin, ep.qmax
    return out_range[0], out_range[1], out_range[2]


def _as(value, dtype: str):
    return tirx.const(value, dtype) if isinstance(value, int) else value.astype(dtype)


def _requant_float(x, mult, ep: Epilogue, out_range=None):
    # int32 -> float64 is exact, and the product rounds once: the same as onnx.reference's
    # QLinearMatMul (float32 multiplier, float64 product, rint = half to even).
    zp, lo, hi = (_as(v, "float64") for v in _out_range(ep, out_range))
    y = tirx.round(x.astype("float64") * mult.astype("float64"))  # LLVM nearbyint: half to even
    y = tirx.max(tirx.min(y + zp, hi), lo)
    return y.astype("int32").astype(ep.out_dtype)


_ROUND_MAGIC = 12582912.0  # 1.5 * 2**23: float32 values in [2**23, 2**24) are the integers


def float32_requant_exact(column_abs_sum, a_reach: float, bias, mult) -> bool:
    """Whether :func:`requant_f32` equals the float64 requantization for every input: per output
    column, the sum ``|total| <= a_reach * column_abs_sum + |bias|`` (``a_reach``: the largest
    ``|a - za|``; ``column_abs_sum``: ``sum_k |w - zw|``) stays below 2**24, where int32 -> float32 is
    exact, and its product with ``|mult|`` below 2**22, where the rounding trick works."""
    bound = float(a_reach) * np.asarray(column_abs_sum, np.float64) + np.abs(np.asarray(bias, np.float64))
    mult = np.abs(np.asarray(mult, np.float64))
    return bool(np.all(np.isfinite(mult)) and np.all(bound < 2.0**24) and np.all(bound * mult < 2.0**22))


def requant_f32(x, ep: Epilogue, mult, out_range=None):
    """The ``"float"`` requantization (``rint(float64(x) * mult)``, half to even, then the zero point and
    the clamp), exact where :func:`float32_requant_exact` holds: ``x`` converts to float32 exactly, and
    one fused multiply-add rounds the exact ``x * mult + 1.5 * 2**23`` once, to an integer of
    ``[2**23, 2**24)`` (float32's spacing there is 1) for ``|x * mult| < 2**22``: ``rint(x * mult)`` half
    to even, as the magic number is even. Its bits minus the magic's bits are that integer (the zero
    point folded into the subtraction). A conversion, an FMA and an integer subtraction per 8 lanes,
    where float64 costs two conversions each way at 4 lanes (about a cycle per output on Zen 3)."""
    p = tirx.call_llvm_pure_intrin("float32", "llvm.fma", x.astype("float32"), mult,
                                   tirx.const(_ROUND_MAGIC, "float32"))
    magic_bits = int(np.array(_ROUND_MAGIC, np.float32).view(np.int32))
    zp, lo, hi = _out_range(ep, out_range)
    n = tirx.reinterpret("int32", p) - (magic_bits - zp)
    return tirx.max(tirx.min(n, hi), lo).astype(ep.out_dtype)


def _requant_fixed(x, mult, shift, ep: Epilogue, out_range=None):
    zp, lo, hi = (_as(v, "int64") for v in _out_range(ep, out_range))
    prod = x.astype("int64") * mult.astype("int64")
    total = shift + 31
    rounded = (prod + (tirx.const(1, "int64") << (total - 1).astype("int64"))) >> total.astype("int64")
    y = tirx.max(tirx.min(rounded + zp, hi), lo)
    return y.astype(ep.out_dtype)


def build_qgemm(problem: QGemmProblem, layout: GemmLayout, name: str = "qgemm"):
    """The unscheduled PrimFunc.

    Arguments: A, [a_zero_point int32[1] when runtime], packed B, epilogue params (see
    :func:`epilogue_params`), out. With ``problem.batch``, A, packed B, ``corr`` and out gain a
    leading batch axis (``corr`` then comes from :func:`build_pack_b` at run time); with
    ``problem.grouped`` every epilogue parameter has it too, and out is ``[M, batch, N]``.
    """
    p, lay = problem, layout
    lead = (p.batch,) if p.batch else ()
    A = te.placeholder(lead + (p.m, p.k) if p.window is None else p.window.shape, p.a_dtype, name="A")
    a_zp = te.placeholder((1,), "int32", name="a_zero_point") if p.runtime_a_zero_point else None
    Bp = te.placeholder(lead + lay.packed_shape, lay.b_storage, name="B_packed")
    corr = te.placeholder(lead + (lay.np_,), "int32", name="corr")
    args = [A] + ([a_zp] if a_zp is not None else []) + [Bp, corr]
    terms = [lambda b, m, n: corr[(*b, n)]]
    if a_zp is not None:
        zcoef = te.placeholder((lay.np_,), "int32", name="zcoef")
        args.append(zcoef)
        terms.append(lambda b, m, n: a_zp[0] * zcoef[n])
    if p.row_term and p.rowsum_input:
        rowsum = te.placeholder(lead + (p.m,), "int32", name="rowsum")
        args.insert(args.index(corr) + 1, rowsum)
    acc = _gemm(p, lay, A, Bp, len(lead))
    if p.row_term:
        rowcoef, in_kernel = _row_sum(p, A, lay.np_, len(lead))
        rowsum = rowsum if p.rowsum_input else in_kernel
        args.append(rowcoef)
        terms.append(lambda b, m, n: rowcoef[n] * (rowsum[(*b, m)] + lay.a_offset * p.k))

    R, L = lay.rows, lay.lanes

    def total(b, m, n):
        # rows > 1: the accumulator is blocked, gemm[.., m / rows, n / lanes, m % rows, n % lanes]
        x = acc[(*b, m, n)] if R == 1 else acc[(*b, m // R, n // L, m % R, n % L)]
        for term in terms:
            x = x + term(b, m, n)
        return x

    params, out = _epilogue(p, lay, total, len(lead))
    func = te.create_prim_func(args + params + [out])
    return func.with_attr("global_symbol", name).with_attrs(_decision_attrs(problem, layout))


def _gemm(p: QGemmProblem, lay: GemmLayout, A, Bp, nb: int):
    """``gemm[b.., m, n] = sum_k A'[b.., m, k] * B'`` over the padded problem (A padded if needed)."""
    a_src = A
    if p.window is not None and lay.needs_prepare(p):
        raise ValueError(f"a GEMM through a convolution window reads its A as stored: {lay.a_storage} from "
                         f"{p.a_dtype}, K {p.k} padded to {lay.kp}")
    if p.window is None and lay.needs_prepare(p):
        def prep(*i):
            b, (m, kk) = i[:nb], i[nb:]
            inside = tirx.all(m < p.m, kk < p.k)
            value = A[(*b, tirx.min(m, p.m - 1), tirx.min(kk, p.k - 1))].astype(lay.a_storage)
            return tirx.if_then_else(inside, value, tirx.const(0, lay.a_storage))

        a_src = te.compute(tuple(A.shape[:nb]) + (lay.mp, lay.kp), prep, name="A_prepared")

    def read_a(b, m, kk):  # through the window: rows past M (the last tile's) read row M - 1
        if p.window is None:
            return a_src[(*b, m, kk)]
        return A[p.window.a_index(m if lay.mp == p.m else tirx.min(m, p.m - 1), kk, *b)]

    k = te.reduce_axis((0, lay.kp), name="k")
    L, R = lay.lanes, lay.rows

    def product(b, m, n):
        a = read_a(b, m, k).astype("int32")
        a = a + lay.a_offset if lay.a_offset else a
        return te.sum(a * Bp[(*b, *lay.b_index(n, k))].astype("int32"), axis=k)

    lead = (p.batch,) if nb else ()
    if R == 1:
        return te.compute(lead + (lay.mp, lay.np_), lambda *i: product(i[:nb], *i[nb:]), name="gemm")
    # a matrix instruction writes a rows x lanes block: the accumulator is stored blocked, so each
    # instruction's block is contiguous ([M / rows, N / lanes, rows, lanes])
    return te.compute(lead + (lay.mp // R, lay.np_ // L, R, L),
                      lambda *i: product(i[:nb], i[nb] * R + i[nb + 2], i[nb + 1] * L + i[nb + 3]), name="gemm")


def _row_sum(p: QGemmProblem, A, np_: int, nb: int):
    rowcoef = te.placeholder((np_,), "int32", name="rowcoef")
    kr = te.reduce_axis((0, p.k), name="kr")
    rowsum = te.compute(tuple(A.shape[:nb]) + (p.m,), lambda *i: te.sum(A[(*i, kr)].astype("int32"), axis=kr), name="rowsum")
    return rowcoef, rowsum


def _epilogue(p: QGemmProblem, lay: GemmLayout, total, nb: int):
    """(parameter placeholders, output tensor) for the problem's epilogue kind."""
    ep = p.epilogue
    lead = (p.batch,) if p.grouped else ()

    def per_column(*names_dtypes):
        return [_Indexed(te.placeholder(lead + (lay.np_,), dtype, name=n), p.grouped) for n, dtype in names_dtypes]

    def out(fn):
        if p.grouped:  # [M, group, N]: the NHWC channels of a grouped convolution, group-major
            return te.compute((p.m, p.batch, p.n), lambda m, g, n: fn((g,), m, n), name="epilogue")
        shape = ((p.batch,) if nb else ()) + (p.m, p.n)
        return te.compute(shape, lambda *i: fn(i[:nb], i[nb], i[nb + 1]), name="epilogue")

    if ep.kind == "int32":
        return [], out(total)
    if ep.kind == "float":
        scale, fbias = per_column(("scale", "float32"), ("fbias", "float32"))
        return [scale.t, fbias.t], out(lambda b, m, n: total(b, m, n).astype("float32") * scale(b, n) + fbias(b, n))
    # the zero point and clamp bounds a parameter, not immediates: layers of one shape share a kernel
    out_range = te.placeholder((3,), "int32", name="out_range")
    if ep.mode == "fixed_point":
        mult, shift = per_column(("mult", "int32"), ("shift", "int32"))
        return [mult.t, shift.t, out_range], out(lambda b, m, n: _requant_fixed(total(b, m, n), mult(b, n), shift(b, n),
                                                                                 ep, out_range))
    (mult,) = per_column(("mult", "float32"))
    if p.requant_f32:
        return [mult.t, out_range], out(lambda b, m, n: requant_f32(total(b, m, n), ep, mult(b, n), out_range))
    return [mult.t, out_range], out(lambda b, m, n: _requant_float(total(b, m, n), mult(b, n), ep, out_range))


@dataclass(frozen=True)
class _Indexed:
    """A per-column parameter, read at column ``n`` of batch ``b`` where it is per group."""

    t: te.Tensor
    per_batch: bool

    def __call__(self, b, n):
        return self.t[(*b, n)] if self.per_batch else self.t[n]


def _decision_attrs(problem: QGemmProblem, layout: GemmLayout) -> dict:
    return {
        "lowprec.op": "qgemm",
        "lowprec.intrin": layout.intrin,
        "lowprec.intrin_row": layout.intrin_row,
        "lowprec.shape": [problem.m, problem.n, problem.k],
        "lowprec.tile": [layout.mr, layout.nr, layout.kblock],
        "lowprec.vector": [layout.lanes, layout.kstep],
        "lowprec.rows": layout.rows,
        "lowprec.b_storage": layout.b_storage,
        "lowprec.a_dtype": problem.a_dtype,
        "lowprec.epilogue": problem.epilogue.kind,
        "lowprec.requant": "float32" if problem.requant_f32 else problem.epilogue.mode,
        "lowprec.batch": problem.batch,
        **({"lowprec.grouped": 1} if problem.grouped else {}),
        "lowprec.block": list(layout.block),
        **({"lowprec.window": problem.window.attr()} if problem.window is not None else {}),
    }

