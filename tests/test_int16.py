"""16-bit activations (int16/uint16 Q/DQ) times 8-bit weights: the int16 x int8 GEMM (kernels/qgemm16).

Kernels: exact against numpy int64 for int16 and uint16 activations with nonzero zero points, K that
fits one int32 accumulator and K that needs int32 chunks summed in int64, worst-case operands; the
row's instruction in the assembly; executed natively where this host has the row, emulated elsewhere.
Models: QDQ MatMul, Gemm and Conv with 16-bit activations compiled for this host equal
``onnx.reference`` bit for bit (integer outputs) and run on the kernel; rows without an int16 recipe,
and layers it does not cover, stay on the float path.
"""

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec.kernels.qgemm import Epilogue, pack_weights
from tvm_lowprec.kernels.qgemm16 import (A_REACH, QGemm16Problem, build_qgemm16, choose_layout, plan_accumulation,
                                         qgemm16_params)
from tvm_lowprec.quant.qdq_to_integer import rewrite_module
from tvm_lowprec.quant.requant import requantize_ref
from tvm_lowprec.schedule import schedule_func

from conftest import TARGETS, kernel_module

INT16_ROWS = [t for t in TARGETS if t.int16 is not None]
ONNX_TYPES = {"int16": TensorProto.INT16, "uint16": TensorProto.UINT16, "int8": TensorProto.INT8,
              "uint8": TensorProto.UINT8}


# ---------------------------------------------------------------------------------------- kernels


def _plan_and_build(spec, m, a_dtype, b, za, zb, bias, ep):
    k, n = b.shape
    plan = plan_accumulation(b, za, zb, a_dtype, bias, spec.int16.intrin.kstep)
    problem = QGemm16Problem(m, n, k, a_dtype, ep, plan.chunk, plan.acc, plan.rowcoef is not None)
    layout = choose_layout(problem, spec.int16)
    sch = schedule_func(build_qgemm16(problem, layout), spec)
    assert sch is not None
    return plan, problem, layout, tvm.compile(sch.mod, target=spec.tvm_target(2))


def run_kernel(spec, a, b, za, zb, bias, mult, ep, emulate=False):
    """(kernel output, numpy int64 reference, plan, asm)."""
    m, n = a.shape[0], b.shape[1]
    plan, problem, layout, ex = _plan_and_build(spec, m, str(a.dtype), b, za, zb, bias, ep)
    params = qgemm16_params(problem, layout, plan, mult)
    args = [tvm.runtime.tensor(x) for x in [a, pack_weights(plan.b_signed, layout), *params, np.zeros((m, n), ep.out_dtype)]]
    kernel_module(ex.mod, spec, emulate)["qgemm16"](*args)
    acc = (a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(zb, np.int64)) + np.asarray(bias, np.int64)
    want = requantize_ref(acc, mult, ep.zero_point, ep.out_dtype, ep.qmin, ep.qmax)
    return args[-1].numpy(), want, plan, ex.mod.inspect_source("asm")


def _operands(rng, m, n, k, a_dtype):
    info = np.iinfo(a_dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    a[0], b[:, 0] = info.min, -128  # the largest products, |a'| = 32768 times -128
    return a, b


def _mult(rng, n, k, out_dtype):
    """Multipliers that spread the outputs over the output range, few clamped: about 3 standard
    deviations of the accumulator (uniform operands: 18900 and 74) to half the range."""
    info = np.iinfo(out_dtype)
    std = 18900 * 74 * np.sqrt(k)
    return (rng.uniform(0.5, 1.0, n) * (info.max - info.min) / 2 / (3 * std)).astype(np.float32)


def _middle(dtype) -> int:
    info = np.iinfo(dtype)
    return (int(info.min) + int(info.max) + 1) // 2 + 3


# (M, N, K), activation dtype and zero point, weight zero point, output dtype, the accumulator the plan picks
KERNEL_CASES = [
    ((7, 40, 36), "int16", -5, 0, "int16", "int32"),
    ((3, 17, 5), "uint16", 65535, "per-channel", "uint16", "int32"),  # odd sizes, the row-sum term
    ((1, 64, 4096), "int16", 300, 0, "int8", "int64"),  # GEMV, K in chunks
    ((16, 48, 4096), "uint16", 33000, 0, "int16", "int64"),
    ((5, 24, 1000), "uint16", 7, "per-channel", "uint8", "int64"),  # chunks and the row-sum term
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: f"{c[1]}-{'x'.join(map(str, c[0]))}-{c[5]}")
def test_kernel_is_exact(case, rng):
    (m, n, k), a_dtype, za, zb, out_dtype, acc = case
    spec = next(t for t in INT16_ROWS if t.name == "x86-avx2")
    a, b = _operands(rng, m, n, k, a_dtype)
    zb = rng.integers(-4, 5, n) if zb == "per-channel" else zb
    bias = rng.integers(-(10**6), 10**6, n)
    ep = Epilogue("requant", out_dtype, zero_point=_middle(out_dtype))
    got, want, plan, _ = run_kernel(spec, a, b, za, zb, bias, _mult(rng, n, k, out_dtype), ep)
    assert plan.acc == acc
    if acc == "int64":
        assert plan.chunk < k and plan.chunk % 2 == 0
    np.testing.assert_array_equal(got, want)
    info = np.iinfo(out_dtype)
    assert ((got > info.min) & (got < info.max)).mean() > 0.5  # not saturated: the test can fail


def _mnemonic(recipe) -> str:
    return recipe.intrin.name.split("_")[0]


@pytest.mark.parametrize("spec", INT16_ROWS, ids=lambda t: t.name)
def test_every_x86_row_emits_its_instruction_and_is_exact(spec, rng):
    """Each row's recipe in the assembly (vpmaddwd; vpdpwssd on the VNNI rows), on the row's vector
    registers, never vpmaddubsw; K in chunks; natively or emulated, equal to numpy."""
    a, b = _operands(rng, 9, 40, 2048, "uint16")
    ep = Epilogue("requant", "int16", zero_point=-7)
    got, want, plan, asm = run_kernel(spec, a, b, 40000, 0, np.zeros(40, np.int64), _mult(rng, 40, 2048, "int16"), ep)
    np.testing.assert_array_equal(got, want)
    assert plan.acc == "int64"
    register = "zmm" if spec.int16.intrin.vector_bits == 512 else "ymm"
    # on an AVX-VNNI row LLVM may fuse vpmaddwd + vpaddd into {vex} vpdpwssd (the same wrapping sum)
    names = _mnemonic(spec.int16) + ("|vpdpwssd" if "avxvnni" in spec.features else "")
    assert re.search(rf"\b({names})\t[^\n]*%{register}", asm), f"{spec.name}: no {names} {register}"
    assert "vpmaddubsw" not in asm


def test_worst_case_operands_would_overflow_int32_and_are_exact():
    """Every product at its largest (-32768 x -128 = 2**22), K = 4096: the sum is 2**34, eight times
    what int32 holds; the plan chunks K and the result is exact."""
    spec = next(t for t in INT16_ROWS if t.name == "x86-avx2")
    k, n = 4096, 16
    a = np.zeros((2, k), np.uint16)  # uint16 0 is -32768 after the shift
    a[1] = 65535
    b = np.full((k, n), -128, np.int8)
    ep = Epilogue("requant", "int16")
    mult = np.full(n, 2.0**-20, np.float32)  # 2**34 * 2**-20 = 16384: inside int16, exactly
    got, want, plan, _ = run_kernel(spec, a, b, 32768, 0, np.zeros(n, np.int64), mult, ep)
    assert plan.acc == "int64" and plan.bound >= 2**34
    np.testing.assert_array_equal(got, want)
    assert (got[0] == 16384).all() and (got[1] == round(-32767 * 128 * k * 2.0**-20)).all()


def test_plan_bounds_every_chunk_and_keeps_int32_where_it_fits(rng):
    full = rng.integers(-128, 128, (4096, 32)).astype(np.int8)
    plan = plan_accumulation(full, 0, 0, "int16")
    chunks = -(-4096 // plan.chunk)
    padded = np.zeros((chunks * plan.chunk, 32), np.int64)
    padded[:4096] = np.abs(full.astype(np.int64))
    assert A_REACH * padded.reshape(chunks, plan.chunk, 32).sum(axis=1).max() < 2**31  # each chunk fits
    assert plan.chunk > 510  # |w| is about 64 on average: longer chunks than with 511 weights of -128
    worst = plan_accumulation(np.full((4096, 4), -128, np.int8), 0, 0, "int16")
    assert (worst.acc, worst.chunk) == ("int64", 456)  # 511 weights of -128 fit: 9 balanced chunks
    small = rng.integers(-3, 4, (4096, 32)).astype(np.int8)  # 3 * 4096 * 32768 < 2**31
    assert plan_accumulation(small, 0, 0, "int16").acc == "int32"
    assert plan_accumulation(small, 0, 0, "int16", bias=np.full(32, 2**31)).acc == "int64"  # the bias too
    with pytest.raises(ValueError, match="float64"):
        plan_accumulation(small, 0, 0, "int16", bias=np.full(32, 2**53))


# ---------------------------------------------------------------------------------------- models


def _qdq_model(op, a_dtype, out_dtype, x_shape, n, rng, *, x_reach, w_reach, zw=False, bias=False, relu=False,
               per_tensor=False):
    """``xq`` (16-bit input) -> DequantizeLinear -> MatMul / Gemm / Conv 3x3 with DequantizeLinear(int8 W,
    per output channel or per tensor) [+ bias] [-> Relu] -> QuantizeLinear -> ``yq`` (integer output). Scales are powers
    of two and ``x_reach * w_reach * K < 2**24``, so that ``onnx.reference``'s float32 arithmetic is
    exact: it then is the ONNX definition, which the integer kernel must equal bit for bit."""
    info = np.iinfo(a_dtype)
    zx = int(rng.integers(info.min + x_reach, info.max - x_reach + 1)) if x_reach < info.max else int(info.min // 2 + 5)
    conv = op == "conv"
    k = x_shape[1] * 9 if conv else x_shape[-1]
    w_shape = (n, x_shape[1], 3, 3) if conv else (n, k) if op == "gemm" else (k, n)
    zw_v = rng.integers(-3, 4, n).astype(np.int8) if zw else np.zeros(n, np.int8)
    zw_b = zw_v.reshape((-1,) + (1,) * (len(w_shape) - 1)) if op != "matmul" else zw_v
    w = np.clip(rng.integers(-w_reach, w_reach + 1, w_shape) + zw_b, -128, 127).astype(np.int8)
    sx, sw = np.float32(2.0**-10), (2.0 ** -rng.integers(5, 9, 1 if per_tensor else n)).astype(np.float32)
    spread = x_reach * w_reach * np.sqrt(k) / 2  # about the accumulator's spread
    out = np.iinfo(out_dtype)
    sy = np.float32(2.0 ** np.ceil(np.log2(spread * sx * sw.max() / (out.max - out.min) * 4)))
    zy = int((out.min + out.max + 1) // 2 // 3)
    consts = {"sx": sx, "zx": np.array(zx, a_dtype), "W": w, "sw": sw.reshape(()) if per_tensor else sw,
              "zw": np.array(0, np.int8) if per_tensor else zw_v, "sy": sy, "zy": np.array(zy, out_dtype)}
    nodes = [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["W", "sw", "zw"], ["wf"], axis=1 if op == "matmul" else 0)]
    inputs = ["xf", "wf"]
    if bias:  # a float bias that is a whole number of accumulator units
        consts["B"] = (rng.integers(-(2**20), 2**20, n) * (sx * sw)).astype(np.float32)
        inputs.append("B")
    core = {"matmul": ("MatMul", {}), "gemm": ("Gemm", {"transB": 1}), "conv": ("Conv", {"pads": [1, 1, 1, 1]})}[op]
    nodes.append(helper.make_node(core[0], inputs if op != "matmul" else inputs[:2], ["h"], **core[1]))
    h = "h"
    if bias and op == "matmul":
        nodes.append(helper.make_node("Add", ["h", "B"], ["hb"]))
        h = "hb"
    if relu:
        nodes.append(helper.make_node("Relu", [h], ["hr"]))
        h = "hr"
    nodes.append(helper.make_node("QuantizeLinear", [h, "sy", "zy"], ["yq"]))
    graph = helper.make_graph(nodes, "qdq16", [helper.make_tensor_value_info("xq", ONNX_TYPES[a_dtype], list(x_shape))],
                              [helper.make_tensor_value_info("yq", ONNX_TYPES[out_dtype], None)],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, zx


def _input(rng, shape, a_dtype, zx, reach):
    info = np.iinfo(a_dtype)
    return rng.integers(max(info.min, zx - reach), min(info.max, zx + reach) + 1, shape).astype(a_dtype)


def _int16_kernels(compiled):
    return [k for k in compiled.kernels() if k.op == "qgemm16"]


# (op, activation, output, input shape, N, largest |x - zx|, largest |w - zw|, options)
MODELS = {
    "matmul-int16": ("matmul", "int16", "int16", (5, 64), 24, 32768, 3, {"per_tensor": True}),  # full-range activations
    "matmul-uint16-zw": ("matmul", "uint16", "uint16", (2, 3, 64), 40, 1200, 127, {"zw": True}),  # full-range weights
    "gemm-uint16-bias-relu": ("gemm", "uint16", "uint8", (4, 48), 32, 65535, 2, {"bias": True, "relu": True}),
    "conv-int16": ("conv", "int16", "int16", (1, 8, 6, 6), 16, 1500, 127, {"bias": True}),
    "conv-uint16-int8": ("conv", "uint16", "int8", (1, 4, 5, 7), 8, 65535, 3, {}),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_qdq_model_equals_onnx_reference_bit_for_bit(name, rng):
    op, a_dtype, out_dtype, shape, n, x_reach, w_reach, options = MODELS[name]
    model, zx = _qdq_model(op, a_dtype, out_dtype, shape, n, rng, x_reach=x_reach, w_reach=w_reach, **options)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (kernel,) = _int16_kernels(compiled)
    operand = compiled.spec.int16.intrin.operand("int8")  # (the int16 operand: 8-bit rows widen to it too)
    assert kernel.intrinsic in (operand.intrin, operand.intrin_wide_b)
    for _ in range(2):
        x = _input(rng, shape, a_dtype, zx, x_reach)
        want = ReferenceEvaluator(model).run(None, {"xq": x})[0]
        got = compiled(x)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        info = np.iinfo(out_dtype)
        assert ((got > info.min) & (got < info.max)).mean() > 0.3  # not all clamped: the test can fail


def test_full_range_k4096_model_takes_int64_chunks_and_is_exact(rng):
    """Full-range uint16 activations and int8 weights at K = 4096: the kernel accumulates int32 chunks in
    int64. It equals the exact integer definition (numpy int64, requantized as ONNX's QLinearMatMul
    does); ``onnx.reference`` sums in float32 here, inexact past 2**24, so it is within one step."""
    model, zx = _qdq_model("matmul", "uint16", "int16", (3, 4096), 32, rng, x_reach=65535, w_reach=127)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (kernel,) = _int16_kernels(compiled)
    assert kernel.name.endswith("_int64")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = _input(rng, (3, 4096), "uint16", zx, 65535)
    acc = (x.astype(np.int64) - zx) @ inits["W"].astype(np.int64)
    mult = (np.float32(inits["sx"]) * inits["sw"]).astype(np.float32) / inits["sy"]
    exact = requantize_ref(acc, mult, int(inits["zy"]), "int16")
    got = compiled(x)[0]
    np.testing.assert_array_equal(got, exact)
    steps = np.abs(got.astype(int) - ReferenceEvaluator(model).run(None, {"xq": x})[0].astype(int))
    assert steps.max() <= 1 and (steps == 0).mean() > 0.95


def test_emulated_vnni_row_runs_vpdpwssd_exactly(rng):
    """x86-avx512-vnni: vpdpwssd zmm, run emulated on hosts without it (natively where present)."""
    model, zx = _qdq_model("matmul", "int16", "int16", (4, 64), 32, rng, x_reach=32768, w_reach=3)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="x86-avx512-vnni")
    (kernel,) = _int16_kernels(compiled)
    assert kernel.intrinsic.startswith("lowprec_vpdpwssd_zmm")
    x = _input(rng, (4, 64), "int16", zx, 32768)
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"xq": x})[0])


def test_onnx_runtime_int16_export_takes_the_kernel(rng):
    """ONNX Runtime's quantize_static with QUInt16 activations (opset 21: int32 bias, per-channel
    weights): the kernel runs it, within one step of ORT executing the graph as written."""
    from onnxruntime.quantization import QuantType

    from models import fp32_linear, quantize_qdq
    from reference import assert_within_one_step, ort_session, output_scale

    fp32 = fp32_linear((8, 64), 48, op="gemm", act="relu")
    calib = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(4)]
    qdq = quantize_qdq(fp32, calib, activation_type=QuantType.QUInt16)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    assert len(_int16_kernels(compiled)) == 1
    x = rng.standard_normal((8, 64)).astype(np.float32)
    assert_within_one_step(compiled(x)[0], ort_session(qdq, optimized=False).run(None, {"x": x})[0], output_scale(qdq))


def _rewritten_names(model, target) -> list[str]:
    spec = tvm_lowprec.resolve_target(target)
    mod = rewrite_module(tvm_lowprec.from_onnx(model), spec)
    return [g.name_hint for g in mod.functions if g.name_hint.startswith(("qgemm16", "qconv2d16"))]


def test_declines_where_it_does_not_apply(rng):
    """Arm rows (no int16 recipe: ``TargetSpec.int16`` is None) and GPU rows keep the float path, as do
    a 16-bit matmul whose weights are a runtime tensor and a depthwise convolution."""
    model, _ = _qdq_model("matmul", "int16", "int16", (4, 64), 16, rng, x_reach=1000, w_reach=3)
    assert _rewritten_names(model, "x86-avx2") == ["qgemm16_int16_4x16x64_int32"]
    for target in ("arm64-dotprod", "arm64-i8mm", "arm64-neon", "cuda-sm80"):
        assert _rewritten_names(model, target) == []
    runtime_w = helper.make_model(helper.make_graph(
        [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
         helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wf"]),
         helper.make_node("MatMul", ["xf", "wf"], ["h"]), helper.make_node("QuantizeLinear", ["h", "s", "z"], ["yq"])],
        "rt", [helper.make_tensor_value_info("xq", TensorProto.INT16, [4, 8]),
               helper.make_tensor_value_info("wq", TensorProto.INT16, [8, 4])],
        [helper.make_tensor_value_info("yq", TensorProto.INT16, None)],
        [numpy_helper.from_array(np.float32(0.5), "s"), numpy_helper.from_array(np.array(0, np.int16), "z")]),
        opset_imports=[helper.make_opsetid("", 21)])
    assert _rewritten_names(runtime_w, "x86-avx2") == []
    depthwise = helper.make_model(helper.make_graph(
        [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
         helper.make_node("DequantizeLinear", ["W", "s", "z8"], ["wf"]),
         helper.make_node("Conv", ["xf", "wf"], ["h"], group=4, pads=[1, 1, 1, 1]),
         helper.make_node("QuantizeLinear", ["h", "s", "z"], ["yq"])],
        "dw", [helper.make_tensor_value_info("xq", TensorProto.INT16, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("yq", TensorProto.INT16, None)],
        [numpy_helper.from_array(np.float32(0.5), "s"), numpy_helper.from_array(np.array(0, np.int16), "z"),
         numpy_helper.from_array(np.array(0, np.int8), "z8"),
         numpy_helper.from_array(rng.integers(-5, 6, (4, 1, 3, 3)).astype(np.int8), "W")]),
        opset_imports=[helper.make_opsetid("", 21)])
    assert _rewritten_names(depthwise, "x86-avx2") == []
