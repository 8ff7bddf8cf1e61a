"""Run-time weight packing for GEMMs whose weights are activations (attention's Q·Kᵀ and P·V).

``B[batch, K, N]`` (uint8 or int8) -> ``B_packed`` in the GEMM's micro-panel layout (as
:func:`~tvm_lowprec.kernels.qgemm.pack_weights` does at compile time for constants) and
``corr[batch, N] = -za' * colsum(B') + K * za' * zb'``, the zero-point terms that depend on the
weights (see :mod:`tvm_lowprec.quant.zero_points`). One pass over B; O(K*N) per batch against the
GEMM's O(M*K*N).
"""

from __future__ import annotations

from tvm import te, tirx

from .qgemm import GemmLayout


def build_pack_b(batch: int, k: int, n: int, b_dtype: str, layout: GemmLayout, za_p: int, zb_p: int,
                 name: str = "pack_b"):
    """PrimFunc ``(B, B_packed, corr)``: ``za_p = za + a_offset``, ``zb_p = zb - b_offset`` (per tensor)."""
    b_off = 128 if b_dtype == "uint8" else 0
    lay = layout
    W = te.placeholder((batch, k, n), b_dtype, name="B")

    def signed(b, kk, nn):
        return W[b, tirx.min(kk, k - 1), tirx.min(nn, n - 1)].astype("int32") - b_off

    def pack(b, *index):
        nn, kk = lay.b_logical(*index)
        inside = tirx.all(nn < n, kk < k)
        return tirx.if_then_else(inside, signed(b, kk, nn), 0).astype(lay.b_storage)

    packed = te.compute((batch,) + lay.packed_shape, pack, name="B_packed")
    r = te.reduce_axis((0, k), name="r")
    colsum = te.compute(
        (batch, lay.np_), lambda b, nn: te.sum(tirx.if_then_else(nn < n, signed(b, r, nn), 0), axis=r), name="colsum"
    )
    corr = te.compute((batch, lay.np_), lambda b, nn: colsum[b, nn] * (-za_p) + k * za_p * zb_p, name="corr")
    func = te.create_prim_func([W, packed, corr])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "pack_b", "op_pattern": 8})
