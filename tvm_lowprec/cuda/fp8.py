"""An FP8 tensor-core GEMM scheduled with TVM: ``C[M, N] (float32) = A[M, K] x B[N, K]^T``.

A and B are both ``float8_e4m3fn`` or both ``float8_e5m2``; the products go through
``mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`` (or ``.e5m2``), which PTX has from sm_89 on.
Ada (sm_89) runs it natively (SASS ``QMMA.16832.F32.E4M3.E4M3``); Hopper (sm_90) has FP8 tensor cores
only behind ``wgmma``, and ptxas turns each mma.sync into F2FP conversions to f16 (exact) and two
``HMMA.16816.F32`` (CUDA 13.0, read with cuobjdump), so there it runs at f16 mma.sync speed at best.
The schedule is :mod:`.gemm`'s INT8 one unchanged
(:func:`~.gemm.schedule_gemm`): only the tensor intrinsics differ, and TVM 0.27 registers all of them
for FP8. Their fragment layouts are the INT8 ones the schedule assumes, checked at import:

- operands: TVM's ``shared_16x32_to_ldmatrix_32x16_layout`` is :func:`~.gemm.layout_16x32` (an
  8-bit operand tile is the same 32 bytes a row whatever the bytes mean);
- accumulators: ``shared_16x16_to_ldmatrix_32x8_layout`` is :func:`~.gemm.layout_16x16_acc` (the f32
  accumulator fragment of m16n8k32 is laid out like the s32 one: c0, c1 in row ``lane / 4``,
  c2, c3 eight rows below, columns ``2 * (lane % 4) + {0, 1}``).

The product of two FP8 values is exact in float32 (at most 8 significant bits, exponents well
inside float32's range), so the kernel's only rounding is the float32 accumulation.
"""

from __future__ import annotations

# through .gemm, which imports TVM's intrinsic module cheaply (tvm_lowprec._tvmscript)
from .gemm import (
    CudaGemm,
    GemmTiles,
    IntrinGroup,
    build_gemm,
    layout_16x16_acc,
    layout_16x32,
    tvm_cuda_intrin,
)
from .mma import require_mma

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def _fp8_group(dtype: str, short: str) -> IntrinGroup:
    intrin = tvm_cuda_intrin
    return IntrinGroup(
        dtype, dtype,
        getattr(intrin, f"LDMATRIX_{short}_A_INTRIN"),
        getattr(intrin, f"LDMATRIX_{short}_B_TRANS_INTRIN"),  # B stored [N, K]
        getattr(intrin, f"MMA_{short}{short}f32_TRANS_B_INTRIN"),
        init=intrin.MMA_fill_16x16_f32_INTRIN,
        store=intrin.MMA_store_16x16_f32_global_INTRIN,
        acc_dtype="float32",
        store_shared=intrin.MMA_store_16x16_f32_shared_dyn_INTRIN,  # a fused epilogue's float32 tile
    )


FP8_INTRIN_GROUPS = {
    "float8_e4m3fn": _fp8_group("float8_e4m3fn", "e4m3"),
    "float8_e5m2": _fp8_group("float8_e5m2", "e5m2"),
}


def _check_layouts() -> None:
    """TVM's FP8 intrinsics index their warp buffers with these maps; the schedule with ours."""
    for i in range(16):
        for j in range(32):
            assert tvm_cuda_intrin.shared_16x32_to_ldmatrix_32x16_layout(i, j) == layout_16x32(i, j), (i, j)
        for j in range(16):
            assert tvm_cuda_intrin.shared_16x16_to_ldmatrix_32x8_layout(i, j) == layout_16x16_acc(i, j), (i, j)


_check_layouts()


def _check_fp8_shape(m: int, n: int, k: int) -> None:
    for name, dim, step in (("M", m, 16), ("N", n, 16), ("K", k, 32)):
        if not isinstance(dim, int) or dim <= 0 or dim % step:
            raise ValueError(f"{name}={dim} is not a positive multiple of {step} (FP8 mma tiles are 16x16x32); pad it")


def build_fp8_gemm(
    m: int, n: int, k: int, dtype: str = "float8_e4m3fn", arch: str = "sm_90", tiles: GemmTiles | None = None,
    compile: bool | str = True,
) -> CudaGemm:
    """Schedule, generate and nvcc-compile ``C = A x B^T`` for FP8 ``A[M, K]``, ``B[N, K]``, float32 C.

    ``compile`` is True (PTX and cubin), ``"ptx"``, ``"cubin"`` or False (CUDA source only). An
    architecture without FP8 mma.sync (below sm_89) is refused before anything is built, with an
    :class:`~.mma.UnsupportedMmaError` naming the mma form and the architecture.

    Examples
    --------
    >>> g = build_fp8_gemm(128, 128, 64, "float8_e5m2", "sm_89")  # doctest: +SKIP
    >>> g.mma.ptx in g.ptx  # doctest: +SKIP
    True
    """
    if dtype not in FP8_INTRIN_GROUPS:
        raise ValueError(f"FP8 dtype {dtype!r} is not supported; choose one of {list(FP8_DTYPES)}")
    group = FP8_INTRIN_GROUPS[dtype]
    require_mma(group.mma, arch)  # refused before anything is built
    _check_fp8_shape(m, n, k)
    return build_gemm(m, n, k, arch=arch, tiles=tiles, compile=compile, group=group)


def decode_fp8(x, dtype: str):
    """FP8 values as float64, exactly: ``x`` is an ``ml_dtypes`` float8 array or its uint8 bits."""
    import ml_dtypes
    import numpy as np

    if dtype not in FP8_DTYPES:
        raise ValueError(f"FP8 dtype {dtype!r} is not supported; choose one of {list(FP8_DTYPES)}")
    x = np.asarray(x)
    if x.dtype == np.uint8:
        x = x.view(getattr(ml_dtypes, dtype))
    return x.astype(np.float64)


# the error allowed against the float64 reference, per output, in units of sum_k |A[m,k] B[n,k]|:
# float32 rounding (u = 2^-24) at each of the K additions, plus one rounding at 14 kept bits per
# k32 mma step, a margin for a tensor core that keeps fewer bits internally than float32 (the
# DeepSeek-V3 technical report measured about 14 bits in Hopper's FP8 wgmma accumulation).
def fp8_error_bound(a64, b64):
    """Per-output bound on ``|C - A x B^T|`` for float64 operands ``a64[M, K]``, ``b64[N, K]``."""
    import numpy as np

    k = a64.shape[1]
    return (np.abs(a64) @ np.abs(b64).T) * (k * 2.0**-24 + (k // 32) * 2.0**-13)
