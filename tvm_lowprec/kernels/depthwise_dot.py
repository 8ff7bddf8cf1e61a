"""The depthwise convolution (:func:`~tvm_lowprec.kernels.depthwise.build_depthwise`) on the row's
four-byte dot product, lane by lane: four taps of a channel in each int32 lane.

The depthwise kernel multiplies one tap per lane (a widened byte times an int16 weight:
``vpmaddwd``/``vpdpwssd``), 9 instructions per 16 outputs of a 3x3 window on AVX-512; the GEMM
instruction (``vpdpbusd``, ``sdot``, ``usdot``) sums four byte products per int32 lane. Here each lane
holds the taps ``kw = 4q .. 4q + 3`` of one kernel row of its channel (zeros past ``KW``), so a 3x3
window is 3 instructions per vector of outputs::

    for r in parallel(B * HP):                    # pass 1: the input padded (its zero point) and in
      xb[b, hp, g, wp, :] = x[b, hp - top, wp - left, c0(g) : c0(g) + L]   # channel blocks of L
    for r in parallel(B * OH):                    # pass 2: output rows
      for g in range(C / L):                      # channel groups (the last one overlapping)
        w4[kh, q] = interleave(w'[kh, 4q + j, c0 : c0 + L] for j < 4)  # bytes, once per group
        start = corr[c0 : c0 + L] - offset * sum w'
        for step in range(OW / U):                # U output columns
          acc[u] = start
          for kh:                                 # unrolled, as are q and u
            block[k] = xb[b, oh * sh + kh * dh, g, step * U + 4k : + 4, :]   # 4 columns, 4L bytes
            acc[u] = dot(pick(block, taps of (u, q)), w4[kh, q], acc[u])
          out[b, oh, step * U + u, c0 : c0 + L] = requant(acc[u])

``pick`` is a byte shuffle of at most two blocks, which LLVM lowers to the target's permutes
(``vpermb``/``vpermt2b`` with AVX-512 VBMI); the blocked copy makes a step's columns one load each and
leaves no border selects in pass 2. Activations the instruction takes with the other signedness have
their sign bit flipped in the copy (``a + offset``, the operand's :attr:`AOperand.offset`), which the
accumulator's start takes back. Integer arithmetic throughout: the results are those of the one-tap
kernel, bit for bit (the epilogue is the same function of the same int32 sum). Stride 1 and outputs
at least :data:`MIN_WIDTH` wide only: the copy is the input's size, which narrower or strided layers
do not repay.

Needs: weights ``w - zw`` within int8 (``lowprec.weights_int8``, set where the constants are made),
the row's instruction with four bytes a lane (:attr:`~tvm_lowprec.hwspec.GemmIntrin.lane_product`)
taking the activations as stored (no int16 widening), at least ``L`` channels, stride 1, an output
at least :data:`MIN_WIDTH` wide.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

from .depthwise import pixels_per_step
from .qgemm import Epilogue, requant_f32, requantize

KSTEP = 4  # taps per lane: the instruction's bytes per int32 lane
# Output widths from which the padded copy pays for itself, stride 1 only. Keras MobileNetV2's layers,
# Zen 4, one thread, us (one-tap kernel / this one): 144 channels at 24x24 21.8 / 14.9, 32 at 48x48
# 17.4 / 13.3, 192 at 12x12 7.0 / 5.6, but 384 at 6x6 3.7 / 3.6, 960 at 3x3 2.1 / 3.0, and at stride 2
# (the copy 4x the output) 96 at 48x48 16.3 / 13.5, 144 at 24x24 4.5 / 6.8
MIN_WIDTH = 12
_FLIP = {"uint8": 0x80, "int8": -128}  # the sign bit as a constant of each byte type


def build_depthwise_dot(func, gi, operand):
    """``func`` (a qdepthwise PrimFunc with the attributes :func:`build_depthwise` writes) as vector code
    on ``gi``'s lane-wise dot product, or None where it does not apply (see the module docstring)."""
    attrs = func.attrs
    if gi.lane_product is None or gi.kstep != KSTEP or gi.rows != 1 or gi.weight_pair_bound is not None:
        return None
    if operand.storage not in ("uint8", "int8") or not bool(attrs.get("lowprec.weights_int8", False)):
        return None
    window = attrs.get("lowprec.conv", None)
    epilogue = attrs.get("lowprec.epilogue", None)
    if window is None or epilogue is None:
        return None
    batch, oh_n, ow_n, c_n, kh_n, kw_n = (int(v) for v in attrs["lowprec.shape"])
    sh, sw, dh, dw, top, left = (int(v) for v in window)
    kind, mode, f32 = str(epilogue[0]), str(epilogue[1]), bool(int(epilogue[2]))
    lanes = gi.lanes
    if c_n < lanes or sw != 1 or ow_n < MIN_WIDTH:
        return None
    old = list(func.params)
    bufs = [tirx.decl_buffer([int(d) for d in p.ty.shape], str(p.ty.dtype), p.name) for p in old]
    x, w, corr = bufs[:3]
    out, pad = bufs[-1], bufs[-2]
    h_n, w_n = int(x.shape[1]), int(x.shape[2])
    a_dtype = str(x.dtype)
    ep = Epilogue(kind, str(out.dtype), mode=mode) if kind == "requant" else Epilogue("int32")
    scale = bufs[3:-3] if kind == "requant" else []
    out_range = bufs[-3] if kind == "requant" else None
    quads = -(-kw_n // KSTEP)
    a_bytes = gi.lane_a_bytes
    flip = operand.offset != 0
    offset = int(operand.offset)
    nbytes = KSTEP * lanes
    unroll = pixels_per_step(ow_n)
    steps = ow_n // unroll
    groups = -(-c_n // lanes)

    # the input padded (with its zero point) and in channel blocks, flipped where the operand asks:
    # xb[b, hp, g, wp, l] = x[b, hp - top, wp - left, c0(g) + l]. A step's KSTEP consecutive columns
    # of a block are then KSTEP * lanes contiguous bytes: one load, no inserts, no border selects
    span = (unroll - 1) * sw + (kw_n - 1) * dw + 1  # input columns of one step's windows
    blocks = -(-span // KSTEP)
    wp_n = (steps - 1) * unroll * sw + blocks * KSTEP
    hp_n = (oh_n - 1) * sh + (kh_n - 1) * dh + 1
    xb = tirx.decl_buffer((batch, hp_n, groups, wp_n, lanes), a_bytes, "x_blocked")
    ramp = lambda start, n=lanes: tirx.Ramp(start, 1, n)  # noqa: E731

    def channel0(group):  # the first channel of a group (the last group overlaps the one before)
        return tirx.min(group * lanes, c_n - lanes) if c_n % lanes else group * lanes

    def bind(stmts, name, value):
        var = tirx.Var(name, value.ty)
        stmts.append(tirx.Bind(var, value))
        return var

    def interleave(vectors, dtype):
        """Lane l of the result holds byte j of quad l from vector j (vectors of ``lanes`` ``dtype``)."""
        zero = tirx.Broadcast(tirx.const(0, dtype), lanes)
        vectors = list(vectors) + [zero] * (KSTEP - len(vectors))
        return tirx.Shuffle(vectors, [tirx.IntImm("int32", j * lanes + l) for l in range(lanes) for j in range(KSTEP)])

    # pass 1: the blocked copy, a row of it per work item: plain loads inside the input, the zero point
    # (flipped) in the padding, no selects
    prow = tirx.Var("prow", "int32")
    pb = prow // hp_n if batch > 1 else tirx.const(0, "int32")
    hp = prow % hp_n if batch > 1 else prow
    zero = tirx.const(0, "int32")

    def flipped(value):
        value = tirx.reinterpret(f"{a_bytes}x{lanes}", value) if a_bytes != a_dtype else value
        if flip:
            value = tirx.bitwise_xor(value, tirx.Broadcast(tirx.const(_FLIP[a_bytes], a_bytes), lanes))
        return value

    pad_vec = flipped(tirx.Broadcast(tirx.BufferLoad(pad, [zero]).astype(a_dtype), lanes))

    def fill(pg, lo: int, hi: int, value_at):
        """``xb[pb, hp, pg, pw] = value_at(pw)`` for pw in [lo, hi) (nothing where empty)."""
        if hi <= lo:
            return []
        pw = tirx.Var("pw", "int32")
        store = tirx.BufferStore(xb, value_at(pw), [pb, hp, pg, pw, ramp(zero)])
        return [tirx.For(pw, lo, hi - lo, tirx.ForKind.SERIAL, store)]

    def groups_loop(make):  # for pg in range(groups): make(pg), a fresh loop variable each time
        pg = tirx.Var("pg", "int32")
        body = make(pg)
        return tirx.For(pg, 0, groups, tirx.ForKind.SERIAL, tirx.SeqStmt(body) if len(body) > 1 else body[0])

    def inside_row(pg):  # the input's row: padding, its columns, padding
        read = lambda v: flipped(tirx.BufferLoad(x, [pb, hp - top, v - left, ramp(channel0(pg))]))  # noqa: E731
        return [*fill(pg, 0, min(left, wp_n), lambda _: pad_vec), *fill(pg, left, min(wp_n, left + w_n), read),
                *fill(pg, max(left + w_n, 0), wp_n, lambda _: pad_vec)]

    copy = tirx.IfThenElse(tirx.all(hp >= top, hp < top + h_n), groups_loop(inside_row),
                           groups_loop(lambda pg: fill(pg, 0, wp_n, lambda _: pad_vec)))
    pass1 = tirx.For(prow, 0, batch * hp_n, tirx.ForKind.PARALLEL, copy)

    # pass 2: the convolution, an output row per work item
    row = tirx.Var("row", "int32")
    b = row // oh_n if batch > 1 else tirx.const(0, "int32")
    oh = row % oh_n if batch > 1 else row

    def step_body(group, c0, w4, start, ow0):
        """One step of ``unroll`` output columns from ``ow0``, channels from ``c0``."""
        stmts = []
        accs = [start] * unroll
        for kh in range(kh_n):
            hp = oh * sh + kh * dh
            regs = [bind(stmts, f"block_{kh}_{k}", tirx.BufferLoad(xb, [b, hp, group, ow0 * sw + k * KSTEP,
                                                                        ramp(tirx.const(0, "int32"), nbytes)]))
                    for k in range(blocks)]
            for q in range(quads):
                for u in range(unroll):
                    # tap j of quad q: column u * sw + kw * dw of the step (block, column in it)
                    where = [divmod(u * sw + kw * dw, KSTEP) for kw in range(q * KSTEP, min(kw_n, (q + 1) * KSTEP))]
                    used = sorted({k for k, _ in where})
                    picks = [where[j] if j < len(where) else where[0] for j in range(KSTEP)]  # past KW: weight 0
                    index = [used.index(k) * nbytes + col * lanes + l for l in range(lanes) for k, col in picks]
                    a = tirx.Shuffle([regs[k] for k in used], [tirx.IntImm("int32", i) for i in index])
                    accs[u] = bind(stmts, f"acc_{kh}_{q}_{u}", gi.lane_product(a, w4[kh, q], accs[u]))
        acc_buf = tirx.decl_buffer((unroll * lanes,), "int32", "acc", scope="local")
        for u in range(unroll):
            stmts.append(tirx.BufferStore(acc_buf, accs[u], [ramp(tirx.const(u * lanes, "int32"))]))
        for u in range(unroll):
            lane = tirx.Var("lane", "int32")
            total = tirx.BufferLoad(acc_buf, [tirx.const(u * lanes, "int32") + lane])
            c = c0 + lane
            if kind == "int32":
                value = total
            elif f32:
                value = requant_f32(total, ep, tirx.BufferLoad(scale[0], [c]), out_range)
            else:
                shift = tirx.BufferLoad(scale[1], [c]) if len(scale) > 1 else None
                value = requantize(total, ep, tirx.BufferLoad(scale[0], [c]), shift, out_range)
            store = tirx.BufferStore(out, value, [b, oh, ow0 + u, c])
            stmts.append(tirx.For(lane, 0, lanes, tirx.ForKind.VECTORIZED, store))
        return tirx.SeqStmt([tirx.AllocBuffer(acc_buf), *stmts])

    group = tirx.Var("group", "int32")
    c0 = channel0(group)
    stmts = []
    w4 = {}
    for kh in range(kh_n):
        for q in range(quads):
            taps = [kh * kw_n + kw for kw in range(q * KSTEP, min(kw_n, (q + 1) * KSTEP))]
            vecs = [tirx.BufferLoad(w, [tirx.const(t, "int32"), ramp(c0)]).astype(f"int8x{lanes}") for t in taps]
            w4[kh, q] = bind(stmts, f"w4_{kh}_{q}", interleave(vecs, "int8"))
    start = tirx.BufferLoad(corr, [ramp(c0)])
    if flip:  # the activations are a + offset: take offset * sum(w') back
        total = None
        for t in range(kh_n * kw_n):
            wt = tirx.BufferLoad(w, [tirx.const(t, "int32"), ramp(c0)]).astype(f"int32x{lanes}")
            total = wt if total is None else total + wt
        start = start - total * tirx.Broadcast(tirx.const(offset, "int32"), lanes)
    start = bind(stmts, "acc0", start)
    step = tirx.Var("step", "int32")
    stmts.append(tirx.For(step, 0, steps, tirx.ForKind.SERIAL, step_body(group, c0, w4, start, step * unroll)))
    pass2 = tirx.For(row, 0, batch * oh_n, tirx.ForKind.PARALLEL,
                     tirx.For(group, 0, groups, tirx.ForKind.SERIAL, tirx.SeqStmt(stmts)))
    body = tirx.SeqStmt([tirx.AllocBuffer(xb), pass1, pass2])
    body = SBlockRealize([], True, SBlock([], [], [], "root", body))
    new_attrs = dict(attrs)
    new_attrs.update({"lowprec.intrin": f"{gi.name}_lanes", "tir.noalias": True})
    return tirx.PrimFunc(bufs, body).with_attrs(new_attrs)
