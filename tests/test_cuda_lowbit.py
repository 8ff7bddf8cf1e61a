"""Low-bit tensor-core GEMMs: FP8 (e4m3, e5m2; TVM-scheduled) and INT4 (s4, u4 x s4; CUDA C generated
from Python). Here, without a GPU: the emitted PTX and cubins, the refusals and shape errors, int4
packing, and a lane-by-lane numpy model of the INT4 kernel against numpy. On a GPU (skipped, with the
reason, where there is none): INT4 exact and FP8 against a float64 model."""

import numpy as np
import pytest

from tvm_lowprec.cuda import nvcc
from tvm_lowprec.cuda.int4 import (
    INT4_TILE_TABLE,
    Int4Tiles,
    build_int4_gemm,
    emulate_int4_gemm,
    int4_gemm_source,
    pack_int4,
    pick_int4_tiles,
    unpack_int4,
)
from tvm_lowprec.cuda.mma import MMA_BY_NAME, UnsupportedMmaError, find_mma, require_mma
from tvm_lowprec.cuda.run import cuda_device_available, operand_layout

needs_nvcc = pytest.mark.skipif(nvcc.find_tool("nvcc") is None, reason="nvcc is not installed")

FP8_DTYPES = ["float8_e4m3fn", "float8_e5m2"]
FP8_PTX = {"float8_e4m3fn": "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
           "float8_e5m2": "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32"}
INT4_A = ["int4", "uint4"]
INT4_PTX = {"int4": "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32",
            "uint4": "mma.sync.aligned.m16n8k64.row.col.s32.u4.s4.s32"}
FP8_SHAPE = (256, 128, 128)  # two block tiles of 128x128, two K steps of 64
INT4_SHAPE = (128, 256, 256)  # two block tiles of 128x128, two K steps of 128


def _int4_operands(rng, m, n, k, a_dtype):
    lo, hi = (-8, 7) if a_dtype == "int4" else (0, 15)
    a = rng.integers(lo, hi, size=(m, k), endpoint=True)
    b = rng.integers(-8, 7, size=(n, k), endpoint=True)
    a[0, :], a[-1, :] = lo, hi  # the extremes over whole rows: -8 * -8, 15 * -8, 7 * 7 ... summed K times
    b[0, :], b[-1, :] = -8, 7
    a[1, ::2], a[1, 1::2] = lo, hi  # alternating, so that low and high nibbles differ
    return a, b


# --- the mma table


def test_u4s4_row():
    form = MMA_BY_NAME["u4s4s32_m16n8k64"]
    assert form.ptx == INT4_PTX["uint4"] and form.min_sm == 80
    assert find_mma("uint4", "int4", "int32") is form
    with pytest.raises(UnsupportedMmaError, match=r"u4s4s32_m16n8k64.*sm_80.*sm_75"):
        require_mma(form, "sm_75")


# --- int4 packing


def test_pack_unpack_every_value():
    for dtype, values in (("int4", np.arange(-8, 8)), ("uint4", np.arange(16))):
        pairs = np.stack(np.meshgrid(values, values, indexing="ij"), axis=-1).reshape(-1, 2)  # every (even, odd)
        packed = pack_int4(pairs, dtype)
        assert packed.dtype == np.uint8 and packed.shape == (256, 1)
        assert sorted(packed[:, 0].tolist()) == list(range(256))  # every byte, once
        np.testing.assert_array_equal(packed[:, 0] & 0xF, pairs[:, 0] & 0xF)  # low nibble = even k
        out = unpack_int4(packed, dtype)
        assert out.dtype == (np.int8 if dtype == "int4" else np.uint8)
        np.testing.assert_array_equal(out, pairs)
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, size=(3, 5, 64))
    np.testing.assert_array_equal(unpack_int4(pack_int4(x)), x)
    assert pack_int4(np.array([[-8, 7]]))[0, 0] == 0x78


def test_pack_errors():
    with pytest.raises(ValueError, match="even"):
        pack_int4(np.zeros((2, 3), dtype=int))
    with pytest.raises(ValueError, match=r"int4 values must lie in \[-8, 7\]"):
        pack_int4(np.array([0, 8]))
    with pytest.raises(ValueError, match=r"uint4 values must lie in \[0, 15\]"):
        pack_int4(np.array([-1, 0]), "uint4")
    with pytest.raises(ValueError, match="integers"):
        pack_int4(np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="uint8"):
        unpack_int4(np.zeros(4, dtype=np.int8))


# --- INT4 kernel: tiles, shapes, the numpy model of its lanes


def test_int4_tile_table():
    for tiles in INT4_TILE_TABLE:
        assert tiles.why and tiles.shared_bytes <= 48 * 1024
        assert tiles.row_stride % 32 == 16  # ldmatrix rows in distinct bank groups
    assert pick_int4_tiles(256, 256, 512) == INT4_TILE_TABLE[0]
    assert pick_int4_tiles(64, 192, 128).block_m == 64
    assert pick_int4_tiles(16, 48, 64).warps == 1
    with pytest.raises(ValueError, match="warp tile"):
        Int4Tiles(128, 128, 96, 64, 64)
    with pytest.raises(ValueError, match="48 KiB"):
        Int4Tiles(128, 128, 256, 64, 64, stages=3)


@pytest.mark.parametrize("shape, dim", [((100, 128, 128), "M=100"), ((128, 24, 128), "N=24"),
                                        ((128, 128, 96), "K=96"), ((0, 16, 64), "M=0")])
def test_int4_shape_errors(shape, dim):
    with pytest.raises(ValueError, match=dim):
        build_int4_gemm(*shape, compile=False)
    with pytest.raises(ValueError, match="K=128"):
        Int4Tiles(64, 64, 256, 32, 32).check_shape(64, 64, 128)


def test_int4_refusals():
    with pytest.raises(ValueError, match="not supported"):
        build_int4_gemm(128, 128, 128, a_dtype="int8", compile=False)
    with pytest.raises(UnsupportedMmaError, match=r"s4s4s32_m16n8k64.*sm_80.*sm_75"):
        build_int4_gemm(128, 128, 128, arch="sm_75", compile=False)


MODEL_CASES = [((32, 48, 128), 2), ((128, 64, 384), 1), ((128, 256, 256), 0)]  # (shape, tile row)


@pytest.mark.parametrize("a_dtype", INT4_A)
@pytest.mark.parametrize("shape, row", MODEL_CASES, ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else f"row{c}")
def test_int4_kernel_model_exact(shape, row, a_dtype):
    """The kernel's own index expressions, ldmatrix and mma per the PTX ISA, lane by lane: exact."""
    m, n, k = shape
    g = build_int4_gemm(m, n, k, a_dtype, tiles=INT4_TILE_TABLE[row], compile=False)
    a, b = _int4_operands(np.random.default_rng(m + n + k), m, n, k, a_dtype)
    c = emulate_int4_gemm(g, pack_int4(a, a_dtype), pack_int4(b, "int4"))
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64).T)


def test_int4_source_and_launch():
    g = build_int4_gemm(*INT4_SHAPE, "uint4", compile=False)
    t = g.tiles
    assert g.grid == ((128 // t.block_m) * (256 // t.block_n), 1, 1) and g.block == (32, t.warps, 1)
    assert [p.role for p in g.params] == ["A", "B", "C"]
    assert f"__launch_bounds__({t.threads})" in g.source and "#include" not in g.source
    assert int4_gemm_source(*INT4_SHAPE, "uint4", t) == g.source
    layout = operand_layout(g)
    assert layout["A"][:2] == ((128, 128), np.uint8) and "packed" in layout["A"][2]
    assert layout["B"][:2] == ((256, 128), np.uint8) and layout["C"][:2] == ((128, 256), np.int32)


# --- compiled kernels (nvcc, no GPU): module-scoped, built once


@pytest.fixture(scope="module")
def int4_built():
    return {dt: build_int4_gemm(*INT4_SHAPE, a_dtype=dt, arch="sm_80") for dt in INT4_A}


@pytest.fixture(scope="module")
def fp8_built():
    from tvm_lowprec.cuda.fp8 import build_fp8_gemm

    return {dt: build_fp8_gemm(*FP8_SHAPE, dtype=dt, arch="sm_89") for dt in FP8_DTYPES}


@needs_nvcc
@pytest.mark.parametrize("a_dtype", INT4_A)
def test_int4_ptx(int4_built, a_dtype):
    g = int4_built[a_dtype]
    found = nvcc.ptx_mma_instructions(g.ptx)
    assert g.mma.ptx == INT4_PTX[a_dtype]
    assert set(found) == {INT4_PTX[a_dtype]}
    t = g.tiles
    assert found[INT4_PTX[a_dtype]] == (t.warp_m // 16) * (t.warp_n // 8) * (t.block_k // 64)  # one K step, unrolled
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in g.ptx and "cp.async.cg.shared.global" in g.ptx


@needs_nvcc
@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_ptx(fp8_built, dtype):
    g = fp8_built[dtype]
    found = nvcc.ptx_mma_instructions(g.ptx)
    assert g.mma.ptx == FP8_PTX[dtype]
    assert set(found) == {FP8_PTX[dtype]}
    t = g.tiles
    per_step = (t.warp_m // 16) * (t.warp_n // 8) * (t.block_k // 32)  # a K step of the warp tile, unrolled
    assert found[FP8_PTX[dtype]] in (per_step, per_step * FP8_SHAPE[2] // t.block_k)  # nvcc may unroll K too
    assert "ldmatrix.sync.aligned.m8n8.x4" in g.ptx
    m, n, _ = FP8_SHAPE
    assert g.grid == ((m // t.block_m) * (n // t.block_n), 1, 1) and g.block == (32, t.warps, 1)
    layout = operand_layout(g)
    assert layout["A"] == ((256, 128), np.uint8, f"{dtype} bits") and layout["C"][:2] == ((256, 128), np.float32)


def _cubins(built, key, other_arch):
    g = built[key]
    return {g.arch: g.cubin, other_arch: nvcc.compile_cubin(g.source, other_arch)}


@pytest.fixture(scope="module")
def cubins(int4_built, fp8_built):
    """sm_80 and sm_90 (INT4), sm_89 and sm_90 (FP8): one of each dtype."""
    out = {}
    for key in INT4_A:
        out[key] = _cubins(int4_built, key, "sm_90")
    for key in FP8_DTYPES:
        out[key] = _cubins(fp8_built, key, "sm_90")
    return out


@needs_nvcc
@pytest.mark.parametrize("key", INT4_A + FP8_DTYPES)
def test_cubins_build(cubins, key):
    expected = {"sm_80", "sm_90"} if key in INT4_A else {"sm_89", "sm_90"}
    assert set(cubins[key]) == expected
    for arch, cubin in cubins[key].items():
        assert cubin[:4] == b"\x7fELF", arch


# The tensor-core SASS each cubin must hold (CUDA 13.0's ptxas, read with cuobjdump 13.4). sm_80 has
# 4-bit and sm_89 FP8 tensor cores: one native op per mma. Hopper (sm_90) has neither for mma.sync:
# ptxas emulates m16n8k64 4-bit with 8-bit IMMA.16832 (in a called subroutine) and FP8 m16n8k32
# with F2FP (e4m3/e5m2 -> f16, exact) and two HMMA.16816.F32; FP8 runs natively there only in wgmma.
SASS_EXPECTED = {
    ("int4", "sm_80"): "IMMA.16864.S4.S4", ("uint4", "sm_80"): "IMMA.16864.U4.S4",
    ("int4", "sm_90"): "IMMA.16832.S8.S8", ("uint4", "sm_90"): "IMMA.16832.U8.S8",
    ("float8_e4m3fn", "sm_89"): "QMMA.16832.F32.E4M3.E4M3", ("float8_e5m2", "sm_89"): "QMMA.16832.F32.E5M2.E5M2",
    ("float8_e4m3fn", "sm_90"): "HMMA.16816.F32", ("float8_e5m2", "sm_90"): "HMMA.16816.F32",
}


@needs_nvcc
@pytest.mark.parametrize("key", INT4_A + FP8_DTYPES)
def test_sass_has_tensor_core_ops(cubins, key):
    for arch, cubin in cubins[key].items():
        sass = nvcc.sass_mma_opcodes(cubin)
        if sass is None:
            pytest.skip("cuobjdump is not installed: cubins built (test_cubins_build), SASS not inspected")
        assert set(sass) == {SASS_EXPECTED[key, arch]}, (arch, sass)


# --- FP8 refusals and shapes (no nvcc needed: refused before building)


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_refused_on_sm80(dtype):
    from tvm_lowprec.cuda.fp8 import build_fp8_gemm

    short = "e4m3" if dtype == "float8_e4m3fn" else "e5m2"
    with pytest.raises(UnsupportedMmaError) as err:
        build_fp8_gemm(*FP8_SHAPE, dtype=dtype, arch="sm_80")
    msg = str(err.value)
    assert f"{short}{short}f32_m16n8k32" in msg and FP8_PTX[dtype] in msg and "sm_80" in msg and "sm_89" in msg


@pytest.mark.parametrize("shape, dim", [((100, 128, 64), "M=100"), ((128, 40, 64), "N=40"), ((128, 128, 48), "K=48")])
def test_fp8_shape_errors(shape, dim):
    from tvm_lowprec.cuda.fp8 import build_fp8_gemm

    with pytest.raises(ValueError, match=dim):
        build_fp8_gemm(*shape, compile=False)


def test_fp8_dtype_error():
    from tvm_lowprec.cuda.fp8 import build_fp8_gemm

    with pytest.raises(ValueError, match="float8_e4m3fn"):
        build_fp8_gemm(*FP8_SHAPE, dtype="float8_e4m3fnuz", compile=False)


def test_fp8_error_bound_and_decode():
    import ml_dtypes

    from tvm_lowprec.cuda.fp8 import decode_fp8, fp8_error_bound

    codes = np.arange(256, dtype=np.uint8)
    for dtype in FP8_DTYPES:
        ref = codes.view(getattr(ml_dtypes, dtype)).astype(np.float64)
        np.testing.assert_array_equal(decode_fp8(codes, dtype), ref)
    a = np.ones((2, 64))
    bound = fp8_error_bound(a, a)
    np.testing.assert_allclose(bound, 64 * (64 * 2.0**-24 + 2 * 2.0**-13))


# --- on a GPU

GPU, GPU_REASON = cuda_device_available()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no CUDA device: {GPU_REASON}")

# each INT4 tile row, square and not, several block tiles and K steps
INT4_GPU_SHAPES = [(256, 384, 512), (384, 128, 1024), (64, 192, 384), (48, 80, 192), (16, 16, 64)]
FP8_GPU_SHAPES = [(256, 384, 512), (64, 192, 128), (48, 80, 96)]


def _build_arch():
    from tvm_lowprec.cuda.run import device_arch

    return device_arch(), ("cubin" if nvcc.find_tool("nvcc") else False)


@needs_gpu
@pytest.mark.parametrize("a_dtype", INT4_A)
@pytest.mark.parametrize("shape", INT4_GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int4_exact_on_gpu(shape, a_dtype):
    from tvm_lowprec.cuda.run import run_gemm

    m, n, k = shape
    arch, compile_ = _build_arch()
    a, b = _int4_operands(np.random.default_rng(m * 7 + n * 3 + k), m, n, k, a_dtype)
    g = build_int4_gemm(m, n, k, a_dtype=a_dtype, arch=arch, compile=compile_)
    c = run_gemm(g, pack_int4(a, a_dtype), pack_int4(b, "int4"))
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c.astype(np.int64), a.astype(np.int64) @ b.astype(np.int64).T)


def _fp8_or_skip():
    from tvm_lowprec.cuda.mma import sm_number
    from tvm_lowprec.cuda.run import device_arch

    if sm_number(device_arch()) < 89:
        pytest.skip(f"{device_arch()} has no FP8 mma.sync (needs sm_89)")


@needs_gpu
@pytest.mark.parametrize("dtype", FP8_DTYPES)
@pytest.mark.parametrize("shape", FP8_GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_on_gpu(shape, dtype):
    """Two checks. Small integers (-2..2, exact in both formats): every partial sum is an integer
    below 4K = 2^11 for K = 512, exact in any accumulator keeping 12 bits or more, so C must be
    exact. Random values: within :func:`fp8_error_bound` (float32 accumulation, plus a rounding at
    14 bits per k32 step) of the float64 sum of the exact products."""
    import ml_dtypes

    from tvm_lowprec.cuda.fp8 import build_fp8_gemm, decode_fp8, fp8_error_bound
    from tvm_lowprec.cuda.run import GemmKernel

    _fp8_or_skip()
    m, n, k = shape
    arch, compile_ = _build_arch()
    kernel = GemmKernel(build_fp8_gemm(m, n, k, dtype=dtype, arch=arch, compile=compile_))
    import cupy

    f8 = getattr(ml_dtypes, dtype)
    rng = np.random.default_rng(m + n + k)

    def run(a, b):
        c = kernel(cupy.asarray(a.view(np.uint8)), cupy.asarray(b.view(np.uint8)))
        return cupy.asnumpy(c)

    a = rng.integers(-2, 2, size=(m, k), endpoint=True).astype(f8)
    b = rng.integers(-2, 2, size=(n, k), endpoint=True).astype(f8)
    c = run(a, b)
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c.astype(np.float64), decode_fp8(a, dtype) @ decode_fp8(b, dtype).T)

    fmax = float(ml_dtypes.finfo(f8).max)
    a = (rng.standard_normal((m, k)) * 2).astype(f8)
    b = (rng.standard_normal((n, k)) * 2).astype(f8)
    a[0, :], b[0, :] = fmax, fmax  # the largest finite value over a whole row
    a[-1, :] = -fmax
    a64, b64 = decode_fp8(a, dtype), decode_fp8(b, dtype)
    c = run(a, b).astype(np.float64)
    ref = a64 @ b64.T
    err = np.abs(c - ref)
    assert np.all(np.isfinite(c))
    assert np.all(err <= fp8_error_bound(a64, b64)), float(np.max(err / np.maximum(fp8_error_bound(a64, b64), 1e-30)))
