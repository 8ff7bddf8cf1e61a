"""x86 targets. One row per instruction set; tiles say why their numbers are what they are."""

from ..hwspec import FmaIntrin, GemmRecipe, Memory, TargetSpec, Tile
from ..intrin.x86 import (PMADDUBSW_256, PMADDUBSW_512, PMADDWD_256, PMADDWD_512, VNNI_256, VNNI_256_VL, VNNI_512,
                          VPDPWSSD_512)
from ..intrin.lookup import VPERMI2B_ZMM, VPSHUFB_YMM, VPSHUFB_ZMM
from ..intrin.permute import VPERMPS_YMM, VPERMPS_ZMM
from ..intrin.x86_bf16 import VDPBF16PS_512
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
    Tile(4, mr=4, nr=4, grow_rows=5, why="16 accumulators, one A broadcast feeds 4 instructions; llvm-mca 97.9% at "
         "M=4, 8, 16, 128 (rank 1 of 47 at 16x3072x768; 4x3 94.7%, 2x8 92.3%). Up to 5 rows (20 accumulators + 4 B "
         "+ broadcast = 25 zmm) where 4 pad M by over 2%: ViT-B/16 at 112x112 (M = 50) 24.87 -> 24.04 ms on Zen 4"),
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
# 6x2 with int16 weights later spilled: LLVM unrolls the K loop by two and loads both steps' B
# vectors first (12 accumulators + 4 B + broadcast + temporary = 18 ymm), so one accumulator went
# through the stack and its store-to-load round trip bounded the loop: 101-102 GOPS at 1024^3,
# 250x384x1536 and 196x128x1152 (Zen 3, one thread, interleaved, best of 9). With int8 weights
# widened in the loop (vpmovsxbw from memory, each B vector live only for its row products) no
# register spills: 149, 149 and 142 GOPS, the vpmaddwd peak (137-157: peak/peak_avx2.c), and the
# packed weights keep half the bytes. 5x2 with int16 weights (16 ymm with the unrolled loads) was level.
_MADD_YMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: int8 weights widened in the loop (bandwidth-bound: 2x bytes lost 40%)"),
    Tile(2, mr=2, nr=4, wide_b=True, why="8 accumulators + 4 B + broadcast + temporary = 14"),
    Tile(4, mr=4, nr=2, wide_b=True, why="8 accumulators + 2 B + broadcast + temporary = 12"),
    Tile(6, mr=6, nr=2, why="12 accumulators + broadcast + temporary + B widened in the loop: no spill "
         "when LLVM unrolls K by two (int16 B, its loads hoisted, spilled an accumulator: 101 vs 149 GOPS)"),
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
# vpmaddubsw ymm (AVX2 without VNNI), int8 activations: the GEMV tile for every M. Measured again on
# Zen 3 (block 32, interleaved, best of 7, both tiles built and timed in one process): 2x4 lost at
# every M, 4096x4096 at 1 thread M=16 4.64 vs 4.31 ms, M=128 35.0 vs 31.7 (2 threads 16.5 vs 15.6);
# 128x896x4864 9.33 vs 8.60; and a symbolic M (one compile for decode and prefill) takes the tile of
# SYMBOLIC_ROWS, so 2x4 ran the decode step's GEMVs with a padded row: 1x4864x896 175 vs 79 us.
_NIBBLE_UBSW_YMM_TILES = (_NIBBLE_TILES[0],)
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

# float32 GEMMs (kernels/fp32_gemm: layers left float). vfmadd231ps accumulates in place and takes a
# broadcast row; B (the packed weight panel) is loaded as nr vectors per step of K.
# Measured on Zen 3 (one thread, 128x768x768, noisy host: best of runs): 6x2 with K whole 32 GFLOPS,
# with a 128-deep K block (the panel's slice, 8 KiB, stays in L1 across row tiles) 85, 256-deep 80,
# 384-deep 59; 128x3072x768 and 128x768x3072: 6x2/K256 50-62, 4x3/K192 52-60.
FMA_YMM = FmaIntrin("vfmadd231ps ymm", vector_bits=256, registers=16, features=("avx2",))
FMA_ZMM = FmaIntrin("vfmadd231ps zmm", vector_bits=512, registers=32, features=("avx512f",))
_FMA_YMM_TILES = (
    Tile(1, mr=1, nr=4, why="GEMV: 4 accumulators x 8 lanes, the weights streamed once (bandwidth-bound)"),
    Tile(2, mr=2, nr=4, why="two rows share each weight vector: 8 accumulators + 4 B + broadcast = 13 ymm"),
    Tile(6, mr=6, nr=2, kblock=128, why="12 accumulators + 2 B + broadcast = 15 of 16 ymm (BLIS's AVX2 shape); "
         "a 128-deep K block keeps the weight panel's slice in L1: 85 GFLOPS vs 32 with K whole"),
)
_FMA_ZMM_TILES = (
    Tile(1, mr=1, nr=4, why="GEMV: 4 zmm accumulators (untimed: no AVX-512 host here)"),
    Tile(2, mr=2, nr=4, why="8 accumulators + 4 B + broadcast"),
    Tile(6, mr=6, nr=4, kblock=128, why="24 accumulators + 4 B + broadcast = 29 of 32 zmm (untimed)"),
)
_FMA_YMM = GemmRecipe(FMA_YMM, _FMA_YMM_TILES)
_FMA_ZMM = GemmRecipe(FMA_ZMM, _FMA_ZMM_TILES)

# bf16 GEMMs (kernels/bf16_gemm: float8 weights, bfloat16 PTQ layers) on vdpbf16ps zmm, where the CPU
# has AVX512_BF16 (an optional recipe: TargetSpec.for_cpu drops it elsewhere). vdpbf16ps accumulates in
# place like vpdpbusd; the activation pair (one dword) is broadcast once per row and step of K, each weight
# vector loaded once per step and shared by the tile's rows (a 1-row tile reads it as the instruction's
# memory operand). Not timed: no AVX512_BF16 host was at hand. llvm-mca-19 (benchmarks/predict_bf16_tiles.py,
# results/predicted/bf16_tiles.md), sapphirerapids model: every tile of 8+ accumulators without spills at
# 98-99% of one vdpbf16ps zmm per 2 cycles (1x4: 80%); 2x12 and 3x8 spill. Its znver4 model is no guide
# here (the register form once per 3 cycles, the memory form once per cycle: 1-row tiles "win" 3x).
# So the tiles are chosen by registers: at least 8 accumulators, no spill, weight vectors shared by rows.
_BF16_ZMM_TILES = (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulators, each weight vector a memory operand, read once (bandwidth-"
         "bound: 2 bytes a weight); llvm-mca-19 (SPR) 98% where 1x4 gets 80%"),
    Tile(2, mr=2, nr=8, why="16 accumulators + 8 weight vectors + 2 broadcasts = 26 zmm; each weight vector feeds 2 rows"),
    Tile(4, mr=4, nr=4, why="16 accumulators + 4 weight vectors + broadcasts, no spill; llvm-mca-19 (SPR) 99% at 16x3072x768"),
    Tile(6, mr=6, nr=4, why="24 accumulators + 4 weight vectors + broadcasts = 30 of 32 zmm, no spill; a weight "
         "load per 6 instructions (4x4: per 4); llvm-mca-19 (SPR) 99% at 256x1024x1024"),
)
_BF16_ZMM = GemmRecipe(VDPBF16PS_512, _BF16_ZMM_TILES)

# LLVM features that only one vendor's x86 CPUs have: a row for "Cascade Lake and later, Zen 4/5" must
# not let its mcpu bring one in (LLVM uses SSE4a's insertq for plain shuffles), unless the row lists it
# in ``features``; tests/test_targets.py checks every x86 row
VENDOR_ONLY = ("sse4a", "xop", "fma4", "tbm", "clzero", "mwaitx", "rdpru")

# llvm-mca (tvm_lowprec.perfmodel) has no memory model, and no Intel figures were measured here: the VNNI
# rows' memory side is the project's Zen 5 class VNNI machine, one core (shared/TVM027_NOTES.md:
# vpdpbusd zmm about 1070 GOPS, ymm half; a GEMV streamed its weights from L3 at 98 GB/s; L3 reads
# 92-117 GB/s). LLVM 14's llvm-mca maps the three Intel server CPUs to one Skylake-SP model and alderlake
# to the Skylake client model; it has no Zen 4/5 model (the VNNI row's own mcpu, znver4).
_ZEN5_VNNI = Memory(1070.0, 98.0, "Zen 5 class, one core (measured: shared/TVM027_NOTES.md)")
_ZEN5_VNNI_YMM = Memory(535.0, 98.0, "Zen 5 class core running the 256-bit form (measured peak halved)")

X86_TARGETS = (
    TargetSpec(
        name="x86-avx512-vnni",
        vector_round=("vrndscaleps", "vroundps"),
        vector_convert=("vcvtps2dq",),
        # znver4 for its scheduling model, without the AMD-only extensions (VENDOR_ONLY): LLVM emits SSE4a's
        # insertq for plain shuffles, and built with it the row faulted (SIGILL) on an Emerald Rapids host
        llvm={"kind": "llvm", "mcpu": "znver4", "mattr": ["-sse4a", "-clzero", "-mwaitx", "-rdpru"]},
        features=("avx2", "avx512f", "avx512bw", "avx512vl", "avx512vnni"),
        gemm=VNNI_512,
        # GEMMs of at most 8 output columns (the detectors' 8-channel stems and C2f convolutions) on
        # ymm: a zmm would carry 8 idle lanes, and Zen 4 issues a ymm vpdpbusd twice as often as a zmm
        # one (463 GOPS either way: benchmarks/results/zen4-epyc-2core/peak.txt). Measured there, one
        # thread: 25600x8x36 0.093 -> 0.063 ms, 6400x8x72 0.041 -> 0.030 ms (the 16-column GEMMs lost
        # 10-30% on ymm: they keep zmm). ymm tiles: 16 registers' worth, EVEX has 32.
        narrow=GemmRecipe(VNNI_256_VL, _VNNI_YMM_TILES),
        nibble=GemmRecipe(NIBBLE_VNNI_512, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_ZMM_TILES,
        tiles=_VNNI_ZMM_TILES,
        int16=_INT16_VNNI_ZMM,
        fma=_FMA_ZMM,
        bf16=_BF16_ZMM,  # llvm mcpu znver4 has AVX512_BF16; a derived spec keeps it only where its CPU does
        lookup=VPSHUFB_ZMM,
        register_permute=VPERMPS_ZMM,
        wide_lookup=VPERMI2B_ZMM,  # llvm mcpu znver4 has VBMI; Cascade Lake does not (for_cpu drops it there)
        description="AVX-512 VNNI (Cascade Lake and later, Zen 4/5): vpdpbusd zmm; vdpbf16ps zmm where AVX512_BF16 is",
        aliases=("avx512-vnni", "vnni"),
        mca_cpus=("icelake-server", "sapphirerapids", "cascadelake"),
        memory=_ZEN5_VNNI,
        grid_prediction=True,
    ),
    TargetSpec(
        name="x86-avx-vnni",
        vector_round=("vroundps",),
        vector_convert=("vcvtps2dq",),
        llvm={"kind": "llvm", "mcpu": "alderlake"},
        features=("avx2", "avxvnni"),
        gemm=VNNI_256,
        nibble=GemmRecipe(NIBBLE_VNNI_256, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_TILES,
        tiles=_VNNI_YMM_TILES,
        int16=_INT16_YMM,
        fma=_FMA_YMM,
        lookup=VPSHUFB_YMM,
        register_permute=VPERMPS_YMM,
        description="AVX-VNNI without AVX-512 (Alder Lake and later client cores): {vex} vpdpbusd ymm",
        mca_cpus=("alderlake",),
        memory=_ZEN5_VNNI_YMM,
        grid_prediction=True,
    ),
    TargetSpec(
        name="x86-avx512",
        vector_round=("vrndscaleps", "vroundps"),
        vector_convert=("vcvtps2dq",),
        llvm={"kind": "llvm", "mcpu": "skylake-avx512"},
        features=("avx2", "avx512f", "avx512bw"),
        gemm=PMADDWD_512,
        nibble=GemmRecipe(NIBBLE_UBSW_512, _NIBBLE_TILES),
        nibble_float=_NIBBLE_FLOAT_ZMM_TILES,
        tiles=_MADD_ZMM_TILES,
        int16=_INT16_ZMM,
        fma=_FMA_ZMM,
        bounded=(GemmRecipe(PMADDUBSW_512, _UBSW_ZMM_TILES),),
        lookup=VPSHUFB_ZMM,
        register_permute=VPERMPS_ZMM,
        description="AVX-512BW without VNNI: exact int16 vpmaddwd zmm; vpmaddubsw only for weights proven not to saturate",
        mca_cpus=("skylake-avx512", "cascadelake"),
    ),
    TargetSpec(
        name="x86-avx2",
        vector_round=("vroundps",),
        vector_convert=("vcvtps2dq",),
        llvm={"kind": "llvm", "mcpu": "haswell"},
        features=("avx2",),
        gemm=PMADDWD_256,
        nibble=GemmRecipe(NIBBLE_UBSW_256, _NIBBLE_UBSW_YMM_TILES),
        nibble_float=_NIBBLE_FLOAT_TILES,
        tiles=_MADD_YMM_TILES,
        int16=_INT16_YMM,
        fma=_FMA_YMM,
        bounded=(GemmRecipe(PMADDUBSW_256, _UBSW_YMM_TILES),),
        lookup=VPSHUFB_YMM,
        register_permute=VPERMPS_YMM,
        description="AVX2: exact int16 vpmaddwd ymm; vpmaddubsw only for weights proven not to saturate",
        mca_cpus=("znver3", "haswell"),
    ),
)
