"""Softmax over one axis of an 8-bit tensor (the last, or any other: a DFL head's bins), to an 8-bit
tensor.

With ``x = s * (q - z)`` per tensor, ``exp(x_j - max_k x_k) = exp(-s * (q_max - q_j))``: the row's
maximum is taken on the integers, and the exponential of ``t = -s * d`` (``d = q_max - q_j``, 0..255;
``s * d`` rounded to float32 as a float softmax's subtraction would round it) is computed in the
vector lanes by :func:`neg_exp`: a range reduction to ``2^n * exp(r)``, ``|r| <= ln2 / 2``, and a
degree-7 polynomial, within 2 ulp of ``numpy.exp`` of the same ``t`` (checked over all 256 ``d`` for
scales from 1e-3 to 10 by the tests). The row sum, the division and the output quantization
(``rint(e / sum / sy) + zy``, clamped) are float32 as ONNX's Softmax followed by QuantizeLinear. No
float tensor is read or written: the kernel reads the 8-bit scores and writes the 8-bit probabilities.

A 256-entry table of the exponentials (the first form of this kernel) costs a gather per element:
``vgatherdps`` at best, which made the attention softmax of a BERT-base layer (1x12x128x128) 0.19 ms
on the Zen 5 host at one thread against 0.06 ms computed.

Where the row has a register permute (:class:`~tvm_lowprec.hwspec.RegisterPermute`, ``vpermps``),
:func:`build_qsoftmax_vectors` writes the same kernel with the exponentials from two 16-entry tables
held in registers (:mod:`tvm_lowprec.intrin.permute`): the same row maximum, the same per-lane
partial sums (in k order), the lanes then combined by a butterfly (the scheduled kernel adds them in
lane order: a sum's last bit may differ), the same division and quantization, exponentials within 2
ulp of the exact ones. It is written as vector code (each row's, or each vector of rows', values
bound once, the loop over the reduced axis unrolled; ROWS_PER_ITEM rows interleaved) and needs no
schedule; :class:`~tvm_lowprec.schedule.softmax_vectors.VectorSoftmaxRule`
picks it (per-kernel figures: ``benchmarks/results/xeon-amx-2core/profiles-2026-12-03.md``).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import te, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..intrin.permute import TABLE, table_lookup, table_registers
from .qgemm import quantize_linear


# ln 2 split so that n * LN2_HI is exact in float32 for |n| < 2^8 (LN2_HI has 16 significant bits)
LN2_HI, LN2_LO = 0.693145751953125, 1.428606765330187e-06
_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(7, -1, -1))  # exp(r), Horner order, degree 7
_MIN_EXPONENT = -126  # below 2^-126 (t < -87.3) the result is 0: a probability no 8-bit output resolves


def neg_exp(d, scale: float):
    """``exp(-scale * d)`` in float32 for an int32 expression ``d >= 0``: ``t = -scale * d``, ``n =
    round(t / ln2)``, ``r = t - n ln2`` (in two parts), ``exp(r)`` by Horner's rule and ``2^n`` built
    in the exponent bits; 0 where ``2^n`` would be subnormal."""
    f32 = lambda v: tirx.const(float(np.float32(v)), "float32")  # noqa: E731
    t = f32(-scale) * d.astype("float32")
    n = tirx.round(t * f32(1 / math.log(2)))
    r = t - n * f32(LN2_HI) - n * f32(LN2_LO)
    p = f32(_TAYLOR[0])
    for c in _TAYLOR[1:]:
        p = p * r + f32(c)
    k = n.astype("int32")
    two_n = tirx.reinterpret("float32", tirx.shift_left(tirx.max(k, _MIN_EXPONENT) + 127, 23))
    return tirx.Select(k < _MIN_EXPONENT, f32(0.0), p * two_n)


def build_qsoftmax(shape, in_dtype: str, in_scale: float, out_dtype: str, out_scale: float, out_zero_point: int,
                   qmin: int, qmax: int, name: str = "qsoftmax", axis: int = -1):
    """Arguments: ``x`` ``shape`` in ``in_dtype`` (scale ``in_scale``: its zero point cancels) and the
    output ``shape`` in ``out_dtype``; the softmax runs along ``axis``."""
    shape = tuple(int(s) for s in shape)
    axis = axis % len(shape)
    lead, n = shape[:axis] + shape[axis + 1:], shape[axis]

    def at(i, v):  # the full index of reduced index ``i`` (the axis dropped) with ``v`` on the axis
        return (*i[:axis], v, *i[axis:])

    def reduced(i):  # the reduced index of a full index
        return (*i[:axis], *i[axis + 1:])

    x = te.placeholder(shape, in_dtype, name="x")
    j = te.reduce_axis((0, n), "j")
    top = te.compute(lead, lambda *i: te.max(x[at(i, j)].astype("int32"), axis=j), name="row_max")
    e = te.compute(shape, lambda *i: neg_exp(top[reduced(i)] - x[i].astype("int32"), in_scale), name="exp")
    k = te.reduce_axis((0, n), "k")
    total = te.compute(lead, lambda *i: te.sum(e[at(i, k)], axis=k), name="row_sum")
    # one division per row, not two per element (a DFL head's 4-bin rows: 4 elements a row): the
    # probability and its quantization as one product, exp x 1 / (sum x scale)
    inverse = te.compute(lead, lambda *i: tirx.const(1.0, "float32") / (total[i] * tirx.const(np.float32(out_scale),
                                                                                             "float32")),
                         name="row_scale")

    def out(*i):
        return quantize_linear(e[i] * inverse[reduced(i)], 1.0, out_zero_point, qmin, qmax, out_dtype)

    y = te.compute(shape, out, name="out")
    func = te.create_prim_func([x, y])
    attrs = {"lowprec.op": "qsoftmax", "op_pattern": 8, "lowprec.axis": axis,
             "lowprec.softmax": [float(in_scale), float(out_scale), int(out_zero_point), int(qmin), int(qmax)]}
    return func.with_attr("global_symbol", name).with_attrs(attrs)


# rows of a work item along the last axis, interleaved (their latency chains overlap): a 128-element row
# alone is 41 us for 1536 rows on Zen 4, four at a time 35 us. At most MAX_INTERLEAVED vectors in all:
# the compile time grows faster than the code (Whisper's 250-element rows, four at a time: 5.5 s a
# kernel against 1.6 s one at a time, and the encoder has four such kernels)
ROWS_PER_ITEM = 4
MAX_INTERLEAVED = 32
_MAX_UNROLLED = 64  # vectors per work item: a longer row takes the loop form (more bins: the scheduled kernel)
_MIN_PARALLEL = 1 << 12  # elements: below this the work items run serially (a fork costs more)
_TINY = 2.0 ** -60  # table entries below this are 0: the exponentials they make are below it too, which a
# sum with its maximum's exp(0) = 1 cannot see, and no product of two kept entries is subnormal


def exp_tables(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``H[h] = exp(-16 s h)`` and ``L[l] = exp(-s l)`` (``s`` the float32 ``scale``), float64 rounded
    to float32: ``exp(-s d) = H[d >> 4] * L[d & 15]`` for ``d`` in 0..255. Entries below 2^-60 are 0,
    so a product is 0 only where the exponential is below 2^-60 and never subnormal (a subnormal
    multiply costs a microcode assist on Intel cores)."""
    s = float(np.float32(scale))
    high = np.exp(-s * TABLE * np.arange(TABLE)).astype(np.float32)
    low = np.exp(-s * np.arange(TABLE)).astype(np.float32)
    for table in (high, low):
        table[table < _TINY] = 0
    return high, low


def _opaque(value):
    """``value``, through an identity that TVM's simplifier does not inline (LLVM's ``ssa.copy``): a
    value bound once and read by every vector of the row stays one value, where inlining it into each
    reader made the statement simplifier's work grow with the square of the row's vectors (a row of
    128 on ymm: 53 s to compile)."""
    return tirx.call_llvm_intrin(str(value.ty), "llvm.ssa.copy", value)


def _table_exp(permute, high, low, d, bind, suffix: str):
    """``exp(-s d) = H[d >> 4] * L[d & 15]`` for an ``int32`` vector ``d`` (each index bound by
    ``bind``: the selects of a ymm lookup read it twice)."""
    lanes = permute.lanes
    splat = lambda v: tirx.Broadcast(tirx.const(v, "int32"), lanes)  # noqa: E731
    high_part = table_lookup(permute, high, bind(f"h{suffix}", d >> splat(4)))
    return high_part * table_lookup(permute, low, bind(f"l{suffix}", d & splat(15)))


def _bound_tables(permute, scale: float):
    """``(high, low, stmts)``: :func:`exp_tables`' registers, each bound once (opaque) by ``stmts``."""
    stmts, bound = [], []
    for name, table in zip(("high", "low"), exp_tables(scale)):
        registers = []
        for k, register in enumerate(table_registers(permute, table)):
            var = tirx.Var(f"{name}_table{k}", register.ty)
            stmts.append(tirx.Bind(var, _opaque(register)))
            registers.append(var)
        bound.append(registers)
    return bound[0], bound[1], stmts


def _lane_reduce(vector, lanes: int, combine, bind):
    """The lanes of ``vector`` combined, in every lane: a butterfly of log2(lanes) steps, each lane
    combined with the lane ``step`` away (``bind`` names each step's vector). A chain of scalar
    extracts (lane 0, then 1, ...) made the row's maximum a run of compares and branches and its sum
    15 dependent scalar adds: 137 cycles a 128-element row on Zen 4."""
    for step in (1 << k for k in reversed(range(lanes.bit_length() - 1))):
        partner = tirx.Shuffle([vector], [tirx.IntImm("int32", i ^ step) for i in range(lanes)])
        vector = bind(combine(vector, partner))
    return vector


def _output_scale(total, out_scale: float, lanes: int):
    """``1 / (sum * scale)`` in every lane (``total``: the sum in every lane), bound opaque (read by
    every output vector)."""
    scale = tirx.Broadcast(tirx.const(float(np.float32(out_scale)), "float32"), lanes)
    return _opaque(tirx.Broadcast(tirx.const(1.0, "float32"), lanes) / (total * scale))


def _item_index(item, extents) -> list:
    """The index of work item ``item`` over ``extents`` (row-major)."""
    index, rest = [], item
    for e in reversed(extents):
        index.insert(0, rest % e)
        rest = rest // e
    return index


def _kernel_buffers(func):
    """``(shape, x, y, item)``: the softmax's input and output buffers declared anew, and the work item."""
    x_buf, y_buf = func.params
    shape = [int(v) for v in x_buf.shape]
    return (shape, tirx.decl_buffer(shape, x_buf.dtype, "x"), tirx.decl_buffer(shape, y_buf.dtype, "y"),
            tirx.Var("item", "int32"))


def _items_func(func, x, y, item, count: int, stmts, permute):
    """The kernel: ``for item in range(count)`` around ``stmts`` (parallel where the tensor is large
    enough), in the root block Relax's analyses expect of a PrimFunc, with ``func``'s attributes."""
    kind = tirx.ForKind.PARALLEL if math.prod(int(v) for v in x.shape) >= _MIN_PARALLEL else tirx.ForKind.SERIAL
    body = tirx.For(item, 0, count, kind, tirx.SeqStmt(stmts))
    body = SBlockRealize([], True, SBlock([], [], [], "root", body))
    attrs = dict(func.attrs)
    attrs.update({"lowprec.exp": f"table_{permute.name}", "tir.noalias": True})
    return tirx.PrimFunc([x, y], body).with_attrs(attrs)


def build_qsoftmax_vectors(func, permute, round_to_int: str | None = None):
    """The softmax ``func`` (:func:`build_qsoftmax`) as vector code with the exponentials from
    :func:`exp_tables` looked up by ``permute`` (a :class:`~tvm_lowprec.hwspec.RegisterPermute`), or
    None where its shape does not fit the vectors: the last axis must be a multiple of
    ``permute.lanes`` and the vectors of a work item at most 64. Along the last axis one work item is a
    row, the lanes along it; along another axis one work item is ``lanes`` positions along the last
    axis, one vector per bin. ``round_to_int``: the row's float-to-int conversion
    (:attr:`~tvm_lowprec.hwspec.TargetSpec.round_to_int`) for the output's quantize, whose clamps are
    left out where the probabilities cannot reach them (``e_k <= sum``: at most ``1 / scale_out``)."""
    x_buf, y_buf = func.params
    shape = [int(v) for v in x_buf.shape]
    axis = int(func.attrs["lowprec.axis"])
    in_scale, out_scale, zero_point, qmin, qmax = func.attrs["lowprec.softmax"]
    lanes = permute.lanes
    n, last = shape[axis], shape[-1]
    along_row = axis == len(shape) - 1
    # along a row no vector divides (attention over 197, 250 or 1500 positions), the last vector is
    # the row's last ``lanes`` elements: it overlaps the one before, its repeated lanes left out of the
    # sum (a max does not mind them) and its stores writing the values already written
    tail = along_row and n % lanes != 0 and n >= lanes
    vectors = -(-n // lanes) if along_row else n
    if (last % lanes and not tail) or vectors > _MAX_UNROLLED:
        return None
    high, low, table_stmts = _bound_tables(permute, float(in_scale))
    vec = f"x{lanes}"
    splat = lambda v, dtype: tirx.Broadcast(tirx.const(v, dtype), lanes)  # noqa: E731
    _, x, y, item = _kernel_buffers(func)

    # the work items: every axis but the softmax's and the last, and the last in vectors of ``lanes``
    # (along the last axis: the rows, each whole, ROWS_PER_ITEM of them where they divide)
    extents = [e for i, e in enumerate(shape[:-1]) if i != axis] + ([] if along_row else [last // lanes])
    per_item = next((r for r in (ROWS_PER_ITEM, 2) if along_row and math.prod(extents) % r == 0
                     and r * vectors <= MAX_INTERLEAVED), 1)

    def emit(index):
        """The statements of one row (or one vector of positions) at ``index``."""
        stmts = []

        def bind(name, value):
            var = tirx.Var(name, value.ty)
            stmts.append(tirx.Bind(var, value))
            return var

        if along_row:  # vector k holds elements k*lanes .. of the row (the last: the row's last lanes)
            start = lambda k: n - lanes if tail and k == vectors - 1 else k * lanes  # noqa: E731
            at = lambda k: [*index, tirx.Ramp(tirx.const(start(k), "int32"), 1, lanes)]  # noqa: E731
        else:  # vector k holds bin k of ``lanes`` positions along the last axis
            def at(k):
                spatial = [*index[:-1], tirx.Ramp(index[-1] * lanes, 1, lanes)]
                return [*spatial[:axis], tirx.const(k, "int32"), *spatial[axis:]]
        codes = [bind(f"q{k}", tirx.BufferLoad(x, at(k)).astype("int32" + vec)) for k in range(vectors)]
        tops = list(codes)
        while len(tops) > 1:  # a tree: the maximum is the same in any order
            tops = [tirx.max(a, b) for a, b in zip(tops[::2], tops[1::2])] + tops[len(tops) - len(tops) % 2:]
        top = tops[0]
        if along_row:  # the row's maximum from the lanes' maxima, in every lane
            top = _opaque(_lane_reduce(bind("lane_max", top), lanes, tirx.max, lambda v: bind("max_step", v)))
        top = bind("top", top)

        exps = [bind(f"e{k}", _table_exp(permute, high, low, top - codes[k], bind, str(k))) for k in range(vectors)]
        summed = list(exps)
        if tail:  # the overlapping vector's lanes before (vectors - 1) * lanes are counted already
            fresh = tirx.Ramp(tirx.const(n - lanes, "int32"), 1, lanes) >= splat((vectors - 1) * lanes, "int32")
            summed[-1] = tirx.Select(fresh, exps[-1], splat(0.0, "float32"))
        total = summed[0]
        for e in summed[1:]:  # in k order: the scheduled kernel's order (its partial sums per lane)
            total = total + e
        if along_row:
            inverse = _output_scale(_lane_reduce(bind("lane_sum", total), lanes, lambda a, b: a + b,
                                                lambda v: bind("sum_step", v)), out_scale, lanes)
        else:
            inverse = _opaque(splat(1.0, "float32") / (total * splat(float(np.float32(out_scale)), "float32")))
        inverse = bind("inverse", inverse)
        for k in range(vectors):
            q = quantize_linear(exps[k] * inverse, 1.0, int(zero_point), int(qmin), int(qmax), str(y_buf.dtype),
                                round_to_int, bounds=(0.0, 1.0 / float(np.float32(out_scale))))
            stmts.append(tirx.BufferStore(y, q, at(k)))
        return stmts

    # the rows of an item interleaved statement by statement: their chains (the maximum's and the sum's
    # butterflies, the division) are independent, and the core overlaps them
    rows = [emit(_item_index(item * per_item + r, extents)) for r in range(per_item)]
    stmts = table_stmts + [stmt for group in zip(*rows) for stmt in group]
    return _items_func(func, x, y, item, math.prod(extents) // per_item, stmts, permute)


def build_qsoftmax_row_loop(func, permute, round_to_int: str | None = None):
    """The softmax ``func`` (:func:`build_qsoftmax`) along the last axis of rows longer than
    :func:`build_qsoftmax_vectors` unrolls (Whisper's 1500 frames, 577 or 1024 tokens) as the same
    vector code in loops, one work item a row::

        top = max over the row's vectors (a vector of lane maxima, then its lanes)
        for k: e_k = H[(top - q_k) >> 4] * L[(top - q_k) & 15]; kept in a row buffer; lane sums += e_k
        for k: y_k = quantize(e_k / (sum * scale_out))

    The same tables, sums in the same order as the unrolled form (lane partial sums in k order, then a
    butterfly over the lanes), the same quantization; a row no vector divides ends with the overlapping vector, as in the unrolled form.
    None where the softmax is not along the last axis or the row is shorter than a vector."""
    x_buf, y_buf = func.params
    shape = [int(v) for v in x_buf.shape]
    in_scale, out_scale, zero_point, qmin, qmax = func.attrs["lowprec.softmax"]
    lanes, n = permute.lanes, shape[-1]
    if int(func.attrs["lowprec.axis"]) != len(shape) - 1 or n < lanes:
        return None
    full, tail = n // lanes, n % lanes != 0
    vectors = full + tail
    high, low, table_stmts = _bound_tables(permute, float(in_scale))
    vec = f"x{lanes}"
    splat = lambda v, dtype: tirx.Broadcast(tirx.const(v, dtype), lanes)  # noqa: E731
    _, x, y, item = _kernel_buffers(func)
    rows = math.prod(shape[:-1])
    index = _item_index(item, shape[:-1])
    ramp = lambda start: tirx.Ramp(start, 1, lanes)  # noqa: E731
    code = lambda start: tirx.BufferLoad(x, [*index, ramp(start)]).astype("int32" + vec)  # noqa: E731
    last = tirx.const(n - lanes, "int32")  # the tail vector's first element
    zero = tirx.const(0, "int32")
    stmts = list(table_stmts)

    def bind(name, value):
        var = tirx.Var(name, value.ty)
        stmts.append(tirx.Bind(var, value))
        return var

    def loop(name, start, stop, make):  # for k in range(start, stop): make(k) appends the body (its binds inside)
        nonlocal stmts
        if stop <= start:
            return
        k = tirx.Var(name, "int32")
        outer, stmts = stmts, []
        make(k)
        body, stmts = (tirx.SeqStmt(stmts) if len(stmts) > 1 else stmts[0]), outer
        stmts.append(tirx.For(k, start, stop - start, tirx.ForKind.SERIAL, body))

    def local(name, dtype, size):
        buf = tirx.decl_buffer((size,), dtype, name, scope="local")
        stmts.append(tirx.AllocBuffer(buf))
        return buf

    whole = ramp(zero)
    top_lanes = local("lane_max", "int32", lanes)
    stmts.append(tirx.BufferStore(top_lanes, code(zero), [whole]))
    loop("kmax", 1, full, lambda k: stmts.append(
        tirx.BufferStore(top_lanes, tirx.max(tirx.BufferLoad(top_lanes, [whole]), code(k * lanes)), [whole])))
    lane_max = tirx.BufferLoad(top_lanes, [whole])
    if tail:
        lane_max = tirx.max(lane_max, code(last))
    top = bind("top", _opaque(_lane_reduce(bind("lanes_max", lane_max), lanes, tirx.max, lambda v: bind("max_step", v))))
    exps = local("exps", "float32", vectors * lanes)
    sums = local("lane_sum", "float32", lanes)
    stmts.append(tirx.BufferStore(sums, splat(0.0, "float32"), [whole]))

    def exponentials(k):
        e = bind("e", _table_exp(permute, high, low, top - code(k * lanes), bind, ""))
        stmts.append(tirx.BufferStore(exps, e, [ramp(k * lanes)]))
        stmts.append(tirx.BufferStore(sums, tirx.BufferLoad(sums, [whole]) + e, [whole]))

    loop("kexp", 0, full, exponentials)
    lane_sum = tirx.BufferLoad(sums, [whole])
    if tail:  # the overlapping vector: stored whole, its lanes before full * lanes left out of the sum
        e = bind("e_tail", _table_exp(permute, high, low, top - code(last), bind, "_tail"))
        stmts.append(tirx.BufferStore(exps, e, [ramp(tirx.const(full * lanes, "int32"))]))
        fresh = tirx.Ramp(last, 1, lanes) >= splat(full * lanes, "int32")
        lane_sum = lane_sum + tirx.Select(fresh, e, splat(0.0, "float32"))
    inverse = bind("inverse", _output_scale(_lane_reduce(bind("lanes_sum", lane_sum), lanes, lambda a, b: a + b,
                                                         lambda v: bind("sum_step", v)),
                                            out_scale, lanes))

    def quantize(start, at):
        q = quantize_linear(tirx.BufferLoad(exps, [ramp(start)]) * inverse, 1.0, int(zero_point), int(qmin), int(qmax),
                            str(y_buf.dtype), round_to_int, bounds=(0.0, 1.0 / float(np.float32(out_scale))))
        stmts.append(tirx.BufferStore(y, q, [*index, ramp(at)]))

    loop("kout", 0, full, lambda k: quantize(k * lanes, k * lanes))
    if tail:
        quantize(tirx.const(full * lanes, "int32"), last)
    return _items_func(func, x, y, item, rows, stmts, permute)
