"""Weight-only emitter for blocked 4-bit weights: ``matmul(x, DQ(q, scale, zp, axis=0, block))`` ==>
the 4-bit kernel of :mod:`tvm_lowprec.kernels.nbits` (see :mod:`.weight_only` for the pass).

Takes weights ``[K, N]`` blocked along K (``MatMulNBits``; a blocked QDQ MatMul) whose values are
4-bit: ``uint4`` (0..15) as they are, ``int4`` (-8..7) shifted by 8 with their zero points. Declines
(the matmul stays float, exact) 8-bit blocked weights, blocks along N, block sizes that are not a
multiple of 8 and GPU rows. ``int8`` activations need the row's 4-bit dot product
(``TargetSpec.nibble``); a row without one runs the float path and says so.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import warnings

import numpy as np
import tvm
from tvm import relax

from ..hwspec import Tile
from ..kernels.qgemm import SYMBOLIC_ROWS
from ..kernels.nbits import NbitsProblem, build_nbits_gemm, pack_block_params, pack_nibbles, uniform_zero_point
from .dequantized import DequantizedConst
from .patterns import gemm_input_shape


def unsigned_nibbles(dq: DequantizedConst):
    """``(q[N, K], zero_point[N, Kb])`` as unsigned 4-bit values (int4 shifted by 8), or None when
    the weights are not 4-bit."""
    values = dq.values.astype(np.int32)
    lo, hi = int(values.min(initial=0)), int(values.max(initial=0))
    zp = dq.zero_point.astype(np.int32) if dq.zero_point is not None else np.zeros(dq.scale.shape, np.int32)
    if lo >= 0 and hi <= 15 and np.issubdtype(dq.values.dtype, np.unsignedinteger):
        shift = 0
    elif lo >= -8 and hi <= 7 and np.issubdtype(dq.values.dtype, np.signedinteger):
        shift = 8
    else:
        return None
    return (values + shift).T.astype(np.uint8), (zp + shift).T.astype(np.float32)


def _problem(m: int, n: int, k: int, block: int, spec, activations: str) -> NbitsProblem:
    recipe = spec.nibble
    if activations == "int8" and recipe is None:
        warnings.warn(f"{spec.name} has no 4-bit dot product: int4 layers run with float activations",
                      stacklevel=4)
        activations = "float"
    lanes = recipe.intrin.lanes if recipe is not None else spec.gemm.vector_bits // 32
    if activations != "int8":
        tiles = getattr(spec, "nibble_float", ()) or (recipe.tiles if recipe is not None else ())
        tile = next((t for t in reversed(tiles) if t.min_m <= m), Tile(1, mr=1, nr=4))  # tables sort by min_m
        return NbitsProblem(m, n, k, block, lanes, activations, None, mr=tile.mr, nr=tile.nr,
                            widen_block=tile.wide_b)
    tile = recipe.tile_for(m)
    groups = recipe.intrin.groups_for(block)
    return NbitsProblem(m, n, k, block, lanes, activations, recipe.intrin.intrins[groups], mr=tile.mr,
                        nr=tile.nr, call_groups=groups)


def emit_int4(builder, x, dq: DequantizedConst, spec, config):
    if getattr(spec, "device", "cpu") != "cpu" or dq.axis != 0 or dq.values.ndim != 2 or dq.block % 8:
        return None
    if str(dq.scale.dtype) != "float32":
        return None
    nibbles = unsigned_nibbles(dq)
    shape = gemm_input_shape(x)
    if nibbles is None or shape is None:
        return None
    q, zero_point = nibbles
    k, n = dq.values.shape
    if shape[-1] != k:
        return None
    lead = list(shape[:-1])
    m = functools.reduce(operator.mul, lead) if lead else 1  # a TIR expression where a length is symbolic
    symbolic = not isinstance(m, int)
    # a symbolic M: the kernel's own variable (TVM binds it from X's shape), the tile chosen for SYMBOLIC_ROWS
    p = dataclasses.replace(_problem(SYMBOLIC_ROWS if symbolic else m, n, k, dq.block, spec, config.activations),
                            m=tvm.tirx.Var("m", "int64") if symbolic else m, zero_point=uniform_zero_point(zero_point))
    params = pack_block_params(dq.scale.T.astype(np.float32), zero_point, p)
    name = f"nbits_gemm_{p.activations}_{'M' if symbolic else m}x{n}x{k}_b{dq.block}"
    gvar = builder.add_func(build_nbits_gemm(p, name).with_attr("op_pattern", 8), name)
    x2 = builder.emit(relax.op.reshape(x, (m, k)))
    args = [x2, relax.const(pack_nibbles(q, p)), *(relax.const(v) for v in params)]
    rows = dataclasses.replace(p, m=m).m_padded  # the padded rows in the graph's own terms
    y = builder.emit(relax.call_tir(gvar, args, relax.TensorType((rows, *p.out_shape[1:]), "float32")))
    y = builder.emit(relax.op.reshape(y, (rows, p.n_padded)))
    pads_rows = p.mr > 1 and (symbolic or rows != m)  # a 1-row tile pads no rows: its output is used as it is
    if pads_rows or p.n_padded != n:
        y = builder.emit(relax.op.strided_slice(y, axes=[0, 1], begin=[0, 0], end=[m, n]))
    return builder.emit(relax.op.reshape(y, (*lead, n))) if len(lead) != 1 else y
