"""AArch64 targets. One row per instruction set; tiles say why their numbers are what they are.

AArch64 has 32 128-bit vector registers. ``sdot`` accumulates in place: a tile needs its ``mr * nr``
accumulators, ``nr`` B vectors and one broadcast per row in flight. ``smull`` + ``sadalp`` needs an
int16 temporary per product vector before the pairwise accumulate. ``usmmla`` keeps 2 x 2 blocks.

No Arm host is at hand: the tiles were chosen with the static model (:mod:`tvm_lowprec.perfmodel`,
``benchmarks/predict_tiles.py`` -> ``benchmarks/results/predicted/tiles.md``). LLVM 14's llvm-mca has
no Neoverse model (its ``neoverse-v1``/``neoverse-n2`` are the Cortex-A57 model); LLVM 19's
(``llvm-mca-19``, Debian package ``llvm-19``) has both, and the percentages below quote it first.

No row has an int16 x int8 recipe (``TargetSpec.int16`` is None): layers with 16-bit activations stay
on the float path here (``smlal`` by lane would be the instruction; not done).
"""

from ..hwspec import FmaIntrin, GemmRecipe, TargetSpec, Tile
from ..intrin.arm import NIBBLE_SDOT, SDOT, SMULL, USMMLA
from ..intrin.lookup import TBL_V16

_AARCH64 = "aarch64-linux-gnu"

# sdot: a broadcast per row and a B vector per column group; two rows, because N2's broadcast from a
# general register costs 3 cycles on one pipe (see the 2x8 reason).
_DOT_TILES = (
    Tile(1, mr=1, nr=16, why="GEMV: 16 independent sdot chains over one broadcast. llvm-mca at 1x4096x4096 "
         "(benchmarks/results/predicted/tiles.md): 99.8% of the sdot peak on neoverse-n2, 70.4% on neoverse-v1 "
         "(LLVM 19's models; 1x8: 99.4 / 66.3), 42.1% on LLVM 14's Cortex-A57 stand-in (1x8: 39.9); the loop "
         "is load-bound on V1 (one B vector per sdot) and a GEMV is bandwidth-bound anyway"),
    Tile(2, mr=2, nr=8, why="16 accumulators + 8 B + 2 broadcasts = 26 of 32 registers, no spill. llvm-mca at "
         "1024^3 and 16x3072x768: 99.5% of the sdot peak on neoverse-v1, 99.8% on neoverse-n2 (LLVM 19's "
         "models), 57.0% on LLVM 14's Cortex-A57 stand-in (3-wide dispatch; no tile passes 60% there). Two rows "
         "because each row's broadcast (ldr + eor + dup from a general register) costs N2's single M0 pipe "
         "3 cycles: 4x4 is 12 cycles per 16 sdot there (66.6%; 99.5% on V1, 53.3% on A57), 2x8 is 8"),
)
# usmmla: each accumulator is a 2 x 2 block (rows x column pairs); a tile of mr rows and nr column
# pairs holds mr / 2 * nr accumulators, mr / 2 activation vectors (two 8-byte row loads each) and nr
# B vectors in flight.
_MMLA_TILES = (
    Tile(1, mr=2, nr=8, why="GEMV: one row pair (the second row padding) against 16 columns: 8 accumulators; "
         "llvm-mca at 1x4096x4096: 29.8% of the usmmla peak on neoverse-v1, 44.2% on neoverse-n2 (load-bound: "
         "each usmmla takes a new B vector; a GEMV is bandwidth-bound anyway)"),
    Tile(4, mr=4, nr=6, why="2 row pairs x 6 column pairs = 12 accumulators + 2 A + 6 B = 20 of 32 registers; "
         "each A pair (two 8-byte loads joined) feeds 6 instructions. llvm-mca at 16x3072x768: 85.0% of the "
         "usmmla peak on neoverse-v1, 85.5% on neoverse-n2"),
    Tile(64, mr=6, nr=4, why="3 row pairs x 4 column pairs = 12 accumulators + 3 A + 4 B = 19 registers. "
         "llvm-mca at 1024^3: 79.3% of the usmmla peak on neoverse-v1 (4 usmmla per cycle: the A joins and B "
         "loads bound it; 4x4 66.2%), 79.7% on neoverse-n2 (2x8 88.4% there)"),
)
# smull + sadalp: 2 instructions per 8 products, plus an int16 temporary for each product in flight.
_WIDEN_TILES = (
    Tile(1, mr=1, nr=16, why="GEMV: 16 accumulators + temporaries, no spill. llvm-mca at 1x4096x4096: 79.9% of "
         "the smull+sadalp peak on LLVM 14's Cortex-A57 model (cortex-a72's, and its neoverse-v1/n2 stand-in; 1x8: 66.5), 99.7% / 99.9% on LLVM 19's "
         "neoverse-v1 / neoverse-n2"),
    Tile(2, mr=2, nr=8, why="16 accumulators + 8 B (8-byte) + 2 broadcasts + temporaries within 32 registers, "
         "no spill. llvm-mca at 1024^3 and 16x3072x768: 88.4% of the smull+sadalp peak on LLVM 14's Cortex-A57 "
         "model (cortex-a72's, the row's core; 4x3: 74.8, built as 4x2 at N=1024: 61.4), 99.7% / 99.8% on "
         "LLVM 19's neoverse-v1 / neoverse-n2"),
)


def _llvm(*features: str) -> dict:
    return {"kind": "llvm", "mtriple": _AARCH64, "mattr": [f"+{f}" for f in features]}


# 4-bit weights (tvm_lowprec.kernels.nbits), 4 lanes per vector: 16 sdot chains per task, as the
# 8-bit GEMV; two rows share each unpacked weight vector. Not measured on hardware (qemu checks results).
_NIBBLE_TILES = (
    Tile(1, mr=1, nr=16, why="GEMV: 16 accumulators, one contiguous weight stream per task, as _DOT_TILES"),
    Tile(2, mr=2, nr=8, why="16 accumulators; two rows share each weight vector's unpacking"),
)

# float32 GEMMs (kernels/fp32_gemm: layers left float): fmla on 4 float32 lanes, the activation
# broadcast (dup/ld1r) per row. 32 registers: 6x4 = 24 accumulators + 4 B + broadcast = 29. Not
# measured (no Arm host; qemu checks results): the x86 ymm nest's shapes scaled to 32 registers.
FMLA = FmaIntrin("fmla v.4s", vector_bits=128, registers=32, features=("neon",))
_FMLA = GemmRecipe(FMLA, (
    Tile(1, mr=1, nr=8, why="GEMV: 8 accumulator chains over 4 lanes, the weights streamed once"),
    Tile(2, mr=2, nr=8, why="16 accumulators + 8 B + broadcast = 25 of 32 registers"),
    Tile(6, mr=6, nr=4, kblock=128, why="24 accumulators + 4 B + broadcast = 29 of 32; the x86 rows' K block"),
))

# llvm-mca (tvm_lowprec.perfmodel) CPU models. LLVM 14 has no Neoverse model: neoverse-v1, neoverse-n2 (and
# neoverse-n1, cortex-a76, cortex-a72, cortex-x2, cortex-a710) all take its Cortex-A57 model (resources
# ``A57Unit*``: 3-wide dispatch, two 128-bit SIMD pipes, sdot/usdot latency 3 at 2 per cycle), so their
# figures are one model's. ampere1 (Armv8.6 with dotprod and i8mm) has a model of its own. cortex-a53's
# in-order model is left out: the ceiling block (each accumulator's smull then its sadalp) stalls an
# in-order pipe (0.14 steps per cycle where a software-pipelined block reaches 0.48).
_DOT_MCA_CPUS = ("neoverse-v1", "neoverse-n2", "ampere1")

ARM_TARGETS = (
    TargetSpec(
        name="arm64-i8mm",
        vector_round=("frintn",),
        vector_convert=("frintx",),
        lookup=TBL_V16,
        llvm=_llvm("neon", "dotprod", "i8mm"),
        features=("neon", "dotprod", "i8mm"),
        gemm=USMMLA,
        tiles=_MMLA_TILES,
        nibble=GemmRecipe(NIBBLE_SDOT, _NIBBLE_TILES),
        fma=_FMLA,
        description="Armv8.6 i8mm (Graviton3/4, Neoverse V1/V2/N2, Cortex-A710 and later): usmmla 2x8x2, "
                    "u8 x s8 natively",
        qemu_cpu="max",
        aliases=("graviton3", "graviton4", "neoverse-v1", "neoverse-v2", "neoverse-n2", "cortex-a710", "cortex-x2"),
        mca_cpus=_DOT_MCA_CPUS,
        grid_prediction=True,
    ),
    TargetSpec(
        name="arm64-dotprod",
        vector_round=("frintn",),
        vector_convert=("frintx",),
        lookup=TBL_V16,
        llvm=_llvm("neon", "dotprod"),
        features=("neon", "dotprod"),
        gemm=SDOT,
        tiles=_DOT_TILES,
        nibble=GemmRecipe(NIBBLE_SDOT, _NIBBLE_TILES),
        fma=_FMLA,
        description="Armv8.2 dot product (Cortex-A55/A76/A78, Neoverse N1, Graviton2, Raspberry Pi 5): sdot, "
                    "u8 activations shifted to s8",
        qemu_cpu="cortex-a76",  # dotprod, no i8mm
        aliases=("graviton2", "neoverse-n1", "cortex-a76", "cortex-a78", "cortex-a55", "rpi5"),
        mca_cpus=_DOT_MCA_CPUS,
        grid_prediction=True,
    ),
    TargetSpec(
        name="arm64-neon",
        vector_round=("frintn",),
        vector_convert=("frintx",),
        lookup=TBL_V16,
        llvm=_llvm("neon"),
        features=("neon",),
        gemm=SMULL,
        tiles=_WIDEN_TILES,
        fma=_FMLA,
        description="Armv8.0 Neon without dot product (Cortex-A53/A72, Raspberry Pi 3/4): exact smull + sadalp",
        qemu_cpu="cortex-a72",  # Armv8.0: no dotprod
        aliases=("cortex-a53", "cortex-a72", "rpi4"),
        mca_cpus=("cortex-a72", "cortex-a57"),
        grid_prediction=True,
    ),
)

# the row a board's cross-compiled modules are built for by default (tvm_lowprec.board.cross_compile): Neon
# and the dot product, which the emulated board (qemu -cpu max) and every Armv8.2+ board have
BOARD_ROW = "arm64-dotprod"
