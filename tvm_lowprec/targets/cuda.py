"""NVIDIA GPU rows: integer tensor-core ``mma.sync`` (Ampere on), FP8 ``mma.sync`` (Ada and Hopper).

The tile table is shared: every row's GEMM is the same schedule (global -> shared with 16-byte
loads, ``ldmatrix`` into fragments, ``m16n8k32`` mma, int32 accumulators in registers), and the
rows differ in the instructions their architecture has. Tiles are chosen by M (and narrowed for
small N); shapes are padded to the block tile at compile time (weights) or in a prepare pass
(activations).
"""

from ..cuda.mma import GemmTiles
from ..hwspec import CudaTargetSpec

MMA_TILES = (
    GemmTiles(16, 64, 128, 16, 16, min_m=1,
              why="small M (a few tokens): one 16-row mma tile per block and 4 warps along N; K steps of 128 so that "
                  "the 16x128 A tile (2 KiB) splits into whole 16-byte loads over the block's 128 threads"),
    GemmTiles(64, 64, 64, 32, 32, min_m=64,
              why="4 warps of 32x32: 32 int32 accumulators per thread, 8 KiB of shared memory per stage; fills more "
                  "SMs than 128x128 at the M of a short sequence or a late conv layer (M = 64..1024)"),
    GemmTiles(128, 128, 64, 64, 64, min_m=1024,
              why="4 warps of 64x64: 128 accumulators per thread, 16 KiB of shared memory per stage; each A and B "
                  "fragment feeds 4 (or 8) mma, the ratio that reaches the tensor cores' rate at large M"),
)

_INT8 = {"uint8": "u8s8s32_m16n8k32", "int8": "s8s8s32_m16n8k32"}
_FP8 = ("e4m3e4m3f32_m16n8k32", "e5m2e5m2f32_m16n8k32")
_INT4 = ("s4s4s32_m16n8k64", "u4s4s32_m16n8k64")
# What ptxas (CUDA 13.0) makes of them, read from the cubins' SASS (tests/test_cuda_lowbit.py): INT8 is
# IMMA.16832 everywhere; INT4 is IMMA.16864 on sm_80/sm_89 but two IMMA.16832.S8 per instruction in a
# subroutine on sm_90 (Hopper dropped 4-bit mma.sync); FP8 is QMMA.16832 on sm_89 and on sm_90
# conversions to f16 plus HMMA.16816 (Hopper's FP8 tensor cores are reached through wgmma only).

CUDA_TARGETS = (
    CudaTargetSpec(
        name="cuda-sm90",
        arch="sm_90",
        mma=_INT8,
        fp8_mma=_FP8,
        int4_mma=_INT4,
        tiles=MMA_TILES,
        description="Hopper (H100, H200): IMMA mma.sync; FP8 and INT4 mma.sync exist but ptxas emulates them "
                    "(FP8 through f16 HMMA, INT4 through s8 IMMA): fast FP8 needs wgmma, not used yet",
        aliases=("hopper", "h100", "h200"),
    ),
    CudaTargetSpec(
        name="cuda-sm89",
        arch="sm_89",
        mma=_INT8,
        fp8_mma=_FP8,
        int4_mma=_INT4,
        tiles=MMA_TILES,
        description="Ada (L4, L40S, RTX 40xx): IMMA (INT8, INT4) and FP8 (QMMA) mma.sync, all native",
        aliases=("ada", "l4", "l40s"),
    ),
    CudaTargetSpec(
        name="cuda-sm80",
        arch="sm_80",
        mma=_INT8,
        int4_mma=_INT4,
        tiles=MMA_TILES,
        description="Ampere (A100, A10, RTX 30xx): IMMA mma.sync (INT8 m16n8k32, u8 x s8 natively; INT4 m16n8k64); "
                    "no FP8",
        aliases=("ampere", "a100"),
    ),
)
