"""An INT8 tensor-core GEMM scheduled with TVM: ``C[M, N] (int32) = A[M, K] x B[N, K]^T``.

A is int8 or uint8, B is int8 (the "NT" layout of a linear layer: weights stored ``[out, in]``).
The schedule follows TVM's reference mma schedule (``tvm/testing/tir.py::mma_schedule``):

1. tile C into block tiles (``blockIdx.x``) of warp tiles (``threadIdx.y``), each warp tile a grid
   of 16x16 mma tiles, K in steps of ``block_k``;
2. stage A and B tiles global -> shared (16-byte vector loads by all warps, rows padded so that
   ldmatrix is free of bank conflicts);
3. shared -> registers with ``ldmatrix``, into the mma fragment layout;
4. ``mma.sync.aligned.m16n8k32`` (two per 16x16x32 tile), int32 accumulators in registers;
5. registers -> global C.

Shapes are **required** to be multiples of the chosen tile (no padding here): a :class:`ValueError`
names the dimension otherwise. :func:`pick_tiles` picks the largest table row that divides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm
from tvm import te
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .._tvmscript import cheap_frame_inspection

with cheap_frame_inspection():  # TVM's intrinsic modules parse hundreds of prim_funcs at import
    from tvm.s_tir.tensor_intrin import cuda as tvm_cuda_intrin

from . import nvcc
from .mma import (
    MMA_K,
    MMA_M,
    MMA_N,
    VECTOR_BYTES,
    WARP,
    GemmTiles,
    MmaForm,
    find_mma,
    require_mma,
)

# --- fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32"), as (thread, register slot)


def layout_16x32(i, j):
    """A (row-major 16x32) or B (stored [n, k], 16x32) element -> (lane, byte slot of 16)."""
    return 4 * (i % 8) + (j % 16) // 4, 8 * (j // 16) + (i // 8) * 4 + j % 4


def layout_16x16_acc(i, j):
    """Accumulator element of a 16x16 tile -> (lane, slot of 8)."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + j % 2


# --- our intrinsics for operand dtypes TVM does not register (uint8 A), modelled on TVM's


def _ldmatrix_a_intrin(dtype: str):
    """A 16x32 row-major tile of ``dtype`` from shared memory into the A fragment (ldmatrix.x4)."""
    local = MMA_M * MMA_K // WARP

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (MMA_M, MMA_K), dtype, align=64, offset_factor=MMA_K, scope="shared")
        warp = T.match_buffer(warp_handle, (WARP, local), dtype, align=64, offset_factor=MMA_K, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:MMA_M, 0:MMA_K])
            T.writes(warp[0:WARP, 0:local])
            for ax0, ax1 in T.grid(MMA_M, MMA_K):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, slot = T.meta_var(layout_16x32(v0, v1))
                    T.writes(warp[lane, slot])
                    warp[lane, slot] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(
            shared_handle, (MMA_M, MMA_K), dtype, align=64, offset_factor=MMA_K, scope="shared", strides=[s0, s1]
        )
        warp = T.match_buffer(warp_handle, (WARP, local), dtype, align=64, offset_factor=MMA_K, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:MMA_M, 0:MMA_K])
            T.writes(warp[0:WARP, 0:local])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                # lanes 0-15 give the rows of the left 16 bytes, lanes 16-31 those of the right 16
                T.evaluate(
                    T.ptx_legacy.ldmatrix(
                        False, 4, ".b16", warp.data, warp.elem_offset + local * tx,
                        shared.access_ptr("r"), s0 * (tx % 16) + 16 * (tx // 16), dtype=dtype,
                    )
                )

    return desc, impl


def _mma_nt_intrin(a_dtype: str, b_dtype: str):
    """16x16x32 tile ``C += A x B^T`` (A row-major, B stored [n, k]) as two ``m16n8k32`` mma."""
    local, local_c = MMA_M * MMA_K // WARP, MMA_M * MMA_N // WARP
    abbrev = {"int8": "int8", "uint8": "uint8"}

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, local), a_dtype, align=64, offset_factor=MMA_K, scope="warp")
        B = T.match_buffer(b, (WARP, local), b_dtype, align=64, offset_factor=MMA_K, scope="warp")
        C = T.match_buffer(c, (WARP, local_c), "int32", align=64, offset_factor=MMA_N, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:local_c], A[0:WARP, 0:local], B[0:WARP, 0:local])
            T.writes(C[0:WARP, 0:local_c])
            for i, j, k in T.grid(MMA_M, MMA_N, MMA_K):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, lc = T.meta_var(layout_16x16_acc(vi, vj))
                    ta, la = T.meta_var(layout_16x32(vi, vk))
                    tb, lb = T.meta_var(layout_16x32(vj, vk))
                    T.reads(C[tc, lc], A[ta, la], B[tb, lb])
                    T.writes(C[tc, lc])
                    C[tc, lc] = C[tc, lc] + T.Cast("int32", A[ta, la]) * T.Cast("int32", B[tb, lb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, local), a_dtype, align=64, offset_factor=MMA_K, scope="warp")
        B = T.match_buffer(b, (WARP, local), b_dtype, align=64, offset_factor=MMA_K, scope="warp")
        C = T.match_buffer(c, (WARP, local_c), "int32", align=64, offset_factor=MMA_N, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:local_c], A[0:WARP, 0:local], B[0:WARP, 0:local])
            T.writes(C[0:WARP, 0:local_c])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                # columns 0-7, then 8-15 of the 16x16 tile: B and C fragments split in halves
                T.evaluate(
                    T.ptx_legacy.mma(
                        "m16n8k32", "row", "col", abbrev[a_dtype], abbrev[b_dtype], "int32",
                        A.data, A.elem_offset + tx * local,
                        B.data, B.elem_offset + tx * local,
                        C.data, C.elem_offset + tx * local_c,
                        False, dtype="int32",
                    )
                )
                T.evaluate(
                    T.ptx_legacy.mma(
                        "m16n8k32", "row", "col", abbrev[a_dtype], abbrev[b_dtype], "int32",
                        A.data, A.elem_offset + tx * local,
                        B.data, B.elem_offset + tx * local + local // 2,
                        C.data, C.elem_offset + tx * local_c + local_c // 2,
                        False, dtype="int32",
                    )
                )

    return desc, impl


@dataclass(frozen=True)
class IntrinGroup:
    """Tensor intrinsics by role, for one (A dtype, B dtype) pair; the schedule never names a dtype."""

    a_dtype: str
    b_dtype: str
    load_a: str
    load_b: str
    compute: str
    init: str = tvm_cuda_intrin.MMA_fill_16x16_i32_INTRIN
    store: str = tvm_cuda_intrin.MMA_store_16x16_i32_global_INTRIN
    acc_dtype: str = "int32"
    # the accumulator tile into shared memory, where a fused epilogue reads it (tensorize_gemm)
    store_shared: str = "tvm_lowprec_mma_store_16x16_i32_shared_dyn"

    @property
    def mma(self) -> MmaForm:
        return find_mma(self.a_dtype, self.b_dtype, self.acc_dtype)

    @property
    def mma_k(self) -> int:
        """K of one 16x16 tile step (the instruction's k)."""
        return self.mma.k


LDMATRIX_U8_A_INTRIN = "tvm_lowprec_ldmatrix_u8_a"
MMA_U8S8S32_TRANS_B_INTRIN = "tvm_lowprec_mma_u8s8s32_trans_b"
with cheap_frame_inspection():
    TensorIntrin.register("tvm_lowprec_mma_store_16x16_i32_shared_dyn",
                          *tvm_cuda_intrin.get_mma_store_intrin("int32", 8, "shared.dyn", True), override=True)
    TensorIntrin.register(LDMATRIX_U8_A_INTRIN, *_ldmatrix_a_intrin("uint8"), override=True)
    TensorIntrin.register(MMA_U8S8S32_TRANS_B_INTRIN, *_mma_nt_intrin("uint8", "int8"), override=True)

INTRIN_GROUPS = {
    # s8 x s8: TVM's own intrinsics (B "transposed" = stored [N, K])
    "int8": IntrinGroup(
        "int8", "int8", tvm_cuda_intrin.LDMATRIX_i8_A_INTRIN, tvm_cuda_intrin.LDMATRIX_i8_B_TRANS_INTRIN,
        tvm_cuda_intrin.MMA_i8i8i32_TRANS_B_INTRIN,
    ),
    # u8 x s8: TVM has no uint8 A; ours (B is loaded exactly as for s8)
    "uint8": IntrinGroup(
        "uint8", "int8", LDMATRIX_U8_A_INTRIN, tvm_cuda_intrin.LDMATRIX_i8_B_TRANS_INTRIN,
        MMA_U8S8S32_TRANS_B_INTRIN,
    ),
}


TILE_TABLE: tuple[GemmTiles, ...] = (
    # 4 warps of 64x64: 128 int32 accumulators per thread, 20 KiB of shared memory per stage
    GemmTiles(128, 128, 64, 64, 64),
    # for M or N a multiple of 64 only: 4 warps of 32x32
    GemmTiles(64, 64, 64, 32, 32),
    # smallest: one warp, one 16x16 tile, K step 32
    GemmTiles(16, 16, 32, 16, 16),
)


def pick_tiles(m: int, n: int, k: int) -> GemmTiles:
    """The first (largest) row of :data:`TILE_TABLE` that divides the shape."""
    for tiles in TILE_TABLE:
        if m % tiles.block_m == 0 and n % tiles.block_n == 0 and k % tiles.block_k == 0:
            return tiles
    raise ValueError(f"M={m}, N={n}, K={k}: need M, N multiples of 16 and K a multiple of 32; pad them")


def gemm_workload(m: int, n: int, k: int, a_dtype: str = "int8", b_dtype: str = "int8",
                  acc_dtype: str = "int32") -> tvm.tirx.PrimFunc:
    """``C[i, j] = sum_k acc(A[i, k]) * acc(B[j, k])`` as a PrimFunc named ``gemm``."""
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n, k), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc_dtype) * b[j, r].astype(acc_dtype), axis=r),
                   name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "gemm")


def _fetch_to_shared(sch, block, operand: int, k_outer, tiles: GemmTiles):
    """Step 2: operand tile -> shared, 16-byte vector loads spread over all warps' lanes."""
    cached = sch.cache_read(block, operand, "shared", consumer_blocks=[block])  # not the row sums' copy
    sch.compute_at(cached, k_outer)
    fused = sch.fuse(*sch.get_loops(cached)[-2:])
    _, ty, tx, vec = sch.split(fused, factors=[None, tiles.warps, WARP, VECTOR_BYTES])
    sch.bind(tx, "threadIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.vectorize(vec)
    # row stride = 16 mod 32 bytes: the 8 rows one ldmatrix reads fall in distinct banks
    sch.storage_align(cached, 0, axis=-2, factor=32, offset=16)


def _tile_fragment(sch, block, rows: int, cols: int):
    """Split the last two loops of ``block`` into (rows x cols) fragments; return the inner row loop."""
    i, j = sch.get_loops(block)[-2:]
    i0, i1 = sch.split(i, factors=[None, rows])
    j0, j1 = sch.split(j, factors=[None, cols])
    sch.reorder(i0, j0, i1, j1)
    return i1


def _spread_over_threads(sch, block, tiles: GemmTiles) -> None:
    """The block's spatial loops under the thread block's loop, one point per thread of the block
    (``warps x 32``, round robin); its reduction loops (innermost, as te makes them) stay in the thread."""
    loops = [loop for loop in sch.get_loops(block) if sch.get(loop).thread_binding is None]
    reduces = sum(iv.iter_type != 0 for iv in sch.get(block).iter_vars)
    spatial = loops[: len(loops) - reduces]
    if not spatial:
        spatial = [sch.add_unit_loop(block)]
    _, ty, tx = sch.split(sch.fuse(*spatial), factors=[None, tiles.warps, WARP])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def tensorize_gemm(sch: tvm.s_tir.Schedule, block, tiles: GemmTiles, group: IntrinGroup, epilogue=None) -> None:
    """Schedule one GEMM block ``C[(b,) i, j] += A[(b,) i, k] * B[(b,) j, k]`` of ``sch`` in place.

    The block's loops are ``(i, j, k)`` or, for a batch of GEMMs, ``(b, i, j, k)`` (the batch goes to
    ``blockIdx.y``). Its extents must be multiples of ``tiles`` (:meth:`GemmTiles.check_shape`).
    ``epilogue``: the elementwise block that consumes ``C`` (bias, zero points, requantization), whose
    only producer in the function is this GEMM. It is fused: each thread block stores its
    accumulator tile to shared memory, and after a barrier all its threads run the epilogue on that
    tile and write the final outputs; ``C`` never reaches global memory.
    """
    loops = sch.get_loops(block)
    batch = loops[0] if len(loops) == 4 else None
    i, j, r = loops[-3:]
    m, n, k = (int(sch.get(loop).extent) for loop in (i, j, r))
    tiles.check_shape(m, n, k)

    # Step 1. 16x16xK mma tiles, then block / warp / fragment tiles
    i, i_tc = sch.split(i, factors=[None, MMA_M])
    j, j_tc = sch.split(j, factors=[None, MMA_N])
    r, r_tc = sch.split(r, factors=[None, group.mma_k])
    sch.reorder(i, j, r, i_tc, j_tc, r_tc)
    block_outer = sch.blockize(i_tc)
    i0, i1, i2 = sch.split(i, factors=[m // tiles.block_m, tiles.block_m // tiles.warp_m, tiles.warp_m // MMA_M])
    j0, j1, j2 = sch.split(j, factors=[n // tiles.block_n, tiles.block_n // tiles.warp_n, tiles.warp_n // MMA_N])
    k0, k1 = sch.split(r, factors=[k // tiles.block_k, tiles.block_k // group.mma_k])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    block_loop = sch.fuse(i0, j0)
    sch.bind(block_loop, "blockIdx.x")
    if batch is not None:
        sch.bind(batch, "blockIdx.y")
    warp_loop = sch.fuse(i1, j1)
    sch.bind(warp_loop, "threadIdx.y")

    # Step 2. global -> shared
    _fetch_to_shared(sch, block_outer, 0, k0, tiles)
    _fetch_to_shared(sch, block_outer, 1, k0, tiles)

    # Step 3. shared -> registers (warp fragments), accumulators in registers
    a_warp = sch.cache_read(block_outer, 0, "warp")
    b_warp = sch.cache_read(block_outer, 1, "warp")
    sch.compute_at(a_warp, k1)
    sch.compute_at(b_warp, k1)
    c_warp = sch.cache_write(block_outer, 0, "warp")
    sch.reverse_compute_at(c_warp, warp_loop)
    store_loop = _tile_fragment(sch, c_warp, MMA_M, MMA_N)
    if epilogue is not None:
        sch.set_scope(c_warp, 0, "shared.dyn")  # the block's accumulator tile, compacted to block_m x block_n
        sch.reverse_compute_at(epilogue, block_loop)
        _spread_over_threads(sch, epilogue, tiles)
    init = sch.decompose_reduction(block_outer, k0)
    load_a = _tile_fragment(sch, a_warp, MMA_M, group.mma_k)
    load_b = _tile_fragment(sch, b_warp, MMA_N, group.mma_k)
    kk = group.mma_k
    operand_map = lambda *ij: (*ij[:-2], ij[-2] // MMA_M, ij[-1] // kk, *layout_16x32(ij[-2] % MMA_M, ij[-1] % kk))
    acc_map = lambda *ij: (*ij[:-2], ij[-2] // MMA_M, ij[-1] // MMA_N, *layout_16x16_acc(ij[-2] % MMA_M, ij[-1] % MMA_N))
    sch.transform_layout(a_warp, ("write", 0), operand_map)
    sch.transform_layout(b_warp, ("write", 0), operand_map)
    sch.transform_layout(c_warp, ("read", 0), acc_map)

    # Step 4. tensorize by role
    sch.tensorize(load_a, group.load_a)
    sch.tensorize(load_b, group.load_b)
    sch.tensorize(sch.get_loops(block)[-3], group.compute)
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], group.init)  # the 16x16 fill inside
    sch.tensorize(store_loop, group.store if epilogue is None else group.store_shared)


def schedule_gemm(shape: tuple[int, int, int], tiles: GemmTiles, group: IntrinGroup) -> tvm.s_tir.Schedule:
    """Tensorize :func:`gemm_workload` of ``shape = (M, N, K)`` with ``group``'s intrinsics on ``tiles``."""
    m, n, k = shape
    func = gemm_workload(m, n, k, group.a_dtype, group.b_dtype, group.acc_dtype)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"gemm": func}))
    tensorize_gemm(sch, sch.get_sblock("C", func_name="gemm"), tiles, group)
    return sch


def thread_extents(func: tvm.tirx.PrimFunc) -> dict[str, int]:
    """``{"blockIdx.x": 64, "threadIdx.x": 32, ...}``: the largest extent bound to each thread tag."""
    found: dict[str, int] = {}

    def visit(node):
        if node is None:
            return
        if isinstance(node, (list, tuple, tvm.ir.Array)):
            for child in node:
                visit(child)
            return
        if isinstance(node, tvm.tirx.For) and node.kind == tvm.tirx.ForKind.THREAD_BINDING:
            tag = node.thread_binding.thread_tag
            found[tag] = max(found.get(tag, 1), int(node.extent))
        for attr in ("body", "seq", "block", "then_case", "else_case", "init"):
            child = getattr(node, attr, None)
            if isinstance(child, (tvm.tirx.Stmt, tvm.ir.Array, list)):
                visit(child)

    visit(func.body)
    return found


def intrin_group(form_name: str) -> IntrinGroup:
    """The intrinsics that emit the mma form ``form_name`` (a row of :data:`~.mma.MMA_FORMS`)."""
    for group in INTRIN_GROUPS.values():
        if group.mma.name == form_name:
            return group
    raise ValueError(f"no scheduled GEMM emits mma form {form_name!r}; have {[g.mma.name for g in INTRIN_GROUPS.values()]}")


@dataclass(frozen=True)
class KernelParam:
    name: str  # in the CUDA signature
    ctype: str  # "signed char*", "int*", ...
    role: str  # "A", "B" or "C"


@dataclass
class CudaGemm:
    """A built GEMM: CUDA source, kernel name and signature, launch shape, and (if compiled) PTX/cubin."""

    m: int
    n: int
    k: int
    a_dtype: str
    b_dtype: str
    arch: str
    tiles: GemmTiles
    mma: MmaForm
    source: str
    kernel_name: str
    params: tuple[KernelParam, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0
    ptx: str | None = None
    cubin: bytes | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ops(self) -> int:
        return 2 * self.m * self.n * self.k


_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(([^)]*)\)')


def parse_kernels(source: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(kernel name, [(ctype, param name), ...]), ...]`` of every ``__global__`` declaration or
    definition in ``source`` (TVM writes a forward declaration, so a kernel may appear twice)."""
    kernels = []
    for match in _KERNEL_RE.finditer(source):
        params = []
        for raw in filter(None, (p.strip() for p in match.group(2).split(","))):
            raw = raw.replace("__restrict__", " ").strip()
            name = re.findall(r"\w+", raw)[-1]
            params.append((" ".join(raw[: raw.rindex(name)].split()), name))
        kernels.append((match.group(1), params))
    return kernels


def _kernel_params(params: list[tuple[str, str]]) -> tuple[KernelParam, ...]:
    out = []
    for ctype, name in params:
        role = re.sub(r"(_ptr)?(_\d+)?$", "", name)
        if "*" not in ctype or role not in ("A", "B", "C"):
            raise RuntimeError(f"unexpected kernel parameter {ctype} {name}: the launcher passes only A, B, C")
        out.append(KernelParam(name, ctype, role))
    if sorted(p.role for p in out) != ["A", "B", "C"]:
        raise RuntimeError(f"kernel parameters {params} are not exactly A, B, C")
    return tuple(out)


def cuda_source(mod: tvm.IRModule, arch: str) -> str:
    """CUDA C of ``mod`` from ``tvm.compile`` (a source-only module when no GPU is present)."""
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    ex = tvm.compile(mod, target=target)
    for imported in ex.mod.imports:
        source = imported.inspect_source()
        if "__global__" in source:
            return source
    raise RuntimeError("tvm.compile produced no CUDA kernel")


def build_gemm(
    m: int, n: int, k: int, a_dtype: str = "int8", arch: str = "sm_90", tiles: GemmTiles | None = None,
    compile: bool | str = True, group: IntrinGroup | None = None,
) -> CudaGemm:
    """Schedule, generate and nvcc-compile the GEMM: ``compile`` is True (PTX and cubin), ``"ptx"``,
    ``"cubin"`` or False (CUDA source only). ``group``: other intrinsics than the INT8 ones for
    ``a_dtype`` (:mod:`.fp8` passes its own).

    Examples
    --------
    >>> g = build_gemm(128, 128, 64, "uint8", "sm_80")  # doctest: +SKIP
    >>> g.mma.ptx in g.ptx  # doctest: +SKIP
    True
    """
    if group is None and a_dtype not in INTRIN_GROUPS:
        raise ValueError(f"A dtype {a_dtype!r} is not supported; choose one of {sorted(INTRIN_GROUPS)}")
    group = group or INTRIN_GROUPS[a_dtype]
    form = require_mma(group.mma, arch)
    tiles = tiles or pick_tiles(m, n, k)
    tiles.check_shape(m, n, k)
    sch = schedule_gemm((m, n, k), tiles, group)
    ext = thread_extents(sch.mod["gemm"])
    source = cuda_source(sch.mod, arch)
    kernels = list(dict(parse_kernels(source)).items())  # a declaration and a definition: one kernel
    if len(kernels) != 1:
        raise RuntimeError(f"expected one CUDA kernel, found {[name for name, _ in kernels]}")
    name, params = kernels[0]
    dyn = 0
    if "extern __shared__" in source:  # not expected: our shared buffers are static
        raise RuntimeError("the kernel uses dynamic shared memory; its size is not recorded")
    gemm = CudaGemm(
        m, n, k, group.a_dtype, group.b_dtype, arch, tiles, form, source, name, _kernel_params(params),
        grid=(ext.get("blockIdx.x", 1), ext.get("blockIdx.y", 1), ext.get("blockIdx.z", 1)),
        block=(ext.get("threadIdx.x", 1), ext.get("threadIdx.y", 1), ext.get("threadIdx.z", 1)),
        dynamic_shared_bytes=dyn, extra={"acc_dtype": group.acc_dtype},
    )
    if compile in (True, "ptx"):
        gemm.ptx = nvcc.compile_ptx(source, arch)
    if compile in (True, "cubin"):
        gemm.cubin = nvcc.compile_cubin(source, arch)
    return gemm
