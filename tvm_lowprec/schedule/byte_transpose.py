"""Schedule rule for data movement that is a (batched) 2-D transpose of 8-bit values, whatever
reshapes and axis permutations the graph wrote it as (a detector head's ``reshape -> transpose`` of
NHWC codes to NCHW, the DFL head's ``transpose -> reshape``): ``y[b, s, r] = x[b, r, s]`` over the
flattened buffers.

TVM's loops read or write one byte per lane at a stride: a 6400x16 -> 16x6400 transpose took 17-19 us
on the AMX Xeon (13 % of its copy bandwidth). Here each step moves a tile of ``T`` positions along the
long axis and the whole short axis, ``T * short`` bytes, through registers: the contiguous side as
vectors, the other as ``short`` vectors of ``T`` bytes, each a constant shuffle of the loaded ones,
which LLVM lowers to the target's byte permutes (``vpermt2b``/``vpermb`` with AVX-512 VBMI,
``vpshufb`` and blends on AVX2, ``tbl`` on Neon)::

    for tile in parallel(B * long / T):       # serial below 64 KiB
      v_k = x[tile bytes, vector k]           # contiguous
      y[...] = shuffle(v_0 .. v_n, constant)  # one vector per short index

The permutation is found by evaluating the function's index expressions on every output position
(numpy), so any chain of copies (reshape, transpose, squeeze) qualifies; declines a function that
computes anything, reads more than one buffer, or whose permutation is not such a transpose, or
whose short axis exceeds 64 or whose long axis no tile of 16 divides.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import tirx
from tvm.ir.expr import TensorLoad as _Load  # what tirx.BufferLoad makes in TVM 0.27
from tvm.tirx import expr as E
from tvm.s_tir import SBlock, SBlockRealize, Schedule

EIGHT_BIT = ("uint8", "int8")
_TILES = (64, 32, 16)  # positions along the long axis per step, widest first
_MAX_SHORT = 64
CHUNK_ROWS = 16  # rows per step where the columns come 16 at a time (a 16x16 byte tile)
_MAX_TILE_BYTES = 1024  # what a step holds in registers (16 zmm)
_MIN_PARALLEL = 1 << 16  # bytes


def evaluate_index(expr, env):
    """A TIR integer index expression over numpy arrays ``env`` (var -> array), or None if it has
    anything but variables, integer constants, +, -, *, floordiv, floormod and casts."""
    if isinstance(expr, E.Var):
        return env.get(expr)
    if isinstance(expr, E.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, E.Cast):
        return evaluate_index(expr.value, env)
    ops = {E.Add: np.add, E.Sub: np.subtract, E.Mul: np.multiply, E.FloorDiv: np.floor_divide, E.FloorMod: np.mod}
    for kind, fn in ops.items():
        if isinstance(expr, kind):
            a, b = evaluate_index(expr.a, env), evaluate_index(expr.b, env)
            return None if a is None or b is None else fn(a, b)
    return None


def _copies(stmt, loops, found):
    """Every block under ``stmt`` as (loop vars and extents, its realize); False where a statement is
    not a loop nest of blocks."""
    if isinstance(stmt, tirx.SeqStmt):
        return all(_copies(s, loops, found) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        if not isinstance(stmt.min, E.IntImm) or stmt.min.value != 0 or not isinstance(stmt.extent, E.IntImm):
            return False
        return _copies(stmt.body, [*loops, (stmt.loop_var, int(stmt.extent.value))], found)
    if isinstance(stmt, SBlockRealize):
        block = stmt.block
        if block.name_hint == "root" and not block.iter_vars:
            return _copies(block.body, loops, found)
        found.append((loops, stmt))
        return True
    return False


def _is_copy(block) -> bool:
    """A spatial block whose body stores one loaded value, unchanged."""
    store = block.body
    return (block.init is None and isinstance(store, tirx.BufferStore) and isinstance(store.value, _Load)
            and all(iv.iter_type == 0 for iv in block.iter_vars))


def _flat(indices, shape):
    flat = np.int64(0)
    for i, e in zip(indices, shape):
        flat = flat * int(e) + i
    return flat


def source_positions(func):
    """For each element of the output (flattened), the flattened position of the input element it
    copies, or None where ``func`` is not a chain of 8-bit copies of its one input."""
    if len(func.params) != 2:
        return None
    x, y = func.params
    if str(x.dtype) != str(y.dtype) or str(x.dtype) not in EIGHT_BIT:
        return None
    shapes = {}
    for buf in (x, y):
        if not all(isinstance(e, E.IntImm) for e in buf.shape):
            return None
        shapes[buf] = [int(e.value) for e in buf.shape]
    if math.prod(shapes[x]) != math.prod(shapes[y]):
        return None
    found = []
    if not _copies(func.body, [], found) or not found or not all(_is_copy(realize.block) for _, realize in found):
        return None  # every block checked before any is evaluated (this runs on every injective function)
    writer = {}  # buffer -> (its source buffer, source flat position of each of its elements)
    for loops, realize in found:
        block = realize.block
        store = block.body
        grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for _, e in loops], indexing="ij") if loops else []
        env = {var: g.reshape(-1) for (var, _), g in zip(loops, grids)}
        size = int(np.prod([e for _, e in loops])) if loops else 1
        values = [evaluate_index(v, env) for v in realize.iter_values]
        if any(v is None for v in values):
            return None
        env = {iv.var: np.broadcast_to(v, (size,)) for iv, v in zip(block.iter_vars, values)}
        load = store.value
        dst = [evaluate_index(i, env) for i in store.indices]
        src = [evaluate_index(i, env) for i in load.indices]
        if any(i is None for i in dst + src):
            return None
        shape_of = lambda buf: shapes.get(buf, [int(e) for e in buf.shape])  # noqa: E731
        flat_dst = np.broadcast_to(_flat(dst, shape_of(store.buffer)), (size,))
        flat_src = np.broadcast_to(_flat(src, shape_of(load.source)), (size,))
        n = math.prod(shape_of(store.buffer))
        if store.buffer in writer or size != n or len(np.unique(flat_dst)) != n:
            return None
        positions = np.empty(n, np.int64)
        positions[flat_dst] = flat_src
        writer[store.buffer] = (load.source, positions)
    positions, buf = np.arange(math.prod(shapes[y]), dtype=np.int64), y
    for _ in range(len(writer)):  # follow the chain back to the input
        if buf not in writer:
            return None
        buf, step = writer[buf]
        positions = step[positions]
        if buf.same_as(x):
            return positions
    return None


def transpose_of(positions):
    """``(B, R, S)`` where ``positions`` is ``y[b, s, r] = x[b, r, s]`` with ``R, S > 1``, else None."""
    n = len(positions)
    if n < 4:
        return None
    s = int(positions[1])  # y[0, 0, 1] = x[0, 1, 0]
    hits = np.flatnonzero(positions == 1)  # y[0, 1, 0] = x[0, 0, 1]
    if s <= 1 or not len(hits) or int(hits[0]) <= 1:
        return None
    r = int(hits[0])
    if n % (r * s):
        return None
    b = n // (r * s)
    want = np.arange(n, dtype=np.int64).reshape(b, r, s).transpose(0, 2, 1).reshape(-1)
    return (b, r, s) if np.array_equal(positions, want) else None


def build_byte_transpose(b: int, r: int, s: int, x_param, y_param, name: str):
    """``y[b, s, r] = x[b, r, s]`` over the flattened buffers ``x_param``, ``y_param`` (of any shapes
    holding ``b*r*s`` 8-bit values). One step takes ``T`` rows (of ``r``) and ``C`` columns (of ``s``):
    all ``s`` where ``s <= 64`` (the tile is then contiguous), else 16; it loads the ``T x C`` bytes
    and stores ``C`` vectors of ``T`` bytes, each a constant shuffle of the loaded vectors. Columns in
    chunks of 16 take rows in tiles of 16 and the remainder (``r % 16`` rows) a byte at a time
    (Whisper's K transpose, 250 frames x 384: 40 -> 7.6 us, Zen 4, one thread, alone). None where
    ``s > 64`` and 16 does not divide it, no ``T`` divides ``r`` (``s <= 64``), or ``s < r`` is short enough for
    LLVM's own interleaving stores (measured: the DFL head's 4x32000 -> 32000x4 ran 4.2 us this way
    against 3.1 us)."""
    cols = s if s <= _MAX_SHORT else 16 if s % 16 == 0 else None
    if cols is None:
        return None
    tiles = _TILES if cols == s else (CHUNK_ROWS,)
    rows = next((t for t in tiles if r % t == 0 and t * cols <= _MAX_TILE_BYTES), None)
    tail = 0  # rows past the last whole tile, copied a byte at a time
    if rows is None and cols != s and r > CHUNK_ROWS:  # columns in chunks: the rows' remainder apart
        rows, tail = CHUNK_ROWS, r % CHUNK_ROWS
    if rows is None:
        return None
    n, dtype = b * r * s, str(x_param.dtype)
    x_param = tirx.decl_buffer(x_param.shape, dtype, "x")
    y_param = tirx.decl_buffer(y_param.shape, dtype, "y")
    x = tirx.decl_buffer((n,), dtype, "x_flat", data=x_param.data)  # flat views of the parameters
    y = tirx.decl_buffer((n,), dtype, "y_flat", data=y_param.data)
    step = tirx.Var("step", "int32")
    row_tiles, col_tiles = r // rows, s // cols
    batch, rest = step // (row_tiles * col_tiles), step % (row_tiles * col_tiles)
    r0, c0 = rest // col_tiles * rows, rest % col_tiles * cols
    base = batch * (r * s)
    stmts, loaded = [], []
    if cols == s:  # the tile is contiguous: vectors of up to 64 bytes
        width = next(w for w in (64, 32, 16, 8, 4, 2, 1) if (rows * cols) % w == 0)
        starts = [base + r0 * s + k * width for k in range(rows * cols // width)]
    else:  # a row's C bytes at a time
        width = cols
        starts = [base + (r0 + p) * s + c0 for p in range(rows)]
    for k, start in enumerate(starts):
        v = tirx.Var(f"v{k}", f"{dtype}x{width}")
        stmts.append(tirx.Bind(v, tirx.BufferLoad(x, [tirx.Ramp(start, 1, width)])))
        loaded.append(v)
    for c in range(cols):  # column c0 + c of rows r0 .. r0 + T: byte p * C + c of the loaded tile
        picks = [tirx.IntImm("int32", p * cols + c) for p in range(rows)]
        stmts.append(tirx.BufferStore(y, tirx.Shuffle(loaded, picks), [tirx.Ramp(base + (c0 + c) * r + r0, 1, rows)]))
    kind = tirx.ForKind.PARALLEL if n >= _MIN_PARALLEL else tirx.ForKind.SERIAL
    loops = [tirx.For(step, 0, b * row_tiles * col_tiles, kind, tirx.SeqStmt(stmts))]
    if tail:  # for each column, the last `tail` rows' bytes: y[b, c, R + p] = x[b, R + p, c]
        t, first = tirx.Var("t", "int32"), row_tiles * rows
        tb, tc = t // s, t % s
        copies = [tirx.BufferStore(y, tirx.BufferLoad(x, [tb * (r * s) + (first + p) * s + tc]),
                                   [tb * (r * s) + tc * r + first + p]) for p in range(tail)]
        loops.append(tirx.For(t, 0, b * s, tirx.ForKind.SERIAL, copies[0] if tail == 1 else tirx.SeqStmt(copies)))
    body = tirx.SeqStmt([tirx.DeclBuffer(x, data=x_param.data), tirx.DeclBuffer(y, data=y_param.data), *loops])
    whole = lambda buf: tirx.BufferRegion(buf, [tvm.ir.Range(0, e) for e in buf.shape])  # noqa: E731
    # the regions on the root block: what the profile counts as read and written (the body reads views)
    body = SBlockRealize([], True, SBlock([], [whole(x_param)], [whole(y_param)], "root", body))
    return tirx.PrimFunc([x_param, y_param], body).with_attrs(
        {"global_symbol": name, "tir.noalias": True, "lowprec.layout": f"transpose {b}x{r}x{s}, tiles of {rows}x{cols}"})


class ByteTransposeRule:
    def apply(self, func, spec):
        attrs = dict(func.attrs) if func.attrs is not None else {}
        if attrs.get("lowprec.op", None) is not None:
            return None
        positions = source_positions(func)
        found = None if positions is None else transpose_of(positions)
        if found is None:
            return None
        x, y = func.params
        kernel = build_byte_transpose(*found, x, y, str(attrs.get("global_symbol", "transpose")))
        if kernel is None:
            return None
        attrs.update(dict(kernel.attrs))
        return Schedule(kernel.with_attrs(attrs))


