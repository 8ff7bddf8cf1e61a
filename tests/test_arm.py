"""The AArch64 rows: their instructions, exactness for every sign combination, and proof that the
instructions really execute under qemu (a CPU model without them dies with SIGILL).

The kernel exactness grid of tests/test_kernels.py runs on these rows too (generated from the
registry); this file holds what is specific to Arm.
"""

import re
import shutil
from importlib import resources

import numpy as np
import pytest
import tvm

import tvm_lowprec
from tvm_lowprec.board import CROSS_CC, EM_AARCH64
from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, epilogue_params, pack_weights
from tvm_lowprec.qemu import QemuError, QemuModule, is_aarch64, read_tensors, unavailable_reason, write_tensors
from tvm_lowprec.quant.zero_points import gemm_corrections, signed_weights
from tvm_lowprec.schedule import schedule_func
from tvm_lowprec.targets import registered_targets, resolve_target

from conftest import TARGETS

ARM = [t for t in TARGETS if is_aarch64(t)]
# row -> (instructions its GEMM must emit, instructions it must not: they need features it lacks)
INSTRUCTIONS = {
    "arm64-neon": (("smull", "sadalp"), ("sdot", "udot", "usdot", "smmla", "usmmla")),
    "arm64-dotprod": (("sdot",), ("usdot", "smmla", "usmmla")),
    "arm64-i8mm": (("usmmla",), ()),
}
needs_qemu = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _kernel(spec, m, n, k, a_dtype, b_signed, ep=Epilogue("int32")):
    problem = QGemmProblem(m, n, k, a_dtype, ep)
    layout = GemmLayout.choose(problem, spec, b_signed)
    ex = tvm.compile(schedule_func(build_qgemm(problem, layout), spec).mod, target=spec.tvm_target(2))
    return problem, layout, ex


def _run(spec, a, b, za, zb, cpu=None):
    """``(a - za) @ (b - zb)`` by the row's kernel under qemu (int32 epilogue)."""
    (m, k), n = a.shape, b.shape[1]
    b_signed, b_offset = signed_weights(b)
    problem, layout, ex = _kernel(spec, m, n, k, str(a.dtype), b_signed)
    corr = gemm_corrections(b, za, zb, layout.a_offset)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, None)
    out = np.zeros((m, n), np.int32)
    QemuModule(ex.mod, cpu=cpu or spec.qemu_cpu)["qgemm"](a, pack_weights(corr.b_signed, layout), *params, out)
    return out


def test_the_three_rows_are_registered_with_their_qemu_models():
    assert sorted(t.name for t in ARM) == sorted(INSTRUCTIONS)
    for spec in ARM:
        assert spec.qemu_cpu, f"{spec.name} names no qemu CPU model"


@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
def test_assembly_has_the_rows_instruction_and_none_it_lacks(spec):
    wanted, forbidden = INSTRUCTIONS[spec.name]
    _, _, ex = _kernel(spec, 16, 48, 64, "uint8", None)
    asm = ex.mod.inspect_source("asm")
    for mnemonic in wanted:
        assert re.search(rf"\b{mnemonic}\b", asm), f"{spec.name}: no {mnemonic}"
    for mnemonic in forbidden:
        assert not re.search(rf"\b{mnemonic}\b", asm), f"{spec.name}: {mnemonic} needs a feature it lacks"


@needs_qemu
@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
@pytest.mark.parametrize("a_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("b_dtype", ["uint8", "int8"])
def test_every_sign_combination_is_exact(spec, a_dtype, b_dtype, rng):
    """u8 and s8 activations against u8 and s8 weights, extremes included: the signed-only
    instructions see u8 activations as ``a - 128`` (sign bit flipped) and the kernel adds
    ``128 * colsum(B)`` back; u8 weights are shifted to s8 at pack time."""
    m, n, k = 5, 20, 36
    ia, ib = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a = rng.integers(ia.min, ia.max + 1, (m, k)).astype(a_dtype)
    b = rng.integers(ib.min, ib.max + 1, (k, n)).astype(b_dtype)
    a[0], a[1], b[:, 0], b[:, 1] = ia.max, ia.min, ib.max, ib.min  # every corner of the products
    za, zb = (int(ia.max) + 1) // 2 - 3, (0 if b_dtype == "int8" else 128)
    want = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    np.testing.assert_array_equal(_run(spec, a, b, za, zb), want)


@needs_qemu
@pytest.mark.parametrize("row, cpu", [("arm64-dotprod", "cortex-a72"), ("arm64-i8mm", "cortex-a76")])
def test_the_instruction_really_runs_a_cpu_without_it_dies_with_sigill(row, cpu, rng):
    """Negative control: the same kernel on a qemu CPU model without the row's feature (Armv8.0 has
    no sdot; Cortex-A76 has sdot but no i8mm's usmmla) is killed by SIGILL, so the passing runs above
    did execute the instruction."""
    spec = registered_targets()[row]
    a = rng.integers(0, 256, (4, 16)).astype(np.uint8)
    b = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    np.testing.assert_array_equal(_run(spec, a, b, 0, 0), a.astype(np.int64) @ b)  # its own model runs it
    with pytest.raises(QemuError, match="SIGILL") as err:
        _run(spec, a, b, 0, 0, cpu=cpu)
    assert err.value.signal == 4


@pytest.mark.parametrize("alias, row", [
    ("graviton3", "arm64-i8mm"), ("neoverse-v1", "arm64-i8mm"), ("graviton2", "arm64-dotprod"),
    ("cortex-a76", "arm64-dotprod"), ("rpi5", "arm64-dotprod"), ("rpi4", "arm64-neon"), ("cortex-a53", "arm64-neon"),
])
def test_core_names_resolve_to_their_row(alias, row):
    assert resolve_target(alias).name == row


def test_an_llvm_target_dict_resolves_by_its_features():
    base = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    assert resolve_target({**base, "mattr": ["+neon", "+dotprod"]}).gemm.name == "sdot_v16"
    assert resolve_target({**base, "mcpu": "neoverse-v1"}).gemm.name == "usmmla_v16"
    assert resolve_target(base).gemm.name == "smull_v16"


@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
def test_a_model_cross_compiles_and_exports_an_aarch64_library(spec, tmp_path):
    demo = str(resources.files("tvm_lowprec") / "data" / "demo_mlp_qdq.onnx")
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(demo), target=spec.name)
    assert compiled.execution == "none"  # the host cannot run it in-process: a board (RPC) does
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert gemms and all(k.intrinsic.startswith(f"lowprec_{spec.gemm.name}_") for k in gemms)
    if shutil.which(CROSS_CC) is None:  # the error names the packages to install; nothing else to check here
        with pytest.raises(QemuError, match="gcc-aarch64-linux-gnu and libc6-dev-arm64-cross"):
            compiled.export_library(tmp_path / "model.so")
        pytest.skip(f"{CROSS_CC} not found: install the Debian packages gcc-aarch64-linux-gnu and libc6-dev-arm64-cross")
    path = compiled.export_library(tmp_path / "model.so")
    header = open(path, "rb").read(20)
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64


def test_tensor_files_round_trip(tmp_path, rng):
    arrays = [rng.integers(0, 255, (3, 5)).astype(np.uint8), rng.standard_normal((2, 2, 2)).astype(np.float32),
              np.arange(7, dtype=np.int32), np.zeros((0,), np.int8)]
    write_tensors(tmp_path / "t", arrays)
    for got, want in zip(read_tensors(tmp_path / "t"), arrays):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
