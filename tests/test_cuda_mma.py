"""CUDA tensor-core GEMM: the mma table, the emitted PTX/SASS (no GPU needed), and exact results
on a GPU (skipped, with the reason, where there is none)."""

import numpy as np
import pytest

from tvm_lowprec.cuda import nvcc
from tvm_lowprec.cuda.mma import MMA_FORMS, UnsupportedMmaError, forms_for, require_mma, sm_number
from tvm_lowprec.cuda.run import cuda_device_available

A_DTYPES = ["int8", "uint8"]
SHAPE = (128, 128, 64)  # one block tile of the first TILE_TABLE row

needs_nvcc = pytest.mark.skipif(nvcc.find_tool("nvcc") is None, reason="nvcc is not installed")


# --- the table, generated tests per row


@pytest.mark.parametrize("form", MMA_FORMS, ids=lambda f: f.name)
def test_mma_row_spelling_and_arch(form):
    assert form.ptx.startswith(f"mma.sync.aligned.{form.shape}.row.col.")
    assert require_mma(form, f"sm_{form.min_sm}") is form
    assert form in forms_for("sm_90")
    if form.min_sm > 80:
        with pytest.raises(UnsupportedMmaError) as err:
            require_mma(form.name, "sm_80")
        assert form.name in str(err.value) and "sm_80" in str(err.value) and f"sm_{form.min_sm}" in str(err.value)


def test_fp8_refused_on_sm80_names_both():
    with pytest.raises(UnsupportedMmaError, match=r"e4m3e4m3f32_m16n8k32.*sm_89.*sm_80"):
        require_mma("e4m3e4m3f32_m16n8k32", "sm_80")
    assert isinstance(UnsupportedMmaError("x"), ValueError)


def test_required_forms_present():
    names = {f.ptx for f in MMA_FORMS}
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in names
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32" in names
    assert "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32" in names
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32" in names
    assert sm_number("sm_90a") == 90 and sm_number(80) == 80
    with pytest.raises(UnsupportedMmaError, match="unknown mma form"):
        require_mma("nope", "sm_90")


# --- generated kernels (TVM + nvcc, no GPU)


@pytest.fixture(scope="module")
def built():
    from tvm_lowprec.cuda.gemm import build_gemm

    return {dt: build_gemm(*SHAPE, a_dtype=dt, arch="sm_80") for dt in A_DTYPES}


def test_tiles_and_shape_checks():
    from tvm_lowprec.cuda.gemm import GemmTiles, pick_tiles

    assert pick_tiles(256, 128, 64) == GemmTiles(128, 128, 64, 64, 64)
    assert pick_tiles(64, 192, 64).block_m == 64
    assert pick_tiles(16, 16, 32).warps == 1
    with pytest.raises(ValueError, match="N=100"):
        GemmTiles(128, 128, 64, 64, 64).check_shape(128, 100, 64)
    with pytest.raises(ValueError, match="pad"):
        pick_tiles(17, 16, 32)
    with pytest.raises(ValueError):
        GemmTiles(128, 128, 64, 48, 64)


@needs_nvcc
@pytest.mark.parametrize("a_dtype", A_DTYPES)
def test_ptx_has_mma(built, a_dtype):
    g = built[a_dtype]
    found = nvcc.ptx_mma_instructions(g.ptx)
    expected = f"mma.sync.aligned.m16n8k32.row.col.s32.{'u8' if a_dtype == 'uint8' else 's8'}.s8.s32"
    assert g.mma.ptx == expected
    assert set(found) == {expected}
    m, n, k = SHAPE
    warp_tile_mmas = (g.tiles.warp_m // 16) * (g.tiles.warp_n // 8) * (g.tiles.block_k // 32)
    assert found[expected] == warp_tile_mmas  # the per-warp inner loop is fully unrolled
    assert "ldmatrix.sync.aligned.m8n8.x4" in g.ptx


@pytest.mark.parametrize("a_dtype", A_DTYPES)
def test_launch_configuration(built, a_dtype):
    g = built[a_dtype]
    m, n, k = SHAPE
    t = g.tiles
    assert g.grid == ((m // t.block_m) * (n // t.block_n), 1, 1)
    assert g.block == (32, t.warps, 1)
    assert [p.role for p in g.params] == ["A", "B", "C"]
    assert g.dynamic_shared_bytes == 0 and "extern __shared__" not in g.source
    assert f"__launch_bounds__({32 * t.warps})" in g.source


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cubin_and_sass(built, arch):
    g = built["uint8"]
    cubin = g.cubin if arch == "sm_80" else nvcc.compile_cubin(g.source, arch)
    assert cubin[:4] == b"\x7fELF"
    sass = nvcc.sass_mma_opcodes(cubin)
    if sass is None:
        pytest.skip("cuobjdump is not installed: cubin built, SASS not inspected")
    assert any(op.startswith("IMMA") for op in sass), sass


@needs_nvcc
def test_nvcc_error_carries_stderr():
    with pytest.raises(nvcc.NvccError, match="undeclared|identifier"):
        nvcc.compile_ptx("__global__ void k() { undefined_thing(); }", "sm_80")


def test_fp8_gemm_refused_before_building():
    from tvm_lowprec.cuda.gemm import build_gemm

    with pytest.raises(ValueError, match="not supported"):
        build_gemm(*SHAPE, a_dtype="float8_e4m3fn", arch="sm_80", compile=False)


# --- on a GPU: exact against numpy int64

GPU, GPU_REASON = cuda_device_available()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no CUDA device: {GPU_REASON}")

# each tile row of TILE_TABLE, square and not, several block tiles and K steps
GPU_SHAPES = [(256, 384, 128), (384, 128, 512), (64, 192, 64), (48, 80, 96), (16, 16, 32)]


def _operands(rng, m, n, k, a_dtype):
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(np.int8)
    a = rng.integers(info_a.min, info_a.max, size=(m, k), endpoint=True).astype(a_dtype)
    b = rng.integers(info_b.min, info_b.max, size=(n, k), endpoint=True).astype(np.int8)
    a[0, :] = info_a.min  # the extremes: -128 * -128 and 255 * -128 over a whole row
    a[-1, :] = info_a.max
    b[0, :] = info_b.min
    b[-1, :] = info_b.max
    return a, b


@needs_gpu
@pytest.mark.parametrize("a_dtype", A_DTYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_exact_on_gpu(shape, a_dtype):
    from tvm_lowprec.cuda.gemm import build_gemm
    from tvm_lowprec.cuda.run import device_arch, run_gemm

    m, n, k = shape
    a, b = _operands(np.random.default_rng(m * 7 + n * 3 + k), m, n, k, a_dtype)
    # the cubin only (PTX is checked above); without nvcc the launcher compiles the source with CuPy
    g = build_gemm(m, n, k, a_dtype=a_dtype, arch=device_arch(), compile="cubin" if nvcc.find_tool("nvcc") else False)
    c = run_gemm(g, a, b)
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c.astype(np.int64), expected)
