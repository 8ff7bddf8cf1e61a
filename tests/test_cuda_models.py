"""Whole quantized models on the GPU rows (``cuda-sm80``, ``cuda-sm89``, ``cuda-sm90``).

Without a GPU (every test here but the last group): the model compiles for the row, every integer
GEMM and convolution is a tensor-core kernel (``Compiled.kernels()``), no kernel is left unscheduled,
nvcc turns the device code into PTX whose mma instructions are exactly the row's forms for the
model's operand types, and into a cubin for the row's architecture (IMMA in its SASS where
``cuobjdump`` is installed). With a GPU: the outputs match ``onnx.reference`` and, bit for bit, the
CPU build of the same model.
"""

import numpy as np
import onnx
import pytest
from models import qlinear_matmul
from onnx.reference import ReferenceEvaluator
from reference import assert_matches
from test_emulation import MODELS

import tvm_lowprec
from tvm_lowprec.cuda import nvcc
from tvm_lowprec.cuda.mma import MMA_BY_NAME, UnsupportedMmaError
from tvm_lowprec.cuda.model import check_mma
from tvm_lowprec.cuda.run import cuda_device_available, tvm_cuda_available
from tvm_lowprec.errors import LowPrecError
from tvm_lowprec.hwspec import CudaTargetSpec
from tvm_lowprec.targets import registered_targets, resolve_target

CUDA_ROWS = list(registered_targets("cuda").values())
needs_nvcc = pytest.mark.skipif(nvcc.find_tool("nvcc") is None, reason="nvcc is not installed")


def _small_encoder(rng):
    from test_emulation import _qdq

    from benchmarks.models.encoder import EncoderConfig, make_encoder

    cfg = EncoderConfig(layers=1, d_model=64, heads=4, d_ff=128, seq=16)
    return _qdq(make_encoder(cfg=cfg), (1, 16, 64), rng)


# the test_emulation models plus a one-layer encoder (LayerNorm, GELU, softmax, batched attention)
GPU_MODELS = {**MODELS, "encoder": (_small_encoder, (1, 16, 64), "one-step")}
_CACHE = {}


def _compiled(name, spec):
    """One build per (model, row) for the whole module."""
    key = (name, spec.name)
    if key not in _CACHE:
        model = GPU_MODELS[name][0](np.random.default_rng(7))
        _CACHE[key] = (model, tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec))
    return _CACHE[key]


# --- the rows


@pytest.mark.parametrize("spec", CUDA_ROWS, ids=lambda s: s.name)
def test_row_forms_exist_on_its_architecture(spec):
    for form in spec.mma_forms():
        assert MMA_BY_NAME[form].min_sm <= int(spec.arch[3:])
    assert MMA_BY_NAME[spec.mma["uint8"]].a_dtype == "uint8"  # u8 activations natively, no shift
    assert {MMA_BY_NAME[f].a_dtype for f in spec.int4_mma} == {"int4", "uint4"}
    assert spec.tiles[0].min_m == 1 and all(t.why for t in spec.tiles)
    assert resolve_target(spec.name) is spec
    assert spec.tvm_target().kind.name == "cuda" and spec.tvm_target().attrs["arch"] == spec.arch


def test_fp8_rows_and_refusal_on_sm80():
    assert registered_targets()["cuda-sm80"].fp8_mma == ()
    assert set(registered_targets()["cuda-sm90"].fp8_mma) == {"e4m3e4m3f32_m16n8k32", "e5m2e5m2f32_m16n8k32"}
    with pytest.raises(UnsupportedMmaError, match=r"e4m3e4m3f32_m16n8k32.*sm_89.*sm_80"):
        CudaTargetSpec("bad", "sm_80", {"uint8": "u8s8s32_m16n8k32"}, registered_targets()["cuda-sm80"].tiles,
                       fp8_mma=("e4m3e4m3f32_m16n8k32",))
    # PTX that uses an instruction the row lacks is refused, naming the instruction and the architecture
    sm80 = registered_targets()["cuda-sm80"]
    ptx = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1}, ..."
    with pytest.raises(UnsupportedMmaError, match=r"e4m3.*cuda-sm80 \(sm_80\)"):
        check_mma(ptx, sm80)


def test_user_cuda_targets_map_to_rows():
    assert resolve_target({"kind": "cuda", "arch": "sm_86"}).base == "cuda-sm80"
    assert resolve_target({"kind": "cuda", "arch": "sm_90a"}).base == "cuda-sm90"
    assert resolve_target("h200").name == "cuda-sm90"
    with pytest.raises(ValueError, match="sm_75"):
        resolve_target({"kind": "cuda", "arch": "sm_75"})


def test_gpu_rows_are_never_the_native_cpu_row():
    assert tvm_lowprec.native_target().base.startswith(("x86", "arm64"))


# --- whole models, compiled without a GPU


def _check_build(compiled, spec, a_dtypes=("uint8",)):
    rows = compiled.kernels()
    gemms = [r for r in rows if r.op == "qgemm"]
    assert gemms, "the model has no integer GEMM"
    for row in gemms:  # every integer GEMM and convolution on a tensor-core form of the row
        assert row.intrinsic in spec.mma.values(), row
    assert not [r for r in rows if r.schedule == "none"], "kernels left unscheduled on a GPU"
    if compiled.cuda is None:
        return
    expected = {MMA_BY_NAME[spec.mma[a]].ptx for a in a_dtypes}
    assert set(compiled.cuda.mma) == expected
    assert compiled.cuda.cubin[:4] == b"\x7fELF"
    assert "ldmatrix.sync.aligned" in compiled.cuda.ptx
    sass = nvcc.sass_mma_opcodes(compiled.cuda.cubin)
    if sass is not None:
        assert any(op.startswith("IMMA") for op in sass), sass


@pytest.mark.parametrize("name", list(GPU_MODELS))
def test_model_compiles_for_sm90_with_every_gemm_on_mma(name):
    spec = registered_targets()["cuda-sm90"]
    _, compiled = _compiled(name, spec)
    _check_build(compiled, spec)


@pytest.mark.parametrize("spec", [s for s in CUDA_ROWS if s.name != "cuda-sm90"], ids=lambda s: s.name)
def test_cnn_compiles_for_each_row(spec):
    _, compiled = _compiled("cnn", spec)
    _check_build(compiled, spec)
    if compiled.cuda is not None:
        assert compiled.cuda.arch == spec.arch


@pytest.mark.parametrize("shapes", [((2, 64, 64), (2, 64, 64)), ((3, 40, 72), (3, 72, 24))], ids=["tiled", "padded"])
def test_batched_runtime_operands_compile(shapes):
    """Attention's Q·Kᵀ shape: both operands activations (packed at run time, a row-sum stage for the
    weight zero point), with and without padding to the block tile."""
    from test_batched import _qlinear_matmul_runtime_b

    spec = registered_targets()["cuda-sm90"]
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_qlinear_matmul_runtime_b(*shapes, "uint8", 131)), target=spec)
    _check_build(compiled, spec)
    assert [k for k in compiled.kernels() if k.op == "pack_b"]


@needs_nvcc
def test_int8_activations_use_the_s8_form():
    spec = registered_targets()["cuda-sm80"]
    model = qlinear_matmul(48, 96, 40, a_dtype="int8")
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    _check_build(compiled, spec, a_dtypes=("int8",))
    assert "s8s8s32_m16n8k32" in {r.intrinsic for r in compiled.kernels()}


@needs_nvcc
def test_compiled_model_shows_its_device_code():
    spec = registered_targets()["cuda-sm90"]
    _, compiled = _compiled("demo-mlp", spec)
    assert "__global__" in compiled.inspect_source("cuda")
    assert compiled.inspect_source("ptx").count(".entry") == len(compiled.cuda.kernel_names) > 0
    assert "sm_90" in compiled.inspect_source("ptx")


@pytest.mark.skipif(tvm_cuda_available(), reason="this host has a CUDA device")
def test_without_a_gpu_the_build_is_compile_only():
    spec = registered_targets()["cuda-sm90"]
    _, compiled = _compiled("demo-mlp", spec)
    assert compiled.execution == "none"
    with pytest.raises(LowPrecError, match="compile-only"):
        compiled(np.zeros((8, 128), np.float32))


# --- on a GPU

GPU, GPU_REASON = cuda_device_available()
needs_gpu = pytest.mark.skipif(not (GPU and tvm_cuda_available()),
                               reason=f"no CUDA device that TVM's runtime can use: {GPU_REASON}")


@needs_gpu
@pytest.mark.parametrize("name", list(GPU_MODELS))
def test_model_on_the_gpu_matches_onnx_reference_and_the_cpu_build(name):
    from tvm_lowprec.cuda.run import device_arch

    spec = resolve_target({"kind": "cuda", "arch": device_arch()})
    model, compiled = _compiled(name, spec)
    assert compiled.execution == "cuda"
    cpu = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    _, shape, how = GPU_MODELS[name]
    reference = ReferenceEvaluator(onnx.version_converter.convert_version(model, 21))
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        got = compiled(x)[0]
        assert_matches(got, reference.run(None, {model.graph.input[0].name: x})[0], how, model)
        if how != "close":  # integer paths: the same integers as the CPU rows
            np.testing.assert_array_equal(got, cpu(x)[0])
