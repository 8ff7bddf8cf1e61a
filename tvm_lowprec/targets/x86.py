"""x86 targets. One row per instruction set; tiles say why their numbers are what they are."""

from ..hwspec import GemmRecipe, TargetSpec, Tile
from ..intrin.x86 import PMADDUBSW_256, PMADDUBSW_512, PMADDWD_256, PMADDWD_512, VNNI_256, VNNI_512, VPDPWSSD_512
from ..intrin.x86_nibble import NIBBLE_UBSW_256, NIBBLE_UBSW_512, NIBBLE_VNNI_256, NIBBLE_VNNI_512

# vpdpbusd zmm issues 2 per cycle with ~4-5 cycle latency: 12+ independent accumulators reach peak
# (measured on Zen 5), and the u8 operand cannot use a {1to16} memory broadcast, so several column
# groups share each broadcast row. 32 zmm registers leave room for the B vectors.
# Predicted % of peak below: llvm-mca icelake-server (benchmarks/predict_tiles.py ->
# benchmarks/results/predicted/tiles.md); the model ignores memory, so GEMV figures are upper bounds.
_VNNI_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators, B streamed once; llvm-mca 79.9% (1x16: 88.7%, 1x16/k512: 94.0%) but GEMV is "
         "weight-bandwidth-bound (98 GB/s measured on Zen 5, ~18% of peak), and 1x8 keeps twice the panels"),
    Tile(2, mr=2, nr=8, why="two rows share each B load; llvm-mca 92.3% at 2x3072x768 (2x4: 80.0%, 2x6: 87.8%)"),
    Tile(4, mr=4, nr=4, why="16 accumulators, one A broadcast feeds 4 instructions; llvm-mca 97.9% at "
         "M=4, 8, 16, 128 (rank 1 of 47 at 16x3072x768; 4x3 94.7%, 2x8 92.3%)"),
    Tile(256, mr=4, nr=4, kblock=512, why="large K: a 512-deep B panel (32 KiB) stays in L1 across row tiles; "
         "llvm-mca 99.9% at 1024^3 (rank 1 of 94; the K-blocked loop is unrolled by 2, 4x4 whole-K 96.9%)"),
)
# 16 ymm registers. vpdpbusd accumulates in place and takes B from memory: accumulators + broadcast(s)
# must fit in 16, or LLVM spills accumulators (llvm-mca cannot see that cost: spilling tiles excluded).
# Predicted % of peak below: llvm-mca alderlake (Skylake client model in LLVM 14), tiles.md.
_VNNI_YMM_TILES = (
    Tile(1, mr=1, nr=12, why="GEMV: 12 accumulators + broadcast, no spill; llvm-mca 99.1-99.9% at 1x4096x4096 "
         "and 1x3072x768 (1x8: 79.9%, load/dispatch-bound); the real limit is weight bandwidth"),
    Tile(2, mr=2, nr=5, why="10 accumulators + 2 broadcasts; llvm-mca 99.7% at 2x3072x768 (2x4: 80.0%; "
         "2x6 spills 11 stores per iteration)"),
    Tile(4, mr=4, nr=3, why="12 accumulators + broadcast + 3 B = 16 ymm, no spill; llvm-mca 99.9-100% at "
         "M=4, 8, 16, 128 and 99.2% at 1024^3 (6x2: 66.6% at M=8, 88.9% at M=16 from padding M to 6)"),
)
# vpmaddwd does not accumulate: each product needs a temporary before vpaddd. With int16 weights
# (widened once at pack time) LLVM keeps the B vectors in registers across rows.
# Measured on Zen 3, 1024^3, one thread (tiles.py sweep, best of 7): 4x3 spills two accumulators
# (95 GOPS); 3x3 124; 4x2 124; 5x2 131; 6x2 140; a 512-deep K block gains nothing at 1024 and loses
# 40% at M=16 (the epilogue cannot be fused under it), so these tiles keep K whole.
_MADD_YMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: int8 weights widened in the loop (bandwidth-bound: 2x bytes lost 40%)"),
    Tile(2, mr=2, nr=4, wide_b=True, why="8 accumulators + 4 B + broadcast + temporary = 14"),
    Tile(4, mr=4, nr=2, wide_b=True, why="8 accumulators + 2 B + broadcast + temporary = 12"),
    Tile(6, mr=6, nr=2, wide_b=True, why="12 accumulators + 2 B + broadcast + temporary = 16: no spill"),
)
# 32 zmm registers: 6x4 = 24 accumulators + 4 B + broadcast + temporary = 30.
_MADD_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: int8 weights widened in the loop"),
    Tile(2, mr=2, nr=4, wide_b=True, why="two rows share each B vector"),
    Tile(6, mr=6, nr=4, wide_b=True, why="24 accumulators + 4 B + broadcast + temporary = 30 of 32 zmm"),
)

# vpmaddubsw + vpmaddwd(ones) accumulates through a temporary and keeps a ones vector: 2 registers
# beyond accumulators, broadcast and B. Tiles measured on Zen 3 (tiles.py sweep, best of 7).
# 1024^3: 5x2 172 GOPS, 4x2 168, 3x3 166, 4x3 164, 6x2 161 (spills); 16x768x3072: 4x2 173, 5x2 134
# (M=16 pads to 20 rows); GEMV 1x3072x768: 1x8 90 (vs 70 with vpmaddwd), 1x12 94.
_UBSW_YMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators + broadcast + temporary + ones"),
    Tile(2, mr=2, nr=4, why="8 accumulators + 4 B + 3 = 15"),
    Tile(4, mr=4, nr=2, why="8 accumulators + 2 B + 3 = 13; 4 divides the usual M"),
)
_UBSW_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV"),
    Tile(2, mr=2, nr=4, why="two rows share each B vector"),
    Tile(6, mr=6, nr=3, why="18 accumulators + 3 B + 3 = 24 of 32 zmm"),
)

# int16 x int8 (16-bit activations, kernels/qgemm16). Rows without VNNI: the same vpmaddwd recipes as
# their 8-bit GEMMs, whose activations are widened to int16 anyway (same instruction, registers, tiles).
_INT16_ZMM = GemmRecipe(PMADDWD_512, _MADD_ZMM_TILES)
_INT16_YMM = GemmRecipe(PMADDWD_256, _MADD_YMM_TILES)
# AVX-512 VNNI: vpdpwssd accumulates in place as vpdpbusd does (no temporary), so vpdpbusd zmm's register
# budgets, int16 weights (widened at pack time) read straight from memory. Not measured: no VNNI host was
# at hand (checked by emulated execution). LLVM's machine combiner splits vpdpwssd back into vpmaddwd +
# vpaddd where its model of the CPU finds that faster (a native build on Sapphire Rapids shows vpmaddwd zmm
# in register tiles; on Zen 4 it keeps vpdpwssd). The AVX-VNNI row keeps vpmaddwd ymm: LLVM splits a ymm
# vpdpwssd for the Alder Lake-class cores that row stands for.
_DPWSSD_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: int8 weights widened in the loop (half the bytes of int16 weights)"),
    Tile(2, mr=2, nr=8, wide_b=True, why="16 accumulators, two rows share each B vector"),
    Tile(4, mr=4, nr=4, wide_b=True, why="16 accumulators, one broadcast feeds 4 instructions (vpdpbusd zmm's 4x4)"),
)
_INT16_VNNI_ZMM = GemmRecipe(VPDPWSSD_512, _DPWSSD_ZMM_TILES)

# 4-bit weights (tvm_lowprec.kernels.nbits): one K block of nr lane vectors per task, the packed
# bytes streamed once. Measured on Zen 3 (ymm, 4096x4096, block 32, 2 threads, noisy host: best of
# runs): GEMV int8 activations 1x8 0.37 ms vs 1x4 0.61-1.2 ms; M = 16: 2x4 4.5 ms, 1x8 6.2, 4x2 6.3,
# 4x3 9.2 (int8); float activations 4x2 17 ms vs 1x8 24 (each byte vector widened once per tile).
_NIBBLE_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators, one contiguous weight stream per task"),
    Tile(2, mr=2, nr=4, why="two rows share each weight vector's unpacking (M=16: 4.5 ms vs 6.2 ms at 1x8)"),
)
# Float activations: from M = 4 each K block of a task is dequantized once (s * q - s * z, float) into a
# buffer in L1 that every row tile then reads, a plain FMA GEMM; below, widening in registers per tile
# costs less than the buffer's stores. Measured on Zen 3 (ymm, 4096x4096, block 32, 1 thread, busy host,
# best of 7 interleaved): M=16 block 4x2 10.2 ms vs registers 2x4 17.4 (6x2 9.7, pads 16 to 18; 2x4 10.9;
# 8x1 12.1); M=64 41 vs 64; M=4 4.6 vs 5.1; M=2 2.7 vs 1.7; M=1 2.6 vs 1.6. zmm rows: predicted, below.
_NIBBLE_FLOAT_TILES = (
    *_NIBBLE_TILES,
    Tile(4, mr=4, nr=2, wide_b=True, why="4 rows x 2 vectors: 8 accumulators + 2 weight vectors + broadcast"),
)
# zmm (32 registers), predicted: llvm-mca-19 FMAs per cycle of the block's k loop at M=16: 4x4 0.80 on
# znver4, 2.00 on skylake-avx512 (4x2 0.67 / 1.66; 6x4 0.92 / 2.00 but pads 16 rows to 18; 8x2 0.67 / 1.78)
_NIBBLE_FLOAT_ZMM_TILES = (
    *_NIBBLE_TILES,
    Tile(4, mr=4, nr=4, wide_b=True, why="16 accumulators + 4 weight vectors + broadcast of 32 zmm"),
)

X86_TARGETS = (
    TargetSpec(
        name="x86-avx512-vnni",
        llvm={"kind": "llvm", "mcpu": "znver4"},
        features=("avx2", "avx512f", "avx512bw", "avx512vnni"),
        gemm=VNNI_512,
        nibble=GemmRecipe(NIBBLE_VNNI_512, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_ZMM_TILES,
        tiles=_VNNI_ZMM_TILES,
        int16=_INT16_VNNI_ZMM,
        description="AVX-512 VNNI (Cascade Lake and later, Zen 4/5): vpdpbusd zmm",
        aliases=("avx512-vnni", "vnni"),
    ),
    TargetSpec(
        name="x86-avx-vnni",
        llvm={"kind": "llvm", "mcpu": "alderlake"},
        features=("avx2", "avxvnni"),
        gemm=VNNI_256,
        nibble=GemmRecipe(NIBBLE_VNNI_256, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_TILES,
        tiles=_VNNI_YMM_TILES,
        int16=_INT16_YMM,
        description="AVX-VNNI without AVX-512 (Alder Lake and later client cores): {vex} vpdpbusd ymm",
    ),
    TargetSpec(
        name="x86-avx512",
        llvm={"kind": "llvm", "mcpu": "skylake-avx512"},
        features=("avx2", "avx512f", "avx512bw"),
        gemm=PMADDWD_512,
        nibble=GemmRecipe(NIBBLE_UBSW_512, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_ZMM_TILES,
        tiles=_MADD_ZMM_TILES,
        int16=_INT16_ZMM,
        bounded=(GemmRecipe(PMADDUBSW_512, _UBSW_ZMM_TILES),),
        description="AVX-512BW without VNNI: exact int16 vpmaddwd zmm; vpmaddubsw only for weights proven not to saturate",
    ),
    TargetSpec(
        name="x86-avx2",
        llvm={"kind": "llvm", "mcpu": "haswell"},
        features=("avx2",),
        gemm=PMADDWD_256,
        nibble=GemmRecipe(NIBBLE_UBSW_256, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_TILES,
        tiles=_MADD_YMM_TILES,
        int16=_INT16_YMM,
        bounded=(GemmRecipe(PMADDUBSW_256, _UBSW_YMM_TILES),),
        description="AVX2: exact int16 vpmaddwd ymm; vpmaddubsw only for weights proven not to saturate",
    ),
)
