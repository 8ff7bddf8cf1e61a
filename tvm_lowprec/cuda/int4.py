"""An INT4 tensor-core GEMM, CUDA C generated here: ``C[M, N] (int32) = A[M, K] x B[N, K]^T``.

A is int4 or uint4, B is int4, both **packed two per byte along K** (low nibble = even k):
A is ``uint8[M, K/2]``, B is ``uint8[N, K/2]`` (:func:`pack_int4`, :func:`unpack_int4`). The product
goes through ``mma.sync.aligned.m16n8k64.row.col.s32.{s4,u4}.s4.s32`` (PTX: sm_80 and newer).
sm_80, sm_86 and sm_89 run it natively (SASS ``IMMA.16864.S4.S4``/``.U4.S4``); Hopper (sm_90) has no
4-bit tensor cores, and ptxas emulates each one with 8-bit ``IMMA.16832`` in a called subroutine
(CUDA 13.0, read with cuobjdump): correct there, not fast. TVM's TIR has no usable 4-bit buffers, so
the kernel is a CUDA C template filled in from Python:

1. block tile ``block_m x block_n`` per thread block (``blockIdx.x``), warp tiles of
   ``warp_m x warp_n`` (``threadIdx.y``), K in steps of ``block_k``;
2. global -> shared with 16-byte ``cp.async`` copies spread over all threads, ``stages`` buffers in
   flight; shared rows padded by 16 bytes (row stride = 16 mod 32 bytes), so that the 8 rows one
   ``ldmatrix`` phase reads fall in 8 distinct 16-byte bank groups;
3. shared -> registers with ``ldmatrix.x4``: it moves 8x8 matrices of 16-bit units, i.e. 4 bytes =
   8 nibbles per lane and row. A 16x64 4-bit A tile is 16 rows of 32 bytes, the same bytes as a
   16x32 8-bit tile, and the m16n8k64 4-bit fragment layout is the m16n8k32 8-bit one at twice K
   (register r of lane l holds row ``l/4 (+8)``, bytes ``4*(l%4)..+3`` of the left or right
   16 bytes), so the same ldmatrix addressing serves;
4. ``mma.sync.aligned.m16n8k64`` per 16x8 output tile, int32 accumulators in registers;
5. registers -> global C, two ``int2`` stores per tile and lane.

Every index the kernel computes is one C expression in :data:`INDEX_EXPR`; the generator pastes it
into the source and :func:`emulate_int4_gemm`, a numpy model of the kernel (ldmatrix and mma as the
PTX ISA defines them, per lane), evaluates the same text, so the model checks the code that runs.
Shapes must be multiples of the tile (:class:`ValueError` naming the dimension otherwise).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

import numpy as np

from .mma import MmaForm, find_mma, require_mma

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 64  # one m16n8k64 instruction
CHUNK = 16  # bytes per cp.async and per ldmatrix row
ROW_PAD = 16  # bytes added to each shared row: stride = 16 mod 32
MAX_STATIC_SHARED = 48 * 1024
INT4_A_DTYPES = ("int4", "uint4")


# --- packing ----------------------------------------------------------------------------------


def pack_int4(values, dtype: str = "int4") -> np.ndarray:
    """``values[..., K]`` (int4: -8..7, uint4: 0..15; K even) -> ``uint8[..., K/2]``, two per byte:
    element ``2j`` in the low nibble of byte ``j``, ``2j + 1`` in the high one."""
    if dtype not in INT4_A_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not a 4-bit type; choose one of {list(INT4_A_DTYPES)}")
    v = np.asarray(values)
    if not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"pack_int4 needs integers, got {v.dtype}")
    if v.ndim < 1 or v.shape[-1] % 2:
        raise ValueError(f"the last dimension (K) must be even to pack two per byte, got shape {v.shape}")
    lo, hi = (-8, 7) if dtype == "int4" else (0, 15)
    if v.size and (v.min() < lo or v.max() > hi):
        raise ValueError(f"{dtype} values must lie in [{lo}, {hi}], got [{v.min()}, {v.max()}]")
    nib = (v.astype(np.int64) & 0xF).astype(np.uint8)
    return np.ascontiguousarray(nib[..., 0::2] | (nib[..., 1::2] << 4))


def unpack_int4(packed, dtype: str = "int4") -> np.ndarray:
    """``uint8[..., K/2]`` -> ``[..., K]`` values (int8 for int4, sign-extended; uint8 for uint4)."""
    if dtype not in INT4_A_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not a 4-bit type; choose one of {list(INT4_A_DTYPES)}")
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise ValueError(f"packed int4 data must be uint8, got {p.dtype}")
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    if dtype == "uint4":
        return out
    return np.where(out >= 8, out.astype(np.int16) - 16, out).astype(np.int8)  # sign-extend the nibble


# --- tiles ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int4Tiles:
    """Block tile (``block_m x block_n``, K step ``block_k`` in elements) of warp tiles
    (``warp_m x warp_n``), with ``stages`` shared buffers in flight; ``why`` says why the row exists."""

    block_m: int
    block_n: int
    block_k: int
    warp_m: int
    warp_n: int
    stages: int = 2
    why: str = field(default="", compare=False)

    def __post_init__(self):
        if self.warp_m % MMA_M or self.warp_n % (2 * MMA_N) or self.block_k % MMA_K:
            # warp_n in pairs of n8 tiles: one ldmatrix.x4 loads B for two mma
            raise ValueError(f"{self}: warp tile must be a multiple of 16x16 and block_k of 64")
        if self.block_m % self.warp_m or self.block_n % self.warp_n:
            raise ValueError(f"{self}: block tile must be a multiple of the warp tile")
        if self.stages < 2:
            raise ValueError(f"{self}: need at least 2 stages")
        chunks_per_row = self.block_k // 2 // CHUNK
        for name, rows in (("A", self.block_m), ("B", self.block_n)):
            if (rows * chunks_per_row) % self.threads:
                raise ValueError(f"{self}: the {name} tile's 16-byte chunks do not split evenly over "
                                 f"{self.threads} threads")
        if self.shared_bytes > MAX_STATIC_SHARED:
            raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory exceed the static 48 KiB")

    @property
    def warps(self) -> int:
        return (self.block_m // self.warp_m) * (self.block_n // self.warp_n)

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def row_stride(self) -> int:
        """Bytes from one shared row to the next: the tile's K bytes plus the pad."""
        return self.block_k // 2 + ROW_PAD

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.block_m + self.block_n) * self.row_stride

    def check_shape(self, m: int, n: int, k: int) -> None:
        for name, dim, tile in (("M", m, self.block_m), ("N", n, self.block_n), ("K", k, self.block_k)):
            if dim <= 0 or dim % tile:
                raise ValueError(f"{name}={dim} is not a positive multiple of {tile} (tiles {self}); pad it")


INT4_TILE_TABLE: tuple[Int4Tiles, ...] = (
    Int4Tiles(128, 128, 128, 64, 64, 2, why=(
        "large shapes: 4 warps of 64x64 (4x8 mma tiles, 128 int32 accumulators per thread), "
        "64 bytes of K per row and step = 2 mma k-steps; 2 stages x 2 x 128 rows x 80 B = 40 KiB")),
    Int4Tiles(64, 64, 128, 32, 32, 3, why=(
        "M or N a multiple of 64 only: 4 warps of 32x32, 3 stages (30 KiB) to hide latency with "
        "less work per block")),
    Int4Tiles(16, 16, 64, 16, 16, 2, why=(
        "anything padded to 16x16x64: one warp, one 16x16 tile (two mma), one k-step per stage")),
)


def pick_int4_tiles(m: int, n: int, k: int) -> Int4Tiles:
    """The first (largest) row of :data:`INT4_TILE_TABLE` that divides the shape."""
    _check_int4_shape(m, n, k)
    for tiles in INT4_TILE_TABLE:
        if m % tiles.block_m == 0 and n % tiles.block_n == 0 and k % tiles.block_k == 0:
            return tiles
    raise ValueError(f"M={m}, N={n}, K={k}: no tile row divides the shape; pad it")


def _check_int4_shape(m: int, n: int, k: int) -> None:
    for name, dim, step in (("M", m, MMA_M), ("N", n, 2 * MMA_N), ("K", k, MMA_K)):
        if not isinstance(dim, (int, np.integer)) or dim <= 0 or dim % step:
            raise ValueError(f"{name}={dim} is not a positive multiple of {step} "
                             f"(INT4 mma tiles are 16x16x64); pad it")


# --- the kernel -------------------------------------------------------------------------------

# Every index of the kernel, as C over non-negative ints (the model evaluates the same text, with
# C's integer "/" as Python's "//"). Names: constants of _constants(), the loop variables below.
INDEX_EXPR = {
    "tid": "warp * 32 + lane",
    "block_row": "(bid / GRID_N) * BM",
    "block_col": "(bid % GRID_N) * BN",
    "warp_row": "(warp / WARPS_N) * WM",
    "warp_col": "(warp % WARPS_N) * WN",
    # chunk c (c = tid + i * THREADS) of a tile: its row and byte column
    "chunk_row": "c / CPR",
    "chunk_col": "(c % CPR) * 16",
    # ldmatrix.x4 row address of this lane: A tile i (16 rows x 32 bytes), k-step ks. Lanes 0-15
    # give rows 0-15 of the left 16 bytes (matrices 0, 1: a0, a1), lanes 16-31 of the right 16
    # (matrices 2, 3: a2, a3)
    "a_ld_row": "warp_row + i * 16 + (lane & 15)",
    "a_ld_col": "ks * 32 + (lane >> 4) * 16",
    # B tiles 2*jp and 2*jp+1 (8 rows of n each): matrices 0, 1 = tile 2*jp (left, right 16 bytes:
    # b0, b1), matrices 2, 3 = tile 2*jp+1; lane L gives row L % 8 of matrix L / 8
    "b_ld_row": "warp_col + jp * 16 + ((lane >> 4) << 3) + (lane & 7)",
    "b_ld_col": "ks * 32 + ((lane >> 3) & 1) * 16",
    # accumulator c0, c1 of tile (i, j): row lane/4, columns 2*(lane%4) + {0, 1}; c2, c3: 8 rows below
    "c_row": "block_row + warp_row + i * 16 + (lane >> 2)",
    "c_col": "block_col + warp_col + j * 8 + (lane & 3) * 2",
}
# ldmatrix.x4 register q of the B load -> (n8 tile 2*jp + dt, fragment register)
B_LOAD_REGS = ((0, 0), (0, 1), (1, 0), (1, 1))
# accumulator register r -> (row offset, column offset) from (c_row, c_col)
ACC_OFFSETS = ((0, 0), (0, 1), (8, 0), (8, 1))

_TEMPLATE = string.Template(r"""// generated by tvm_lowprec.cuda.int4: C[$M, $N] int32 = A[$M, $K] x B[$N, $K]^T,
// A $a_dtype, B int4, both packed two per byte along K (low nibble = even k); tiles $tiles
namespace $ns {
$constants
static_assert(M % BM == 0 && N % BN == 0 && K % BK == 0 && BK % 64 == 0, "the tiles divide the shape");
static __device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_u32(smem)), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int Pending>
static __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(Pending) : "memory");
}
static __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(smem)) : "memory");
}
// not volatile: no side effects, the accumulator operands order the mma
static __device__ __forceinline__ void mma_k64(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm("$mma_ptx "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// global -> shared, tile kt of K: 16-byte chunks, A_CHUNKS (B_CHUNKS) per thread
static __device__ __forceinline__ void load_tile(unsigned char* as, unsigned char* bs, const unsigned char* A,
                                                 const unsigned char* B, int block_row, int block_col, int kt,
                                                 int tid) {
#pragma unroll
  for (int i = 0; i < A_CHUNKS; ++i) {
    const int c = tid + i * THREADS;
    const int row = $chunk_row;
    const int col = $chunk_col;
    cp_async16(as + row * LDS + col, A + (long long)(block_row + row) * KB + (long long)kt * BKB + col);
  }
#pragma unroll
  for (int i = 0; i < B_CHUNKS; ++i) {
    const int c = tid + i * THREADS;
    const int row = $chunk_row;
    const int col = $chunk_col;
    cp_async16(bs + row * LDS + col, B + (long long)(block_col + row) * KB + (long long)kt * BKB + col);
  }
}
}  // namespace $ns

extern "C" __global__ void __launch_bounds__($threads) $name(const unsigned char* __restrict__ A,
    const unsigned char* __restrict__ B, int* __restrict__ C) {
  using namespace $ns;
  __shared__ __align__(128) unsigned char As[STAGES][BM * LDS];
  __shared__ __align__(128) unsigned char Bs[STAGES][BN * LDS];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int bid = blockIdx.x;
  const int tid = $tid;
  const int block_row = $block_row;
  const int block_col = $block_col;
  const int warp_row = $warp_row;
  const int warp_col = $warp_col;

  int acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;

  // prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty past the end of K)
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_tile(As[s], Bs[s], A, B, block_row, block_col, s, tid);
    cp_async_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {
    // groups 0..kt complete (this thread's copies); the barrier makes every thread's visible and
    // tells that all warps are done with tile kt-1, whose buffer the next load reuses
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int next = kt + STAGES - 1;
      if (next < KT) load_tile(As[next % STAGES], Bs[next % STAGES], A, B, block_row, block_col, next, tid);
      cp_async_commit();
    }
    const unsigned char* as = As[kt % STAGES];
    const unsigned char* bs = Bs[kt % STAGES];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      unsigned a_frag[MT][4];
      unsigned b_frag[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) ldmatrix_x4(a_frag[i], as + ($a_ld_row) * LDS + $a_ld_col);
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        unsigned r[4];
        ldmatrix_x4(r, bs + ($b_ld_row) * LDS + $b_ld_col);
$b_assign
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_k64(acc[i][j], a_frag[i], b_frag[j]);
    }
  }

  // registers -> global C
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int row = $c_row;
      const int col = $c_col;
$c_store
    }
}
""")


def _constants(m: int, n: int, k: int, tiles: Int4Tiles) -> dict[str, int]:
    t = tiles
    cpr = t.block_k // 2 // CHUNK
    return {
        "M": m, "N": n, "K": k, "KB": k // 2,
        "BM": t.block_m, "BN": t.block_n, "BK": t.block_k, "BKB": t.block_k // 2, "LDS": t.row_stride,
        "WM": t.warp_m, "WN": t.warp_n, "WARPS_N": t.block_n // t.warp_n,
        "MT": t.warp_m // MMA_M, "NT": t.warp_n // MMA_N,
        "GRID_N": n // t.block_n, "KT": k // t.block_k, "KSTEPS": t.block_k // MMA_K, "STAGES": t.stages,
        "THREADS": t.threads, "CPR": cpr,
        "A_CHUNKS": t.block_m * cpr // t.threads, "B_CHUNKS": t.block_n * cpr // t.threads,
    }


def _b_assign() -> str:
    return "\n".join(f"        b_frag[2 * jp + {dt}][{reg}] = r[{q}];" for q, (dt, reg) in enumerate(B_LOAD_REGS))


def _c_store() -> str:
    lines = []
    for r0 in range(0, 4, 2):  # registers r0, r0+1: one row, two adjacent columns -> one int2
        (dr, dc), (dr1, dc1) = ACC_OFFSETS[r0], ACC_OFFSETS[r0 + 1]
        assert dr == dr1 and (dc, dc1) == (0, 1)
        lines.append(f"      *reinterpret_cast<int2*>(C + (long long)(row + {dr}) * N + col) = "
                     f"make_int2(acc[i][j][{r0}], acc[i][j][{r0 + 1}]);")
    return "\n".join(lines)


def kernel_name(a_dtype: str) -> str:
    return f"lowprec_{'u4' if a_dtype == 'uint4' else 's4'}s4_gemm"


def int4_gemm_source(m: int, n: int, k: int, a_dtype: str = "int4", tiles: Int4Tiles | None = None) -> str:
    """The CUDA C of the kernel (one ``extern "C" __global__`` function, no includes)."""
    form = find_mma(a_dtype, "int4", "int32")
    tiles = tiles or pick_int4_tiles(m, n, k)
    _check_int4_shape(m, n, k)
    tiles.check_shape(m, n, k)
    consts = _constants(m, n, k, tiles)
    return _TEMPLATE.substitute(
        M=m, N=n, K=k, a_dtype=a_dtype, tiles=f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k} "
        f"warp {tiles.warp_m}x{tiles.warp_n} stages {tiles.stages}",
        ns=f"{kernel_name(a_dtype)}_{m}x{n}x{k}",
        constants="\n".join(f"constexpr int {name} = {value};" for name, value in consts.items()),
        mma_ptx=form.ptx, threads=tiles.threads, name=kernel_name(a_dtype),
        b_assign=_b_assign(), c_store=_c_store(), **INDEX_EXPR,
    )


def build_int4_gemm(
    m: int, n: int, k: int, a_dtype: str = "int4", arch: str = "sm_80", tiles: Int4Tiles | None = None,
    compile: bool | str = True,
):
    """Generate and nvcc-compile the INT4 GEMM: a :class:`~.gemm.CudaGemm` (``compile`` as for
    :func:`~.gemm.build_gemm`: True, ``"ptx"``, ``"cubin"`` or False) that
    :class:`~.run.GemmKernel` launches with packed ``uint8`` A ``[M, K/2]`` and B ``[N, K/2]``.

    Examples
    --------
    >>> g = build_int4_gemm(128, 128, 128, "uint4", "sm_80")  # doctest: +SKIP
    >>> g.mma.ptx in g.ptx  # doctest: +SKIP
    True
    """
    from . import nvcc
    from .gemm import CudaGemm, KernelParam  # the dataclasses only (imports TVM)

    if a_dtype not in INT4_A_DTYPES:
        raise ValueError(f"A dtype {a_dtype!r} is not supported; choose one of {list(INT4_A_DTYPES)}")
    form: MmaForm = require_mma(find_mma(a_dtype, "int4", "int32"), arch)
    _check_int4_shape(m, n, k)
    tiles = tiles or pick_int4_tiles(m, n, k)
    tiles.check_shape(m, n, k)
    source = int4_gemm_source(m, n, k, a_dtype, tiles)
    params = (KernelParam("A", "const unsigned char*", "A"), KernelParam("B", "const unsigned char*", "B"),
              KernelParam("C", "int*", "C"))
    gemm = CudaGemm(
        m, n, k, a_dtype, "int4", arch, tiles, form, source, kernel_name(a_dtype), params,
        grid=((m // tiles.block_m) * (n // tiles.block_n), 1, 1), block=(WARP, tiles.warps, 1),
        extra={"packed_k": True, "shared_bytes": tiles.shared_bytes},
    )
    if compile in (True, "ptx"):
        gemm.ptx = nvcc.compile_ptx(source, arch)
    if compile in (True, "cubin"):
        gemm.cubin = nvcc.compile_cubin(source, arch)
    return gemm


# --- a numpy model of the kernel, lane by lane ----------------------------------------------


def _eval(name: str, env: dict):
    """Evaluate INDEX_EXPR[name] on ints or numpy int arrays (C's "/" on non-negatives is "//")."""
    return eval(INDEX_EXPR[name].replace("/", "//"), {"__builtins__": {}}, env)  # our own text, no input


def _nibbles(words: np.ndarray, signed: bool) -> np.ndarray:
    """uint32 words [...] -> their 8 nibbles [..., 8], element 0 in bits 0-3 (PTX: low to high)."""
    nib = (words[..., None].astype(np.int64) >> (4 * np.arange(8))) & 0xF
    return np.where(nib >= 8, nib - 16, nib) if signed else nib


def ldmatrix_x4_model(smem: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` as the PTX ISA defines it: lane ``8q + r`` gives
    the address of row r of matrix q (16 bytes); register q of lane l receives the 16-bit elements
    ``2*(l%4)``, ``2*(l%4)+1`` (bytes ``4*(l%4)..+3``) of row ``l/4`` of matrix q. Returns
    uint32 ``[4, 32]``. Checks 16-byte alignment and that each 8-row phase is free of bank conflicts."""
    addr = np.asarray(addr, dtype=np.int64)
    assert addr.shape == (WARP,) and not np.any(addr % 16), addr
    regs = np.zeros((4, WARP), dtype=np.uint32)
    lane = np.arange(WARP)
    for q in range(4):
        rows = addr[8 * q: 8 * q + 8]
        assert len(set((rows // 16 % 8).tolist())) == 8, f"bank conflict in ldmatrix matrix {q}: {rows}"
        base = rows[lane >> 2] + 4 * (lane & 3)
        b = smem[base[:, None] + np.arange(4)].astype(np.uint32)
        regs[q] = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
    return regs


def _mma_maps():
    """(lane, register, nibble) -> (row, col) of A (16x64) and B (64x8 as [k, n]); (lane, register)
    -> (row, col) of C (16x8): the PTX ISA's "Matrix Fragments for mma.m16n8k64" (.s4/.u4)."""
    lane = np.arange(WARP)[:, None]
    group, tig = lane >> 2, lane % 4
    i = np.arange(32)[None, :]  # a_i, i = 8 * register + nibble
    a_row = np.where((i < 8) | ((i >= 16) & (i < 24)), group, group + 8)
    a_col = tig * 8 + (i & 7) + np.where(i >= 16, 32, 0)
    i = np.arange(16)[None, :]
    b_row = tig * 8 + (i & 7) + np.where(i >= 8, 32, 0)
    b_col = np.broadcast_to(group, b_row.shape)
    i = np.arange(4)[None, :]
    c_row = group + np.where(i >= 2, 8, 0)
    c_col = tig * 2 + (i & 1)
    for rows, cols, shape in ((a_row, a_col, (16, 64)), (b_row, b_col, (64, 8)), (c_row, c_col, (16, 8))):
        hit = np.zeros(shape, dtype=int)
        np.add.at(hit, (rows, cols), 1)
        assert np.all(hit == 1), "a fragment map does not cover its matrix exactly once"
    return (a_row, a_col), (b_row, b_col), (c_row, c_col)


_MMA_MAPS = None


def mma_m16n8k64_model(d: np.ndarray, a: np.ndarray, b: np.ndarray, a_signed: bool) -> np.ndarray:
    """``mma.sync.aligned.m16n8k64.row.col.s32.{s4|u4}.s4.s32`` on per-lane registers: ``d`` int64
    ``[4, 32]`` (accumulators), ``a`` uint32 ``[4, 32]``, ``b`` uint32 ``[2, 32]``; returns the new ``d``."""
    global _MMA_MAPS
    if _MMA_MAPS is None:
        _MMA_MAPS = _mma_maps()
    (a_row, a_col), (b_row, b_col), (c_row, c_col) = _MMA_MAPS
    am = np.zeros((16, 64), dtype=np.int64)
    am[a_row, a_col] = _nibbles(a.T, a_signed).reshape(WARP, 32)  # lane, (register, nibble)
    bm = np.zeros((64, 8), dtype=np.int64)
    bm[b_row, b_col] = _nibbles(b.T, True).reshape(WARP, 16)
    cm = np.zeros((16, 8), dtype=np.int64)
    cm[c_row, c_col] = d.T
    out = cm + am @ bm
    return out[c_row, c_col].T.copy()


def emulate_int4_gemm(gemm, a_packed: np.ndarray, b_packed: np.ndarray) -> np.ndarray:
    """Run ``gemm`` (from :func:`build_int4_gemm`) in numpy, thread by thread as the CUDA source does:
    the same index expressions, the same stage order, ldmatrix and mma per the PTX ISA. Shared memory
    starts as garbage and C as a poison value; every C element must be written exactly once.
    Returns C as int64 (the kernel's int32 accumulators wrap; the model's do not)."""
    m, n, k, tiles = gemm.m, gemm.n, gemm.k, gemm.tiles
    consts = _constants(m, n, k, tiles)
    a_flat = np.ascontiguousarray(a_packed, dtype=np.uint8).reshape(-1)
    b_flat = np.ascontiguousarray(b_packed, dtype=np.uint8).reshape(-1)
    assert a_flat.size == m * k // 2 and b_flat.size == n * k // 2
    signed_a = gemm.a_dtype == "int4"
    rng = np.random.default_rng(0)
    c_out = np.zeros((m, n), dtype=np.int64)
    writes = np.zeros((m, n), dtype=np.int64)
    lane = np.arange(WARP)
    s, lds = tiles.stages, consts["LDS"]
    for bid in range(gemm.grid[0]):
        env = dict(consts, bid=bid)
        block_row, block_col = _eval("block_row", env), _eval("block_col", env)
        a_sh = rng.integers(0, 256, size=(s, tiles.block_m * lds), dtype=np.uint8)
        b_sh = rng.integers(0, 256, size=(s, tiles.block_n * lds), dtype=np.uint8)
        acc = np.zeros((tiles.warps, consts["MT"], consts["NT"], 4, WARP), dtype=np.int64)

        def load_tile(stage, kt, a_sh=a_sh, b_sh=b_sh, block_row=block_row, block_col=block_col):
            # every thread of the block, as in load_tile(): tid = warp * 32 + lane
            for warp in range(tiles.warps):
                tid = _eval("tid", dict(consts, warp=warp, lane=lane))
                for flat, sh, rows_base, chunks in ((a_flat, a_sh, block_row, "A_CHUNKS"),
                                                    (b_flat, b_sh, block_col, "B_CHUNKS")):
                    for i in range(consts[chunks]):
                        c = tid + i * consts["THREADS"]
                        row, col = _eval("chunk_row", dict(consts, c=c)), _eval("chunk_col", dict(consts, c=c))
                        src = (rows_base + row) * consts["KB"] + kt * consts["BKB"] + col
                        dst = row * lds + col
                        sh[stage][dst[:, None] + np.arange(CHUNK)] = flat[src[:, None] + np.arange(CHUNK)]

        for st in range(s - 1):
            if st < consts["KT"]:
                load_tile(st, st)
        for kt in range(consts["KT"]):
            nxt = kt + s - 1
            if nxt < consts["KT"]:
                load_tile(nxt % s, nxt)  # issued before the compute, as in the kernel
            a_st, b_st = a_sh[kt % s], b_sh[kt % s]
            for warp in range(tiles.warps):
                wenv = dict(consts, warp=warp, lane=lane)
                wenv.update(warp_row=_eval("warp_row", wenv), warp_col=_eval("warp_col", wenv))
                for ks in range(consts["KSTEPS"]):
                    a_frag = [ldmatrix_x4_model(a_st, _eval("a_ld_row", dict(wenv, i=i, ks=ks)) * lds
                                                + _eval("a_ld_col", dict(wenv, i=i, ks=ks)))
                              for i in range(consts["MT"])]
                    b_frag = np.zeros((consts["NT"], 2, WARP), dtype=np.uint32)
                    for jp in range(consts["NT"] // 2):
                        env_b = dict(wenv, jp=jp, ks=ks)
                        r = ldmatrix_x4_model(b_st, _eval("b_ld_row", env_b) * lds + _eval("b_ld_col", env_b))
                        for q, (dt, reg) in enumerate(B_LOAD_REGS):
                            b_frag[2 * jp + dt, reg] = r[q]
                    for i in range(consts["MT"]):
                        for j in range(consts["NT"]):
                            acc[warp, i, j] = mma_m16n8k64_model(acc[warp, i, j], a_frag[i], b_frag[j], signed_a)
        for warp in range(tiles.warps):
            wenv = dict(consts, warp=warp, lane=lane, block_row=block_row, block_col=block_col)
            wenv.update(warp_row=_eval("warp_row", wenv), warp_col=_eval("warp_col", wenv))
            for i in range(consts["MT"]):
                for j in range(consts["NT"]):
                    row, col = _eval("c_row", dict(wenv, i=i, j=j)), _eval("c_col", dict(wenv, i=i, j=j))
                    for reg, (dr, dc) in enumerate(ACC_OFFSETS):
                        c_out[row + dr, col + dc] = acc[warp, i, j, reg]
                        np.add.at(writes, (row + dr, col + dc), 1)
    assert np.all(writes == 1), f"C elements written {writes.min()}..{writes.max()} times, not once each"
    return c_out
