"""Hardware described as data: one frozen row per instruction shape and per target.

A :class:`GemmIntrin` says what one tensor instruction computes (``lanes`` int32 outputs, each the
dot product of ``kstep`` activation bytes with ``kstep`` weight bytes) and how operands must be laid
out for it. A :class:`TargetSpec` names an LLVM target, the CPU features it needs, the intrinsic its
integer GEMM uses and a tile table. Schedules read these rows; they never name a vendor or a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping

_INT_DTYPES = ("uint8", "int8", "int16")


@dataclass(frozen=True)
class AOperand:
    """How one activation dtype is fed to an intrinsic.

    ``storage``: dtype the kernel reads (``int16`` means a widening pre-pass);
    ``offset``: constant the intrinsic adds to every activation value before multiplying
    (128 for s8 on VNNI, whose activation operand is unsigned); ``intrin``: registered name;
    ``intrin_wide_b``: a variant reading weights pre-widened to int16 at pack time (None: no such
    variant). Constant weights cost nothing to widen once, and the widened form lets the instruction
    take B straight from memory, freeing registers for accumulators.
    """

    storage: str
    offset: int
    intrin: str
    intrin_wide_b: str | None = None

    def __post_init__(self):
        if self.storage not in _INT_DTYPES:
            raise ValueError(f"AOperand.storage must be one of {_INT_DTYPES}, got {self.storage!r}")


@dataclass(frozen=True)
class GemmIntrin:
    """One dot-product instruction shape: ``C[lanes] += sum_k A[k] * B[lanes, k]`` for k < kstep, or
    with ``rows`` > 1 a matrix instruction: ``C[rows, lanes] += sum_k A[rows, k] * B[lanes, k]`` (Arm's
    ``usmmla``: 2 x 2 int32 from 2 x 8 bytes of each operand). ``lanes`` counts the outputs per row."""

    name: str
    lanes: int
    kstep: int
    vector_bits: int
    a_operands: Mapping[str, AOperand]
    saturates: bool = False  # True would make results wrong for some inputs; rows must keep False
    features: tuple[str, ...] = ()
    # None: exact for every int8 weight. An int: the instruction sums pairs of u8 x s8 products in
    # int16, exact only when for each adjacent weight pair (k = 2j, 2j+1) the positive parts sum to at
    # most this bound and the negative parts to at least minus it (255 * 128 = 32640 <= 32767).
    # Such a row is used only for constant weights that pass :meth:`accepts`.
    weight_pair_bound: int | None = None
    # LLVM intrinsic name -> its semantics in generic IR (tvm_lowprec.intrin.semantics), for every
    # target-specific intrinsic the impl calls: what lets the row run emulated on any x86-64 host
    emulation: Mapping[str, object] = field(default_factory=dict)
    rows: int = 1  # activation rows per instruction (a matrix instruction: more than one)
    # the instruction lane by lane: ``lane_product(a, b, c)`` -> ``c[l] += sum_k a[l, k] * b[l, k]`` on
    # vectors of ``lanes * kstep`` bytes (``a`` typed ``lane_a_bytes``, the instruction's own activation
    # signedness; ``b`` int8), the accumulator ``int32 x lanes``; what the depthwise kernel of
    # :mod:`tvm_lowprec.kernels.depthwise_dot` multiplies four taps a lane with. None: no such form
    lane_product: object = None
    lane_a_bytes: str = "uint8"
    # how one accumulator's update looks in assembly (:class:`tvm_lowprec.isa.IntrinAsm`): what the tests
    # count in a kernel and llvm-mca models (:mod:`tvm_lowprec.perfmodel`); None: neither
    asm: object = None

    def __post_init__(self):
        if self.lanes * self.rows * 32 != self.vector_bits:
            raise ValueError(f"{self.name}: {self.rows} x {self.lanes} int32 lanes do not fill {self.vector_bits} bits")
        if self.kstep not in (2, 4, 8):
            raise ValueError(f"{self.name}: kstep {self.kstep} is not a supported reduction width")
        if self.saturates:
            raise ValueError(f"{self.name}: saturating intrinsics give wrong integer results; not allowed")
        for dtype in self.a_operands:
            if dtype not in ("uint8", "int8"):
                raise ValueError(f"{self.name}: activation dtype {dtype!r} is not 8-bit")

    def accepts(self, b_signed) -> bool:
        """Can this instruction multiply ``b_signed[K, N]`` (int8 values) exactly with any activations?"""
        if self.weight_pair_bound is None:
            return True
        if b_signed is None:
            return False  # runtime weights: cannot be checked at compile time
        import numpy as np

        b = np.asarray(b_signed, np.int32)
        if b.shape[0] % 2:
            b = np.concatenate([b, np.zeros((1, b.shape[1]), np.int32)])
        pairs = b.reshape(b.shape[0] // 2, 2, b.shape[1])
        pos, neg = np.clip(pairs, 0, None).sum(axis=1), np.clip(pairs, None, 0).sum(axis=1)
        return bool(pos.max(initial=0) <= self.weight_pair_bound and neg.min(initial=0) >= -self.weight_pair_bound)

    def operand(self, a_dtype: str) -> AOperand:
        try:
            return self.a_operands[a_dtype]
        except KeyError:
            raise ValueError(f"intrinsic {self.name} takes activations {sorted(self.a_operands)}, not {a_dtype}") from None


@dataclass(frozen=True)
class Tile:
    """A register tile for the GEMM, chosen by the number of rows M.

    ``mr`` rows x ``nr`` column groups of ``lanes`` outputs make ``mr * nr`` accumulators;
    ``kblock`` is the reduction depth kept per pass over a B micro-panel (0: all of K).
    """

    min_m: int
    mr: int
    nr: int
    kblock: int = 0
    why: str = ""
    wide_b: bool = False  # use the operand's widened-weight variant (int16; for 4-bit float: a float block)
    # the most rows a tile may take instead of ``mr`` where ``mr`` rows pad M by more than
    # kernels.qgemm.ROW_PADDING_LIMIT (0: never): rows that divide M better (ViT's M = 50: 5, not 4 x 13 = 52)
    grow_rows: int = 0

    def __post_init__(self):
        if self.mr < 1 or self.nr < 1 or self.min_m < 1:
            raise ValueError(f"tile {self}: mr, nr and min_m must be positive")
        if max(self.mr, self.grow_rows) * self.nr > 28:
            raise ValueError(f"tile {self}: {max(self.mr, self.grow_rows) * self.nr} accumulators would spill the "
                             "vector registers")


@dataclass(frozen=True)
class GemmRecipe:
    """An intrinsic with the tile table tuned for it."""

    intrin: GemmIntrin | NibbleIntrin | Bf16Intrin | FmaIntrin
    tiles: tuple[Tile, ...]

    def __post_init__(self):
        if not self.tiles or self.tiles[0].min_m != 1:
            raise ValueError(f"{self.intrin.name}: the tile table must start with a row for min_m=1")
        mins = [t.min_m for t in self.tiles]
        if mins != sorted(mins):
            raise ValueError(f"{self.intrin.name}: tile rows must be sorted by min_m")

    def tile_for(self, m: int) -> Tile:
        """The last row whose ``min_m`` is at most ``m`` (IREE-style: later rows refine)."""
        chosen = self.tiles[0]
        for row in self.tiles:
            if row.min_m <= m:
                chosen = row
        return chosen


@dataclass(frozen=True)
class NibbleIntrin:
    """A 4-bit weight dot product (:mod:`tvm_lowprec.intrin.nibble`): ``lanes`` int32 outputs, each
    summing 8 int8 activations times 8 unsigned 4-bit weights packed in 4 bytes per lane."""

    name: str
    lanes: int
    intrins: Mapping[int, str]  # groups of 8 weights per call -> the registered tensor intrinsic
    vector_bits: int
    features: tuple[str, ...] = ()
    # LLVM intrinsic name -> its semantics (tvm_lowprec.intrin.semantics), for every target intrinsic
    # the impl calls: what runs the row emulated (empty: rows run under qemu)
    emulation: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.lanes * 32 != self.vector_bits:
            raise ValueError(f"{self.name}: {self.lanes} int32 lanes do not fill {self.vector_bits} bits")
        if 1 not in self.intrins:
            raise ValueError(f"{self.name}: no intrinsic for one group of 8 weights")

    def groups_for(self, block: int) -> int:
        """The most groups of 8 weights one call takes that divide a K block of ``block``."""
        return max(g for g in self.intrins if (block // 8) % g == 0)


@dataclass(frozen=True)
class FmaIntrin:
    """A float32 fused multiply-add on ``vector_bits`` vectors (``vfmadd231ps`` ymm/zmm, Neon ``fmla``):
    the float GEMM's instruction (:mod:`tvm_lowprec.kernels.fp32_gemm`). ``registers``: the vector
    register file a tile's accumulators, weight vectors and broadcast must fit."""

    name: str
    vector_bits: int
    registers: int
    features: tuple[str, ...] = ()

    @property
    def lanes(self) -> int:
        return self.vector_bits // 32


@dataclass(frozen=True)
class Bf16Intrin:
    """A bf16 pair dot product into float32 (``vdpbf16ps``, AVX512_BF16): per float32 lane
    ``C[i] += A[1] * B[i, 1]``, then ``C[i] += A[0] * B[i, 0]`` (that order, each step an FMA with
    denormal inputs read as zero and denormal results flushed: :mod:`tvm_lowprec.intrin.x86_bf16`),
    ``A`` one pair of bf16 activations broadcast to every lane, ``B`` ``lanes`` pairs of bf16 weights,
    a pair per 32-bit lane (the instruction's operand layout; the kernel packs weights so).

    ``intrin``: the registered tensor intrinsic; ``llvm_import``: LLVM IR defining the function its
    impl calls (linked into the kernel and inlined: :data:`tvm_lowprec.intrin.x86_bf16.IMPORT_PRAGMA`);
    ``registers``: the vector register file a tile's accumulators and weight vectors must fit.
    """

    name: str
    lanes: int
    vector_bits: int
    registers: int
    intrin: str
    llvm_import: str = ""
    features: tuple[str, ...] = ()
    # LLVM intrinsic name -> its semantics (tvm_lowprec.intrin.semantics): what runs the row emulated
    emulation: Mapping[str, object] = field(default_factory=dict)
    kstep = 2  # class constant: bf16 values per float32 lane

    def __post_init__(self):
        if self.lanes * 32 != self.vector_bits:
            raise ValueError(f"{self.name}: {self.lanes} float32 lanes do not fill {self.vector_bits} bits")


@dataclass(frozen=True)
class LookupIntrin:
    """A 256-entry byte table lookup of ``lanes`` 8-bit indices at once (``vpermi2b``, ``vpshufb``,
    Neon ``tbl``/``tbx``: :mod:`tvm_lowprec.intrin.lookup`), the kernel of a folded element-wise chain.

    ``replicate``: copies of each 16-entry slice of the table in the packed layout the instruction
    reads (1: the table as it is; ``vpshufb`` reads a slice per 128-bit lane, so ``lanes / 16``);
    ``emit(load, idx)``: the looked-up ``uint8x<lanes>`` vector of the ``uint8x<lanes>`` indices
    ``idx``, ``load(offset, n)`` reading ``n`` bytes of the packed table; ``min_ops``: the fewest
    element-wise operators (its dequantize and quantize included) a chain without a transcendental
    function must have for the lookup to cost less than the chain's vector arithmetic (a lone
    requantization is 2); ``emulation``: the semantics of the target intrinsics it calls.
    """

    name: str
    lanes: int
    replicate: int
    emit: Callable
    features: tuple[str, ...] = ()
    min_ops: int = 2
    emulation: Mapping[str, object] = field(default_factory=dict)
    why: str = ""
    asm: str = ""  # a regular expression matching the instruction, with its registers, in the assembly

    def __post_init__(self):
        if self.lanes % 16 or self.replicate not in (1, self.lanes // 16):
            raise ValueError(f"{self.name}: {self.lanes} lanes, {self.replicate} copies of each slice")

    @property
    def table_bytes(self) -> int:
        return 256 * self.replicate

    def slot(self, code):
        """Where the entry of ``code`` (0..255, an int or a TIR expression) sits in the packed table."""
        if self.replicate == 1:
            return code
        return (code >> 4) * (16 * self.replicate) + (code & 15)

    def pack(self, table):
        """The 256-entry ``table`` (a numpy array, index = code) in the layout the instruction reads."""
        import numpy as np

        table = np.asarray(table)
        if table.shape != (256,):
            raise ValueError(f"{self.name}: a lookup table has 256 entries, not {table.shape}")
        return table if self.replicate == 1 else np.concatenate(
            [np.tile(table[16 * j:16 * j + 16], self.replicate) for j in range(16)])


@dataclass(frozen=True)
class RegisterPermute:
    """A permute of float32 lanes by a vector of lane indices (``vpermps`` zmm/ymm): ``lanes`` table
    entries held in one register, looked up for ``lanes`` indices at once, which makes a 16-entry
    float table a lookup of one or two registers instead of a gather (the exponentials of the 8-bit
    softmax: :mod:`tvm_lowprec.intrin.permute`).

    ``llvm``: the LLVM intrinsic, ``(table <lanes x float>, idx <lanes x i32>)``, reading each index's
    low ``log2(lanes)`` bits; ``emulation``: its semantics (:mod:`.intrin.semantics`); ``asm``: a
    regular expression matching it, with its registers, in the assembly (LLVM may pick the integer
    form, ``vpermd``, of the same permute).
    """

    name: str
    lanes: int
    llvm: str
    features: tuple[str, ...] = ()
    emulation: Mapping[str, object] = field(default_factory=dict)
    asm: str = ""
    why: str = ""

    def __post_init__(self):
        if self.lanes not in (4, 8, 16):
            raise ValueError(f"{self.name}: {self.lanes} float32 lanes is not a register")


@dataclass(frozen=True)
class Memory:
    """The machine outside the inner loop, for :meth:`tvm_lowprec.perfmodel.Prediction.with_memory`: one
    core's instruction ceiling for the row's recipe (GOPS) and its streaming read bandwidth at the
    weights' size (GB/s), and where the figures come from."""

    peak_gops: float
    read_gbs: float
    source: str = ""

    def __post_init__(self):
        if self.peak_gops <= 0 or self.read_gbs <= 0:
            raise ValueError(f"peak and bandwidth must be positive: {self}")


@dataclass(frozen=True)
class TargetSpec:
    """A compilation target: the LLVM target, what the CPU must have, and the GEMM recipe."""

    name: str
    llvm: Mapping[str, object]
    features: tuple[str, ...]
    gemm: GemmIntrin
    tiles: tuple[Tile, ...]
    description: str = ""
    aliases: tuple[str, ...] = field(default=())
    # faster recipes tried before ``gemm``, each declining weights outside its pair bound
    bounded: tuple[GemmRecipe, ...] = ()
    # a recipe for GEMMs with at most its lanes output columns, tried first (N = 8 filling half of a zmm:
    # a ymm vpdpbusd, which a Zen 4 issues twice as often as a zmm one); None: ``gemm`` for every N
    narrow: GemmRecipe | None = None
    base: str = ""  # the registered row a derived spec (``native``) stands for
    # the qemu-user CPU model that runs this row's code on another host (:mod:`tvm_lowprec.qemu`): one
    # with the row's features and without the next row's, so a stray instruction dies with SIGILL
    qemu_cpu: str = ""
    # 4-bit weights (weight-only layers): a NibbleIntrin with its tiles; None where the row has no
    # 4-bit dot product (its int4 layers then run with float activations only)
    nibble: GemmRecipe | None = None
    # the 4-bit kernel's tiles for float activations (empty: ``nibble``'s). A tile with ``wide_b``
    # dequantizes each K block of a task once into a float buffer that all its row tiles share
    nibble_float: tuple[Tile, ...] = ()
    # int16 x int8 GEMMs (16-bit activations, :mod:`tvm_lowprec.kernels.qgemm16`): None where such
    # layers stay float
    int16: GemmRecipe | None = None
    # float32 GEMMs and convolutions (layers left float: FP32 models, PTQ fallbacks, calibration): an
    # FmaIntrin with its tiles; None leaves them to TVM's default lowering (unscheduled)
    fma: GemmRecipe | None = None
    # bf16 float GEMMs (:mod:`tvm_lowprec.kernels.bf16_gemm`: float8 weights widened to bf16, bfloat16
    # PTQ layers): a Bf16Intrin with its tiles. Optional: not every CPU of a row has it (AVX512_BF16 is in
    # Cooper Lake, Sapphire Rapids and Zen 4/5, not in Cascade Lake or Ice Lake, which have VNNI), so its
    # features are not the row's, and a spec derived for one CPU drops it where that CPU lacks them
    # (:meth:`for_cpu`); None: such layers run in float32
    bf16: GemmRecipe | None = None
    # the instructions that round float32 vectors half to even (``round``, ``nearbyint``), the one for the row's
    # widest vector first: what the assembly of a vectorized rounding holds (``vrndscaleps`` on zmm;
    # ``vroundps``, VEX, up to ymm, which LLVM still picks for narrower vectors on AVX-512 rows)
    vector_round: tuple[str, ...] = ()
    # what a vectorized quantize holds instead (its rint and conversion as :attr:`round_to_int`):
    # ``vcvtps2dq`` on x86 (no ``vrndscaleps``/``vroundps`` left), ``frintx`` on AArch64
    vector_convert: tuple[str, ...] = ()
    # 256-entry byte lookups (folded element-wise chains of one 8-bit tensor): a LookupIntrin the row's
    # features always have, and ``wide_lookup``, an optional faster one (AVX-512 VBMI's vpermi2b: not in
    # Cascade Lake, in Ice Lake and Zen 4/5), dropped by :meth:`for_cpu` where the CPU lacks it
    lookup: LookupIntrin | None = None
    wide_lookup: LookupIntrin | None = None
    # float32 lanes permuted by lane indices (the 8-bit softmax's exponentials from two 16-entry
    # tables); None: the softmax computes them (a polynomial) in the lanes
    register_permute: RegisterPermute | None = None
    # the static performance model (:mod:`tvm_lowprec.perfmodel`): the llvm-mca CPU models the row is
    # predicted for (the first the default, unless the row's own mcpu is listed); the measured machine
    # its memory side is predicted for (llvm-mca has none), or None; and whether the GEMM grid's
    # prediction section shows it (rows the hosts at hand rarely run: ``bench.grid.predicted_rows``)
    mca_cpus: tuple[str, ...] = ()
    memory: Memory | None = None
    grid_prediction: bool = False

    device = "cpu"  # class constant (not a field): what selects the schedule rules and the lowering
    optional = ("bf16", "wide_lookup")  # class constant: the recipes whose features a CPU of the row may lack
    float32_requant = True  # the float32 requantization of :func:`~tvm_lowprec.kernels.qgemm.requant_f32`
    # class constant: the LLVM intrinsic that converts float32 to int32 in the current rounding mode (half
    # to even), which a quantize uses for its ``rint`` and its conversion in one instruction (x86's
    # ``vcvtps2dq``; AArch64 ``frintx`` + ``fcvtzs``) where ``nearbyint`` + ``fptosi`` cost two on x86
    round_to_int = "llvm.lrint"

    @property
    def row(self) -> str:
        """The registered row's name (shipped tuning records are kept per row)."""
        return self.base or self.name

    @property
    def backend(self):
        """What its device brings (:class:`tvm_lowprec.backends.Backend`): rules, lowering, build, executor."""
        from .backends import backend_for

        return backend_for(self)

    @property
    def instruction(self) -> str:
        """What its integer GEMM runs on (the exact intrinsic's name)."""
        return self.gemm.name

    def __post_init__(self):
        default = GemmRecipe(self.gemm, self.tiles)  # validates the tile table
        if self.gemm.weight_pair_bound is not None:
            raise ValueError(f"{self.name}: the default intrinsic must be exact for every weight")
        extra = tuple(r for r in (self.int16, self.narrow) if r is not None)
        if self.narrow is not None and (self.narrow.intrin.lanes >= self.gemm.lanes
                                        or self.narrow.intrin.weight_pair_bound is not None):
            raise ValueError(f"{self.name}: the narrow recipe must be exact and have fewer lanes than {self.gemm.name}")
        for recipe in (*self.bounded, default, *extra):
            missing = set(recipe.intrin.features) - set(self.features)
            if missing:
                raise ValueError(f"{self.name}: intrinsic {recipe.intrin.name} needs {sorted(missing)}")
        if self.nibble is not None:
            self._check_nibble()
        if self.fma is not None:
            self._check_fma()
        if self.bf16 is not None:
            self._check_bf16()
        self._check_lookup()

    def _check_bf16(self):
        intrin = self.bf16.intrin
        if not isinstance(intrin, Bf16Intrin):
            raise ValueError(f"{self.name}: the bf16 recipe needs a Bf16Intrin, not {type(intrin).__name__}")
        for tile in self.bf16.tiles:
            if tile.mr * tile.nr + tile.nr + 1 > intrin.registers:
                raise ValueError(f"{self.name}: bf16 tile {tile.mr}x{tile.nr} ({tile.mr * tile.nr} accumulators + "
                                 f"{tile.nr} weights + 1 broadcast) does not fit {intrin.registers} registers")

    @property
    def code_features(self) -> tuple[str, ...]:
        """Every CPU feature this spec's kernels may use: the row's own and its optional recipes'
        (what a host must have to run the spec's code natively)."""
        recipes = [getattr(self, name) for name in self.optional]
        extra = [f for recipe in recipes if recipe is not None for f in _features(recipe)]
        return tuple(dict.fromkeys((*self.features, *extra)))

    def for_cpu(self, features) -> TargetSpec:
        """This spec without the optional recipes whose features a CPU with ``features`` lacks (a
        Cascade Lake gets the VNNI row without its bf16 recipe)."""
        have = set(features)
        drop = {name: None for name in self.optional
                if getattr(self, name) is not None and not set(_features(getattr(self, name))) <= have}
        return dataclasses.replace(self, **drop) if drop else self

    def _check_fma(self):
        intrin = self.fma.intrin
        missing = set(intrin.features) - set(self.features)
        if missing:
            raise ValueError(f"{self.name}: float32 FMA {intrin.name} needs {sorted(missing)}")
        for tile in self.fma.tiles:
            if tile.mr * tile.nr + tile.nr + 1 > intrin.registers:
                raise ValueError(f"{self.name}: FMA tile {tile.mr}x{tile.nr} ({tile.mr * tile.nr} accumulators + "
                                 f"{tile.nr} weights + 1 broadcast) does not fit {intrin.registers} registers")

    def _check_nibble(self):
        intrin = self.nibble.intrin
        missing = set(intrin.features) - set(self.features)
        if missing:
            raise ValueError(f"{self.name}: 4-bit intrinsic {intrin.name} needs {sorted(missing)}")

    @property
    def lookup_intrin(self) -> LookupIntrin | None:
        """The byte lookup this spec's kernels use: the optional wide one where kept, else the row's."""
        return self.wide_lookup or self.lookup

    def _check_lookup(self):
        for row in (self.lookup, self.register_permute):
            if row is not None and not set(row.features) <= set(self.features):
                raise ValueError(f"{self.name}: {row.name} needs {sorted(set(row.features) - set(self.features))}")

    def recipes(self) -> tuple[GemmRecipe, ...]:
        """In the order they are tried; the last one accepts every weight."""
        return (*self.bounded, GemmRecipe(self.gemm, self.tiles))

    def fast_weight_bits(self) -> int | None:
        """Bits of symmetric int8 weights (|w| <= 2**(bits-1) - 1) that every bounded recipe of the row
        accepts whatever their values, or None for a row without bounded recipes (its exact recipe is
        the fast one)."""
        bounds = [r.intrin.weight_pair_bound for r in self.bounded]
        if not bounds:
            return None
        bits = 8
        while bits > 2 and 2 * (2 ** (bits - 1) - 1) > min(bounds):  # a pair of weights of one sign
            bits -= 1
        return bits

    def recipe_for(self, b_signed=None, n: int | None = None) -> GemmRecipe:
        """The recipe for weights ``b_signed`` (None: known only at run time) and ``n`` output columns
        (None: any): the narrow one where ``n`` fits its lanes, else the first that accepts them."""
        if self.narrow is not None and n is not None and n <= self.narrow.intrin.lanes:
            return self.narrow
        return next(r for r in self.recipes() if r.intrin.accepts(b_signed))

    def tile_for(self, m: int) -> Tile:
        return GemmRecipe(self.gemm, self.tiles).tile_for(m)

    def tvm_target(self, num_cores: int | None = None):
        import tvm

        cfg = dict(self.llvm)
        if num_cores:
            cfg["num-cores"] = num_cores
        return tvm.target.Target(cfg)


def _features(recipe) -> tuple[str, ...]:
    """The CPU features an optional recipe (a GemmRecipe, or an intrinsic row itself) needs."""
    return getattr(recipe, "intrin", recipe).features


@dataclass(frozen=True)
class CudaTargetSpec:
    """An NVIDIA GPU row: the SM architecture, the ``mma.sync`` forms its integer (and FP8) kernels
    use, and the block/warp tile table (:class:`tvm_lowprec.cuda.mma.GemmTiles`, chosen by M).

    ``mma`` maps an activation dtype to the name of its form in :data:`tvm_lowprec.cuda.mma.MMA_FORMS`
    (u8 activations use the native ``u8.s8`` form: no sign shift). Each form is checked against
    ``arch`` here, so a row cannot name an instruction its architecture lacks.
    """

    name: str
    arch: str  # "sm_80"
    mma: Mapping[str, str]  # activation dtype -> integer mma form name
    tiles: tuple  # of cuda.mma.GemmTiles, sorted by min_m, the first with min_m == 1
    fp8_mma: tuple[str, ...] = ()  # the FP8 forms the architecture has (e4m3, e5m2): cuda.fp8's GEMM
    int4_mma: tuple[str, ...] = ()  # the 4-bit forms (s4, u4 x s4): cuda.int4's GEMM
    description: str = ""
    aliases: tuple[str, ...] = field(default=())
    base: str = ""

    device = "cuda"  # class constant: schedule rules and pipeline phases are chosen by device
    features: tuple[str, ...] = ()  # no host CPU features: the host only launches
    bounded: tuple = ()
    qemu_cpu = ""
    int16 = None  # no int16 x int8 GEMM: 16-bit activations stay float
    fma = None  # no float32 FMA recipe: float layers go to the GPU pipeline's dlight rules
    bf16 = None  # no bf16 GEMM: float8 and bfloat16 layers take their float32 path
    float32_requant = False  # the FMA trick is LLVM-only; GPUs requantize through float64
    round_to_int = None  # CUDA C has no LLVM intrinsics: a quantize rounds, then converts

    def __post_init__(self):
        from .cuda.mma import require_mma

        for form in (*self.mma.values(), *self.fp8_mma, *self.int4_mma):
            require_mma(form, self.arch)
        if not self.tiles or self.tiles[0].min_m != 1:
            raise ValueError(f"{self.name}: the tile table must start with a row for min_m=1")
        mins = [t.min_m for t in self.tiles]
        if mins != sorted(mins):
            raise ValueError(f"{self.name}: tile rows must be sorted by min_m")

    @property
    def backend(self):
        """What its device brings (:class:`tvm_lowprec.backends.Backend`): rules, lowering, build, executor."""
        from .backends import backend_for

        return backend_for(self)

    @property
    def row(self) -> str:
        return self.base or self.name

    @property
    def instruction(self) -> str:
        return "mma.sync " + ", ".join(self.mma_forms())

    def mma_forms(self) -> tuple[str, ...]:
        """Every form this row's kernels may emit (integer ones first)."""
        return tuple(dict.fromkeys((*self.mma.values(), *self.int4_mma, *self.fp8_mma)))

    def tile_for(self, m: int, n: int | None = None):
        """The last row whose ``min_m`` is at most ``m`` and whose block is no wider than N needs
        (a 128-wide block on N = 32 would compute four times the outputs)."""
        chosen = self.tiles[0]
        for row in self.tiles:
            if row.min_m <= m and (n is None or row.block_n <= max(n, self.tiles[0].block_n)):
                chosen = row
        return chosen

    def recipes(self) -> tuple:
        return ()

    def fast_weight_bits(self) -> None:
        """Every int8 weight is exact on mma: no narrower default for quantization (None)."""

    def tvm_target(self, num_cores: int | None = None):  # num_cores: the CPU rows' signature, unused
        import tvm

        return tvm.target.Target({"kind": "cuda", "arch": self.arch}, host={"kind": "llvm"})
