"""An AMX int8 GEMM micro-kernel (issue 27, step 2's kernel; not yet a target row's recipe).

``C[M, N] (int32) = A[M, K] (u8, or s8 with ``tdpbssd``) @ W[K, N] (s8)``, on Intel AMX's tile engine:
each task computes one 32 x 32 block of C in four 16 x 16 int32 tiles (``tmm0``-``tmm3``) from two A
tiles (``tmm4``, ``tmm5``: 16 rows of 64 bytes of K each, loaded from the activations in place) and two B
tiles (``tmm6``, ``tmm7``: 16 rows of 16 columns x 4 bytes, the pair layout :func:`pack_b` writes at
compile time), all eight tile registers, four ``tdpbusd`` per 64 bytes of K, then stores the four C tiles
to the output. Each task configures its own tiles (``ldtilecfg`` from a 64-byte buffer on its stack:
palette 1, every tile 16 rows of 64 bytes), since the tile state is per thread, and releases them.

M and N are multiples of 32, K of 64 (the caller pads: zero rows of A and zero columns of W add
nothing). Exact by construction (int32 accumulation of u8 x s8 products, wrapping only past 2**31).
Runs natively only where the process has Linux's permission for the tile data
(:func:`tvm_lowprec.amx.request_permission`); elsewhere emulated (:mod:`tvm_lowprec.intrin.amx_semantics`).
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

BLOCK_M = BLOCK_N = 32  # 2 x 2 C tiles of 16 x 16 int32
TILE_K = 64  # bytes of K in one A tile row
DOTS = {("uint8", "int8"): "tdpbusd", ("int8", "int8"): "tdpbssd"}


def pack_b(w: np.ndarray) -> np.ndarray:
    """``W[K, N]`` (int8, K a multiple of 64, N of 16) as AMX's B operand per 16-column panel and 64-deep K
    block: ``[N / 16, K / 64, 16, 64]``, row ``r`` of a block holding, for each of its 16 columns, the 4
    consecutive K bytes ``4r .. 4r + 3`` (the VNNI pair order ``tdpbusd`` reads)."""
    k, n = w.shape
    if k % TILE_K or n % 16:
        raise ValueError(f"W is {k}x{n}: K must be a multiple of {TILE_K} and N of 16 (pad them)")
    blocks = w.reshape(k // TILE_K, 16, 4, n // 16, 16)  # [kb, r, i, panel, col]
    return np.ascontiguousarray(blocks.transpose(3, 0, 1, 4, 2)).reshape(n // 16, k // TILE_K, 16, 64)


def build_amx_gemm(m: int, n: int, k: int, a_dtype: str = "uint8", name: str = "amx_gemm"):
    """The PrimFunc ``(A [m, k] a_dtype, B_packed [n/16, k/64, 16, 64] int8, C [m, n] int32)``."""
    if m % BLOCK_M or n % BLOCK_N or k % TILE_K:
        raise ValueError(f"{m}x{n}x{k}: M and N must be multiples of {BLOCK_M}, K of {TILE_K}")
    dot = DOTS[(a_dtype, "int8")]
    blocks_m, blocks_n, steps = m // BLOCK_M, n // BLOCK_N, k // TILE_K

    @T.prim_func
    def kernel(A: T.Buffer((m, k), a_dtype), B: T.Buffer((n // 16, steps, 16, 64), "int8"),
               C: T.Buffer((m, n), "int32")):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        for task in T.parallel(blocks_m * blocks_n):
            cfg = T.alloc_buffer((64,), "uint8", scope="local")
            for i in range(64):
                cfg[i] = T.uint8(0)
            cfg[0] = T.uint8(1)  # palette 1
            for t in range(8):  # every tile: 16 rows of 64 bytes
                cfg[16 + 2 * t] = T.uint8(64)
                cfg[48 + t] = T.uint8(16)
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))
            bm = task // blocks_n
            bn = task % blocks_n
            for c in T.unroll(4):  # unrolled: tile numbers are immediates
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.Cast("int8", c)))
            for s in range(steps):
                for r in T.unroll(2):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.Cast("int8", 4 + r),
                                                  T.address_of(A[bm * 32 + r * 16, s * 64]), T.int64(k)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.Cast("int8", 6 + r),
                                                  T.address_of(B[bn * 2 + r, s, 0, 0]), T.int64(64)))
                for r in T.unroll(2):
                    for q in T.unroll(2):
                        T.evaluate(T.call_llvm_intrin("void", f"llvm.x86.{dot}", T.Cast("int8", 2 * r + q),
                                                      T.Cast("int8", 4 + r), T.Cast("int8", 6 + q)))
            for r in T.unroll(2):
                for q in T.unroll(2):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.Cast("int8", 2 * r + q),
                                                  T.address_of(C[bm * 32 + r * 16, bn * 32 + q * 16]),
                                                  T.int64(n * 4)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))

    return kernel


__all__ = ["BLOCK_M", "BLOCK_N", "TILE_K", "build_amx_gemm", "pack_b"]
