"""x86 targets. One row per instruction set; tiles say why their numbers are what they are."""

from ..hwspec import GemmRecipe, TargetSpec, Tile
from ..intrin.x86 import PMADDUBSW_256, PMADDUBSW_512, PMADDWD_256, PMADDWD_512, VNNI_256, VNNI_512

# vpdpbusd zmm issues 2 per cycle with ~4-5 cycle latency: 12+ independent accumulators reach peak
# (measured on Zen 5), and the u8 operand cannot use a {1to16} memory broadcast, so several column
# groups share each broadcast row. 32 zmm registers leave room for the B vectors.
_VNNI_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: one row, 8 groups = 8 independent accumulators, B streamed once"),
    Tile(2, mr=2, nr=4, why="two rows share each B load"),
    Tile(4, mr=4, nr=4, why="16 accumulators: one A broadcast feeds 4 instructions; 64-column B panel"),
    Tile(256, mr=4, nr=4, kblock=512, why="large K: a 512-deep B panel (32 KiB) stays in L1 across row tiles"),
)
# 16 ymm registers. vpdpbusd accumulates in place: 12 accumulators + broadcast + 2 B vectors = 15.
_VNNI_YMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators over 64 columns"),
    Tile(2, mr=2, nr=4, why="two rows share each B load"),
    Tile(6, mr=6, nr=2, why="12 accumulators + broadcast + 2 B vectors = 15 of 16 ymm"),
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

X86_TARGETS = (
    TargetSpec(
        name="x86-avx512-vnni",
        llvm={"kind": "llvm", "mcpu": "znver4"},
        features=("avx2", "avx512f", "avx512bw", "avx512vnni"),
        gemm=VNNI_512,
        tiles=_VNNI_ZMM_TILES,
        description="AVX-512 VNNI (Cascade Lake and later, Zen 4/5): vpdpbusd zmm",
        aliases=("avx512-vnni", "vnni"),
    ),
    TargetSpec(
        name="x86-avx-vnni",
        llvm={"kind": "llvm", "mcpu": "alderlake"},
        features=("avx2", "avxvnni"),
        gemm=VNNI_256,
        tiles=_VNNI_YMM_TILES,
        description="AVX-VNNI without AVX-512 (Alder Lake and later client cores): {vex} vpdpbusd ymm",
    ),
    TargetSpec(
        name="x86-avx512",
        llvm={"kind": "llvm", "mcpu": "skylake-avx512"},
        features=("avx2", "avx512f", "avx512bw"),
        gemm=PMADDWD_512,
        tiles=_MADD_ZMM_TILES,
        bounded=(GemmRecipe(PMADDUBSW_512, _UBSW_ZMM_TILES),),
        description="AVX-512BW without VNNI: exact int16 vpmaddwd zmm; vpmaddubsw only for weights proven not to saturate",
    ),
    TargetSpec(
        name="x86-avx2",
        llvm={"kind": "llvm", "mcpu": "haswell"},
        features=("avx2",),
        gemm=PMADDWD_256,
        tiles=_MADD_YMM_TILES,
        bounded=(GemmRecipe(PMADDUBSW_256, _UBSW_YMM_TILES),),
        description="AVX2: exact int16 vpmaddwd ymm; vpmaddubsw only for weights proven not to saturate",
    ),
)
