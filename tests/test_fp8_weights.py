"""Float8 weights kept as bytes: ``DequantizeLinear(W_fp8 const, scale) -> MatMul(x, W)`` runs as one
kernel (tvm_lowprec.kernels.fp8_weights) that widens the bytes in registers.

Proves: the widening is exact for all 256 codes of both formats, in either byte of a word, (against ml_dtypes and
tvm_lowprec.quant.float8); models match onnx.reference (per-tensor and per-column scales, bias,
GEMV and M = 7, K and N not multiples of the vector); the kernel was used, its decision is on the IR
and the assembly has vcvtph2ps and vfmadd; every x86 row compiles to code in its own vector
registers (ymm, zmm) and gives the same numbers, natively or emulated; what the kernel does not
take stays a correct float matmul; an e4m3fn NaN weight is refused by name.

This is the float32 path. Rows with a bf16 recipe (the AVX-512 VNNI row where the CPU has
AVX512_BF16) run float8 weights on the bf16 GEMM instead (tests/test_bf16.py); here they are compiled
without it (:data:`NATIVE`, :func:`_fp32_path`), so every host tests this kernel.
"""

import dataclasses

import re

import ml_dtypes
import numpy as np
import onnx
import pytest
import tvm
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import te
from tvm.s_tir import Schedule

import tvm_lowprec
from tvm_lowprec.emulation import known_semantics
from tvm_lowprec.kernels.fp8_weights import DECISION_ATTR, DECODES, FP8_TILES, Fp8Layout
from tvm_lowprec.quant.float8 import FORMATS, decode
from tvm_lowprec.schedule.fp8_weights import Fp8WeightsRule
from tvm_lowprec.targets import host_supports, native_target, registered_targets

MDT = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
ONNX_TYPE = {"float8_e4m3fn": onnx.TensorProto.FLOAT8E4M3FN, "float8_e5m2": onnx.TensorProto.FLOAT8E5M2}


WORDS = np.arange(1 << 16, dtype=np.uint16)  # every pair of codes, as the kernel reads them


def _fp32_path(spec):
    """``spec`` without its bf16 recipe: float8 weights take the float32 kernel."""
    return dataclasses.replace(spec, bf16=None) if spec.bf16 is not None else spec


NATIVE = _fp32_path(native_target())  # this host's row, on the float32 path


def _decode_module(fmt):
    """The kernel's widening of the low and the high code of every ``uint16`` word (vectorized by 8,
    as in the kernel), and tvm_lowprec.quant.float8.decode of the same codes."""
    w = te.placeholder((WORDS.size,), "uint16", name="w")

    def ours(high):
        return te.compute(w.shape, lambda i: DECODES[fmt].value(w[i], high), name=f"ours{high}")

    def theirs(high):
        code = lambda i: (w[i] >> tvm.tirx.const(8 * high, "uint16")).astype("uint8")  # noqa: E731
        return te.compute(w.shape, lambda i: decode(code(i), FORMATS[fmt]), name=f"theirs{high}")

    outs = [ours(0), ours(1), theirs(0), theirs(1)]
    sch = Schedule(te.create_prim_func([w, *outs]).with_attr("global_symbol", "dec"))
    for out in outs:
        sch.vectorize(sch.split(sch.get_loops(sch.get_sblock(out.op.name))[0], [None, 8])[1])
    return tvm.compile(sch.mod, target=tvm_lowprec.native_target().tvm_target())


@pytest.mark.parametrize("fmt", list(DECODES))
def test_decode_is_exact_for_every_code_in_both_bytes_of_a_word(fmt):
    ex = _decode_module(fmt)
    outs = [tvm.runtime.tensor(np.zeros(WORDS.size, np.float32)) for _ in range(4)]
    ex["dec"](tvm.runtime.tensor(WORDS), *outs)
    for high, (ours, theirs) in enumerate([(outs[0], outs[2]), (outs[1], outs[3])]):
        codes = (WORDS >> (8 * high)).astype(np.uint8)  # each of the 256 codes beside each of the 256 others
        want = codes.view(MDT[fmt]).astype(np.float32)
        special = np.isin(codes, DECODES[fmt].nan_codes)  # refused at compile time (e4m3fn NaN)
        assert np.isnan(want[special]).all() and special.sum() == 256 * len(DECODES[fmt].nan_codes)
        for got in (ours.numpy(), theirs.numpy()):
            np.testing.assert_array_equal(np.isnan(got[~special]), np.isnan(want[~special]))
            keep = ~special & ~np.isnan(want)  # bit for bit: -0, the subnormals and the infinities included
            np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


# ------------------------------------------------------------------------------ models


def _model(fmt, w_bytes, scale, m_shape, bias=None, zero_point=None, axis=1):
    k, n = w_bytes.shape
    inits = [helper.make_tensor("w", ONNX_TYPE[fmt], [k, n], w_bytes.tobytes(), raw=True),
             numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
    dq_inputs = ["w", "s"]
    if zero_point is not None:
        zp = np.asarray(zero_point, np.uint8)
        inits.append(helper.make_tensor("zp", ONNX_TYPE[fmt], list(zp.shape), zp.tobytes(), raw=True))
        dq_inputs.append("zp")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["wd"], axis=axis),
             helper.make_node("MatMul", ["x", "wd"], ["y" if bias is None else "mm"], name="proj")]
    if bias is not None:
        inits.append(numpy_helper.from_array(np.asarray(bias, np.float32), "b"))
        nodes.append(helper.make_node("Add", ["mm", "b"], ["y"]))
    graph = helper.make_graph(nodes, "fp8_weights", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(m_shape))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [*m_shape[:-1], n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _weights(fmt, k, n, rng):
    w = (rng.standard_normal((k, n)) * 2).astype(MDT[fmt]).view(np.uint8)
    w[0, :4] = [0x01, 0x81, 0x00, 0x80]  # the smallest subnormals, +0 and -0
    return w


def _scale(kind, n):
    return np.float32(0.07) if kind == "tensor" else np.linspace(0.01, 2.0, n).astype(np.float32)


def _check_close(got, want):
    # float32 sums in another order: a few ulps of the sum of |terms|
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def _fp8_kernels(compiled):
    return [k for k in compiled.kernels() if k.op == "fp8_weights"]


def _decisions(compiled):
    return {str(f.attrs[DECISION_ATTR]) for f in compiled._lowered.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and DECISION_ATTR in f.attrs}


CASES = [  # (format, scale, x shape, K, N, bias)
    ("float8_e4m3fn", "tensor", (1, 37), 37, 45, False),
    ("float8_e4m3fn", "channel", (7, 37), 37, 45, True),
    ("float8_e4m3fn", "channel", (1, 64), 64, 48, True),
    ("float8_e4m3fn", "tensor", (7, 64), 64, 48, False),
    ("float8_e5m2", "channel", (1, 37), 37, 45, False),
    ("float8_e5m2", "tensor", (7, 37), 37, 45, True),
    ("float8_e5m2", "tensor", (1, 64), 64, 48, True),
    ("float8_e5m2", "channel", (2, 3, 40), 40, 20, True),  # x with a batch axis: M = 6
]


@pytest.mark.parametrize("fmt, scale, x_shape, k, n, bias", CASES,
                         ids=[f"{c[0][7:]}-{c[1]}-{'x'.join(map(str, c[2]))}x{c[4]}{'-bias' if c[5] else ''}" for c in CASES])
def test_model_matches_onnx_reference(fmt, scale, x_shape, k, n, bias, rng):
    b = (rng.standard_normal(n) * 3).astype(np.float32) if bias else None
    model = _model(fmt, _weights(fmt, k, n, rng), _scale(scale, n), x_shape, bias=b)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=NATIVE)
    x = rng.standard_normal(x_shape).astype(np.float32)
    _check_close(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])
    kernels = _fp8_kernels(compiled)
    assert [k.schedule for k in kernels] == ["default"], compiled.kernels()
    assert _decisions(compiled) == {fmt}
    asm = compiled.inspect_source("asm")
    assert re.search(r"vcvtph2ps\s+%[xy]mm\d+, %[yz]mm\d+", asm)
    assert re.search(r"vfmadd\d+ps\s+[^\n]*%[yz]mm", asm)


def test_weights_stay_one_byte_in_the_kernel(rng):
    model = _model("float8_e4m3fn", _weights("float8_e4m3fn", 64, 48, rng), _scale("channel", 48), (1, 64))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=NATIVE)
    (func,) = [f for f in compiled._lowered.functions.values()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and DECISION_ATTR in f.attrs]
    x, packed, scale, y = func.params  # a 0.27 PrimFunc param is its buffer
    assert [str(b.dtype) for b in (x, packed, scale, y)] == ["float32", "uint16", "float32", "float32"]
    n_padded = int(scale.shape[0])
    assert 2 * int(np.prod([int(d) for d in packed.shape])) == 64 * n_padded  # a byte per weight
    assert not [k for k in compiled.kernels() if "dequantize" in k.name]  # nothing widens them first


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's inf - inf
def test_e5m2_infinities_and_nan_weights_are_exact(rng):
    """e5m2 widens to float16 bit for bit, infinities and NaN included: nothing to refuse."""
    w = _weights("float8_e5m2", 24, 16, rng)
    w[3, 2], w[5, 7], w[9, 7], w[1, 11] = 0x7C, 0xFC, 0x7C, 0x7E  # +inf, -inf, +inf (NaN sum), NaN
    model = _model("float8_e5m2", w, _scale("channel", 16), (3, 24))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=NATIVE)
    assert _fp8_kernels(compiled)
    x = rng.standard_normal((3, 24)).astype(np.float32) + 0.5
    got, want = compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want[:, 7]).all() and np.isnan(want[:, 11]).all() and np.isinf(want[:, 2]).all()
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    _check_close(got[finite], want[finite])


def test_e4m3fn_nan_weight_is_refused_by_name(rng):
    w = _weights("float8_e4m3fn", 32, 16, rng)
    w[5, 9] = 0xFF
    model = _model("float8_e4m3fn", w, _scale("tensor", 16), (2, 32))
    with pytest.raises(tvm_lowprec.LowPrecError, match=r"float8_e4m3fn weight \[32, 16\]: 1 weight\(s\) are NaN "
                                                       r"\(first at \[5, 9\], byte 0xFF\)"):
        tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")  # either path refuses it


@pytest.mark.parametrize("case", ["zero_point", "scale_along_k"])
def test_what_the_kernel_declines_stays_a_correct_float_matmul(case, rng):
    fmt, k, n = "float8_e4m3fn", 24, 16
    w = _weights(fmt, k, n, rng)
    if case == "zero_point":  # a nonzero float8 zero point: not this kernel
        model = _model(fmt, w, _scale("tensor", n), (2, k), zero_point=np.array(0x38, np.uint8))
    else:  # a scale per row of W (along K) cannot be applied after the sum
        model = _model(fmt, w, np.linspace(0.1, 1, k).astype(np.float32), (2, k), axis=0)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=NATIVE)
    assert not _fp8_kernels(compiled) and not [k for k in compiled.kernels() if k.op == "bf16_gemm"]
    x = rng.standard_normal((2, k)).astype(np.float32)
    if case == "zero_point":  # onnx.reference refuses it; the converter subtracts it (float8 values)
        values = w.view(MDT[fmt]).astype(np.float32) - np.array(0x38, np.uint8).view(MDT[fmt]).astype(np.float32)
        want = x @ (values * _scale("tensor", n))
    else:
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    _check_close(compiled(x)[0], want)


ROWS = [_fp32_path(s) for s in registered_targets("cpu").values() if s.gemm.vector_bits in {t.vector_bits for t in FP8_TILES}]
REGISTER = {256: "ymm", 512: "zmm"}


@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.name)
def test_every_row_widens_in_its_vector_registers(spec, rng):
    """Each x86 row with a tile table, built for the row (its vector registers in the inspected
    assembly), then run as a user runs it: natively where this host has the row's instructions, else
    emulated (the one target intrinsic the build may call, AVX-512's 16-lane vcvtph2ps, is among the
    semantics emulation knows)."""
    fmt, reg = "float8_e4m3fn", REGISTER[spec.gemm.vector_bits]
    model = _model(fmt, _weights(fmt, 40, 70, rng), _scale("channel", 70), (7, 40), bias=np.ones(70, np.float32))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    assert compiled.execution == ("native" if host_supports(spec) else "emulated")
    asm = compiled.inspect_source("asm")
    assert re.search(rf"vcvtph2ps\s+%[xy]mm\d+, %{reg}\d+", asm)
    assert re.search(rf"vfmadd\d+ps\s+[^\n]*%{reg}\d+, %{reg}\d+", asm)
    assert _decisions(compiled) == {fmt}
    x = rng.standard_normal((7, 40)).astype(np.float32)
    if compiled.emulation is not None:
        assert set(compiled.emulation.replaced) <= set(known_semantics())
    _check_close(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


# ------------------------------------------------------------------------------ the decision and the rule


@pytest.mark.parametrize("bits", sorted({t.vector_bits for t in FP8_TILES}))
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (7, 45, 37), (16, 4096, 1024), (64, 20, 6)])
def test_layout_pads_little_and_fits_the_tile_table(bits, m, n, k):
    lay = Fp8Layout.choose("float8_e5m2", m, n, k, bits)
    tile = max((t for t in FP8_TILES if t.vector_bits == bits and t.min_m <= m), key=lambda t: t.min_m)
    assert lay.lanes == bits // 32 and lay.mr <= tile.mr and lay.nr <= tile.nr
    assert -(-m // lay.mr) == -(-m // min(tile.mr, m))  # as few row tiles as the table's tile gives
    assert lay.mp - m < lay.mr and lay.np_ - n < lay.panel and k % lay.k_unroll == 0
    assert Fp8Layout.choose("float8_e5m2", m, n, k, 128) is None  # no rows for 128-bit vectors: declined


def test_rule_declines_other_kernels():
    x = te.placeholder((8, 8), "float32", name="x")
    y = te.compute((8, 8), lambda i, j: x[i, j] * 2, name="y")
    func = te.create_prim_func([x, y])
    assert Fp8WeightsRule().apply(func, tvm_lowprec.native_target()) is None
