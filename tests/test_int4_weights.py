"""4-bit weight-only layers (``MatMulNBits``, blocked int4/uint4 QDQ) on the 4-bit kernel
(:mod:`tvm_lowprec.kernels.nbits`): float activations against ONNX Runtime's ``accuracy_level=0``
and an exact numpy model, int8 activations against the numpy model of the same integer arithmetic
and against ``accuracy_level=4``; the dot product each x86 row emits; every row run (natively or
emulated) from the registry."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
import tvm_lowprec.qemu
from conftest import board_session
from tvm_lowprec.hwspec import Tile
from tvm_lowprec.kernels.nbits import reference
from tvm_lowprec.targets import registered_targets

ROWS = registered_targets("cpu")
# one row per 4-bit dot product (the AArch64 dotprod and i8mm rows share sdot), and a row without one
INT8_ROWS = list({(spec.nibble.intrin.name if spec.nibble else None): name for name, spec in ROWS.items()}.values())
# the float path per instruction set and vector width
FLOAT_ROWS = list({(name.split("-")[0], spec.gemm.vector_bits): name for name, spec in ROWS.items()}.values())
# what each row's 4-bit dot product must emit (by the NibbleIntrin's name), and its float path
INSTRUCTION = {"vpdpbusd": "vpdpbusd", "vpmaddubsw": "vpmaddubsw", "sdot": "sdot"}
FLOAT_PATH = {"x86": ("vcvtdq2ps", "vfmadd"), "arm": ("fmla",)}


def _float_tile(spec, m):
    """The row's float-activation tile for M rows (its ``nibble_float`` table, else ``nibble``'s)."""
    tiles = spec.nibble_float or (spec.nibble.tiles if spec.nibble else ())
    return next((t for t in reversed(tiles) if t.min_m <= m), None) or Tile(1, 1, 4)


BLOCK_ROWS = [r for r in FLOAT_ROWS if any(t.wide_b for t in ROWS[r].nibble_float)]


@pytest.mark.parametrize("row", BLOCK_ROWS)
def test_float_activations_widen_whole_blocks_for_several_row_tiles(row, rng):
    """Generated from the registry: a row whose float tiles widen whole blocks takes that path from the
    tile's M (here 5 rows: two 4-row tiles, the second padded), runs natively or emulated, and equals
    the float64 model; its FMAs are in the assembly."""
    spec = tvm_lowprec.resolve_target(row)
    m = next(t.min_m for t in spec.nibble_float if t.wide_b) + 1
    model, q, scale, zp = _nbits_model(rng, (m,), 40, 96, 32)
    compiled = _compile(model, "float", target=row)
    [kernel] = _nbits_kernels(compiled)
    assert kernel.intrinsic.startswith("block_widen_fma")
    assert "vfmadd" in compiled.inspect_source("asm")
    assert compiled.execution in ("native", "emulated")
    x = rng.standard_normal((m, 96)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], reference(x, q, scale, zp, 32), rtol=1e-5, atol=1e-5)


def _nbits_model(rng, m_shape, n, k, block, zero_points=True, accuracy_level=0, bias=False):
    """A single ``MatMulNBits`` node with random 4-bit weights; returns (model, q[N, K], scale, zp)."""
    kb = -(-k // block)
    q = rng.integers(0, 16, (n, kb * block)).astype(np.uint8)
    q[:, k:] = 0
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, kb, block // 2)
    scale = ((rng.random((n, kb)) + 0.5) * 0.02).astype(np.float32)
    zp = rng.integers(0, 16, (n, kb)).astype(np.uint8) if zero_points else np.full((n, kb), 8, np.uint8)
    inputs, inits = ["x", "B", "scales"], [numpy_helper.from_array(packed, "B"),
                                           numpy_helper.from_array(scale.reshape(-1), "scales")]
    if zero_points:
        zp_pad = np.zeros((n, kb + kb % 2), np.uint8)
        zp_pad[:, :kb] = zp
        inits.append(numpy_helper.from_array((zp_pad[:, 0::2] | (zp_pad[:, 1::2] << 4)).reshape(-1), "zp"))
        inputs.append("zp")
    if bias:
        inputs += [""] * (5 - len(inputs)) + ["bias"]
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*m_shape, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*m_shape, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return model, q[:, :k], scale, zp.astype(np.float32)


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _compile(model, activations, target="native"):
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=target,
                               weight_only=tvm_lowprec.WeightOnlyConfig(activations=activations))


def _nbits_kernels(compiled):
    return [k for k in compiled.kernels() if k.op == "nbits_gemm"]


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# M = 1 (GEMV), 3 (padded to the 2-row tile), 16; K not a whole number of blocks; N not a whole task
@pytest.mark.parametrize("m,n,k,block", [(1, 64, 256, 32), (3, 40, 80, 16), (16, 136, 256, 128)])
@pytest.mark.parametrize("zero_points", [True, False])
def test_float_activations_match_ort_and_the_numpy_model(m, n, k, block, zero_points, rng):
    model, q, scale, zp = _nbits_model(rng, (m,), n, k, block, zero_points)
    compiled = _compile(model, "float")
    [kernel] = _nbits_kernels(compiled)
    assert kernel.intrinsic.startswith("block_widen_fma" if _float_tile(tvm_lowprec.resolve_target("native"), m).wide_b
                                       else "widen_fma")
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = compiled(x)[0]
    np.testing.assert_allclose(got, reference(x, q, scale, zp, block), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,n,k,block", [(1, 64, 256, 32), (3, 40, 80, 16), (16, 136, 256, 128)])
@pytest.mark.parametrize("zero_points", [True, False])
def test_int8_activations_are_the_integer_model_exactly_and_near_ort_level_4(m, n, k, block, zero_points, rng):
    """Without zero points (8 for every block, as ORT GenAI's builder writes its symmetric weights)
    the kernel reads no scaled-zero-point stream: its ``z * sum(a)`` is an integer."""
    model, q, scale, zp = _nbits_model(rng, (m,), n, k, block, zero_points, accuracy_level=4)
    compiled = _compile(model, "int8")
    [kernel] = _nbits_kernels(compiled)
    from dataclasses import replace

    from tvm_lowprec.quant.weight_int4 import _problem

    problem = replace(_problem(m, n, k, block, tvm_lowprec.resolve_target("native"), "int8"),
                      zero_point=None if zero_points else 8)
    # every parameter buffer whole: X, the nibbles, the scales (and s * z), and Y
    assert kernel.reads == 4 * m * k + problem.weight_bytes + kernel.writes
    nibble = tvm_lowprec.resolve_target("native").nibble.intrin
    assert kernel.intrinsic == nibble.intrins[nibble.groups_for(block)]
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = compiled(x)[0]
    # the integer dot products are exact; only the float scaling of each block's sum rounds
    np.testing.assert_allclose(got, reference(x, q, scale, zp, block, "int8"), rtol=1e-5, atol=1e-5)
    floats = reference(x, q, scale, zp, block)
    # the documented cost of int8 activations (docs/numerics.md): about 0.5 % of the output's norm
    assert _rel(got, floats) < 0.01
    # ONNX Runtime's accuracy_level=4 quantizes the same blocks the same way (measured: 1e-7 relative)
    assert _rel(got, _ort(model, x)) < 1e-3


def test_batched_activations_and_bias(rng):
    model, q, scale, zp = _nbits_model(rng, (2, 3), 48, 64, 32, bias=True)
    compiled = _compile(model, "float")
    assert len(_nbits_kernels(compiled)) == 1
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got = compiled(x)[0]
    assert got.shape == (2, 3, 48)
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


def _blocked_qdq_model(rng, signed: bool, zero_points: bool, k=64, n=24, block=16):
    """x @ DequantizeLinear(W int4/uint4 [K, N], scale [K/block, N], axis=0, block_size)."""
    elem, lo, hi = (TensorProto.INT4, -8, 7) if signed else (TensorProto.UINT4, 0, 15)
    w = rng.integers(lo, hi + 1, (k, n))
    scale = ((rng.random((k // block, n)) + 0.5) * 0.05).astype(np.float32)
    inits = [helper.make_tensor("w", elem, [k, n], w.ravel().tolist()), numpy_helper.from_array(scale, "s")]
    dq_inputs = ["w", "s"]
    zp = rng.integers(lo, hi + 1, (k // block, n)) if zero_points else np.zeros((k // block, n), np.int64)
    if zero_points:
        inits.append(helper.make_tensor("z", elem, [k // block, n], zp.ravel().tolist()))
        dq_inputs.append("z")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["wf"], axis=0, block_size=block),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    weights = (w - zp.repeat(block, axis=0)) * scale.repeat(block, axis=0)
    return model, weights


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("zero_points", [True, False])
def test_blocked_qdq_int4_weights_take_the_kernel(signed, zero_points, rng):
    model, weights = _blocked_qdq_model(rng, signed, zero_points)
    compiled = _compile(model, "float")
    assert len(_nbits_kernels(compiled)) == 1
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], x.astype(np.float64) @ weights, rtol=1e-5, atol=1e-5)


def test_eight_bit_blocked_weights_stay_float(rng):
    from test_matmul_nbits import _fp32_model, _quantized

    model = _quantized(_fp32_model(rng, k=64), 32, False, bits=8)
    compiled = _compile(model, "int8")
    assert not _nbits_kernels(compiled)


def test_weight_only_config_is_checked():
    with pytest.raises(ValueError, match="activations"):
        tvm_lowprec.WeightOnlyConfig(activations="int4")


@pytest.mark.parametrize("row,activations", [(r, "int8") for r in INT8_ROWS] + [(r, "float") for r in FLOAT_ROWS])
def test_every_row_runs_the_kernel_exactly(row, activations, rng, request):
    """Generated from the registry (each 4-bit dot product once, each float path once): the row's
    instruction in the assembly, and the results (native,
    emulated where this host lacks an x86 row, under qemu for the AArch64 rows) equal to the numpy
    model. A row without a 4-bit dot product runs int8 requests on the float path, and says so."""
    spec = tvm_lowprec.resolve_target(row)
    model, q, scale, zp = _nbits_model(rng, (2,), 40, 96, 32)
    if activations == "int8" and spec.nibble is None:
        with pytest.warns(UserWarning, match="no 4-bit dot product"):
            compiled = _compile(model, activations, target=row)
        activations = "float"
    else:
        compiled = _compile(model, activations, target=row)
    on_board = tvm_lowprec.qemu.is_aarch64(spec)
    assert compiled.execution in (("none",) if on_board else ("native", "emulated"))
    asm = compiled.inspect_source("asm")
    if activations == "int8":
        [ins] = [ins for key, ins in INSTRUCTION.items() if spec.nibble.intrin.name.startswith(key)]
        assert ins in asm
    else:
        assert all(ins in asm for ins in FLOAT_PATH["arm" if row.startswith("arm") else "x86"])
    if spec.nibble is not None and spec.nibble.intrin.lanes == 16:
        assert "zmm" in asm
    x = rng.standard_normal((2, 96)).astype(np.float32)
    if on_board:  # the emulated arm64 board (conftest.arm_board: TVM's RPC server under qemu-aarch64)
        with compiled.remote(board_session(request.getfixturevalue("arm_board"))) as remote:
            got = remote(x)[0]
    else:
        got = compiled(x)[0]
    np.testing.assert_allclose(got, reference(x, q, scale, zp, 32, activations), rtol=1e-5, atol=1e-5)
