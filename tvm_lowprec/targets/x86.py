"""x86 targets. One row per instruction set; tiles say why their numbers are what they are."""

from ..intrin.x86 import PMADDWD_256, PMADDWD_512, VNNI_256, VNNI_512
from ..hwspec import TargetSpec, Tile

# Tiles for 16-lane (zmm) intrinsics. vpdpbusd zmm issues 2 per cycle with ~4-5 cycle latency:
# 12+ independent accumulators reach peak, and the u8 operand cannot use a {1to16} memory broadcast,
# so several column groups per broadcast row are needed.
_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: one row, 8 groups = 8 independent accumulators, B streamed once"),
    Tile(2, mr=2, nr=4, why="two rows share each B load"),
    Tile(4, mr=4, nr=4, why="16 accumulators: one A broadcast feeds 4 instructions; 64-column B panel in L1"),
    Tile(256, mr=4, nr=4, kblock=512, why="large K: 512-deep B panel (32 KiB) stays in L1 across row tiles"),
)
# Tiles for 8-lane (ymm) intrinsics: 16 ymm registers; 12 accumulators leave room for operands.
_YMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators over 64 columns"),
    Tile(2, mr=2, nr=4, why="two rows share each B load"),
    Tile(4, mr=4, nr=3, why="12 accumulators + 1 broadcast + up to 3 B vectors fit 16 ymm registers"),
    Tile(256, mr=4, nr=3, kblock=512, why="large K: keep the B micro-panel in L1/L2"),
)

X86_TARGETS = (
    TargetSpec(
        name="x86-avx512-vnni",
        llvm={"kind": "llvm", "mcpu": "znver4"},
        features=("avx2", "avx512f", "avx512bw", "avx512vnni"),
        gemm=VNNI_512,
        tiles=_ZMM_TILES,
        description="AVX-512 VNNI (Cascade Lake and later, Zen 4/5): vpdpbusd zmm",
        aliases=("avx512-vnni", "vnni"),
    ),
    TargetSpec(
        name="x86-avx-vnni",
        llvm={"kind": "llvm", "mcpu": "alderlake"},
        features=("avx2", "avxvnni"),
        gemm=VNNI_256,
        tiles=_YMM_TILES,
        description="AVX-VNNI without AVX-512 (Alder Lake and later client cores): {vex} vpdpbusd ymm",
    ),
    TargetSpec(
        name="x86-avx512",
        llvm={"kind": "llvm", "mcpu": "skylake-avx512"},
        features=("avx2", "avx512f", "avx512bw"),
        gemm=PMADDWD_512,
        tiles=_ZMM_TILES,
        description="AVX-512BW without VNNI: exact int16 vpmaddwd zmm (never the saturating vpmaddubsw)",
    ),
    TargetSpec(
        name="x86-avx2",
        llvm={"kind": "llvm", "mcpu": "haswell"},
        features=("avx2",),
        gemm=PMADDWD_256,
        tiles=_YMM_TILES,
        description="AVX2: exact int16 vpmaddwd ymm (never the saturating vpmaddubsw)",
    ),
)
