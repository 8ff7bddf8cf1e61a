"""QDQ models from ONNX Runtime's quantize_static, and QLinearMatMul models, against ONNX Runtime.

Two ONNX Runtime references. With graph optimizations off, ORT executes the QDQ graph as written
(float dequantize/matmul/quantize): our integer kernels must match it to one quantization step,
nearly all exactly. With optimizations on, ORT fuses into its own integer kernels; on AVX2-only
hosts those use the saturating ``vpmaddubsw`` and can be far off for full-range weights, so that
comparison uses ``reduce_range=True`` models (7-bit weights, which ORT's fused path handles).
"""

import re

import numpy as np
import pytest

import tvm_lowprec
from tvm_lowprec.targets.x86 import X86_TARGETS

from models import fp32_linear, qlinear_matmul, quantize_qdq
from reference import assert_within_one_step, for_ort, ort_session, output_scale


CONFIGS = {
    "matmul-add": dict(shape=(8, 64), n=48, op="matmul"),
    "gemm-relu": dict(shape=(8, 64), n=48, op="gemm", act="relu"),
    "gemm-clip-2layer": dict(shape=(5, 40), n=24, op="gemm", act="clip", layers=2),
    "batched-3d": dict(shape=(2, 16, 64), n=32, op="matmul"),
    "batched-4d-gemv": dict(shape=(1, 1, 1, 128), n=64, op="matmul", act="relu"),
    "gemv-gemm": dict(shape=(1, 256), n=64, op="gemm", act="relu"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_quantize_static_model_matches_ort(name, rng):
    cfg = dict(CONFIGS[name])
    shape = cfg.pop("shape")
    fp32 = fp32_linear(shape, **cfg)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    for reduce_range in (False, True):
        qdq = quantize_qdq(fp32, calib, reduce_range=reduce_range)
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
        assert any(k.op == "qgemm" for k in compiled.kernels())
        scale = output_scale(qdq)
        for _ in range(3):
            x = rng.standard_normal(shape).astype(np.float32)
            got = compiled(x=x)[0]
            assert_within_one_step(got, ort_session(qdq, optimized=False).run(None, {"x": x})[0], scale)
            if reduce_range:
                assert_within_one_step(got, ort_session(qdq).run(None, {"x": x})[0], scale)


@pytest.mark.parametrize("a_dtype,b_dtype,per_column", [("uint8", "int8", False), ("uint8", "int8", True), ("int8", "int8", True), ("uint8", "uint8", False)])
@pytest.mark.parametrize("shape", [(1, 64, 48), (37, 100, 70), (64, 256, 96)], ids=lambda s: "x".join(map(str, s)))
def test_qlinear_matmul_matches_onnx_reference_exactly(shape, a_dtype, b_dtype, per_column, rng):
    from onnx.reference import ReferenceEvaluator

    m, k, n = shape
    model = qlinear_matmul(m, k, n, a_dtype=a_dtype, b_dtype=b_dtype, per_column=per_column)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    info = np.iinfo(a_dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
    want = ReferenceEvaluator(model).run(None, {"a": a})[0]
    got = compiled(a)[0]
    np.testing.assert_array_equal(got, want)
    assert 0.02 < (got != np.iinfo(a_dtype).max).mean()  # not all saturated: the test can fail


def test_fixed_point_mode_is_within_one_step(rng):
    model = qlinear_matmul(16, 128, 64)
    a = rng.integers(0, 256, (16, 128)).astype(np.uint8)
    f = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")(a)[0].astype(int)
    q = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", requant_mode="fixed_point")(a)[0].astype(int)
    assert np.abs(f - q).max() <= 1 and (f == q).mean() > 0.99


def _quantize_dynamic(model):
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "dyn.onnx")
        onnx.save(for_ort(model), src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=False)
        return onnx.load(dst)


@pytest.mark.parametrize("shape", [(1, 96), (6, 64), (2, 5, 64)], ids=lambda s: "x".join(map(str, s)))
def test_quantize_dynamic_model_takes_the_kernel_with_a_runtime_zero_point(shape, rng):
    """DynamicQuantizeLinear -> MatMulInteger: the activation zero point is only known at run time."""
    model = _quantize_dynamic(fp32_linear(shape, 40, op="matmul"))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert [k.op for k in compiled.kernels()].count("qgemm") == 1
    for _ in range(3):
        x = (rng.standard_normal(shape) * rng.uniform(0.1, 3)).astype(np.float32)
        got = compiled(x)[0]
        want = ort_session(model, optimized=False).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _nan_mask_model():
    """The attention-mask idiom of exported transformers, quantized as ONNX Runtime writes it:
    ``(1 - mask) * finfo.min`` with finfo.min stored as int8 0 at scale 2.68e36, zero point 127, which
    dequantizes to -inf; where the mask is 1 the product is 0 * -inf = NaN."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.float32(1.0), "one"),
             numpy_helper.from_array(np.array(0, np.uint8), "big_q"), numpy_helper.from_array(np.float32(2.6793887e36), "big_s"),
             numpy_helper.from_array(np.array(127, np.uint8), "big_z"),
             numpy_helper.from_array(np.float32(1.0), "s1"), numpy_helper.from_array(np.array(0, np.uint8), "z0"),
             numpy_helper.from_array(np.float32(0.05), "sx"), numpy_helper.from_array(np.array(122, np.uint8), "zx")]
    nodes = [helper.make_node("Sub", ["one", "mask"], ["inv"]),
             helper.make_node("QuantizeLinear", ["inv", "s1", "z0"], ["inv_q"]),
             helper.make_node("DequantizeLinear", ["inv_q", "s1", "z0"], ["inv_f"]),
             helper.make_node("DequantizeLinear", ["big_q", "big_s", "big_z"], ["big"]),
             helper.make_node("Mul", ["inv_f", "big"], ["bias"]),
             helper.make_node("QuantizeLinear", ["bias", "s1", "z0"], ["bias_q"]),
             helper.make_node("DequantizeLinear", ["bias_q", "s1", "z0"], ["bias_f"]),
             helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "sx", "zx"], ["x_f"]),
             helper.make_node("Add", ["x_f", "bias_f"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "sx", "zx"], ["y_q"])]
    graph = helper.make_graph(nodes, "nan_mask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16]),
                                                  helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y_q", TensorProto.UINT8, [2, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


def test_nan_in_the_attention_mask_quantizes_as_in_onnx_runtime(rng):
    """QuantizeLinear of NaN (which the masked attention above makes where the mask is 1): the lowest
    code, here the zero point 0, i.e. real 0, as ONNX Runtime gives, so the masked add leaves the scores alone. A NaN used to clamp to
    255, and MiniLM quantized with 7-bit weights lost its attention (cosine 0.79 against ORT)."""
    model = _nan_mask_model()
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x = rng.standard_normal((2, 16)).astype(np.float32)
    mask = np.ones((2, 16), np.float32)
    mask[1, 8:] = 0.0
    want = ort_session(model, optimized=False).run(None, {"x": x, "mask": mask})[0]
    got = compiled(x, mask)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], np.clip(np.rint(x[0] / np.float32(0.05)) + 122, 0, 255))  # scores kept


@pytest.mark.parametrize("spec", X86_TARGETS, ids=lambda s: s.name)
def test_the_nan_test_of_a_quantize_stays_in_vector_registers(spec, rng):
    """The NaN -> lowest code test of a quantize after a float operator (a softmax, which can make NaN)
    is integer arithmetic on the float's bits: its vector loop keeps vector registers (``tirx.isnan``
    made TVM scalarize the loop: a scalar compare per element, 5x slower on a DFL softmax); NaN goes to
    the lowest code, whatever the zero point (9 here), +-inf and ordinary values quantize as ONNX Runtime's
    QuantizeLinear (run where the host has the row)."""
    from onnx import TensorProto, helper, numpy_helper

    from tvm_lowprec.targets import host_supports

    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("Div", ["x", "p"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "nan_test", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 64])],
                              [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.array(9, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    asm = compiled.inspect_source("asm")
    assert not re.search(r"\bv?u?comiss\b", asm), "a scalar float compare: the NaN test left vector registers"
    if not host_supports(spec):
        return
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, :8] = np.nan  # NaN / p: NaN
    x[1, :] = -np.inf  # the whole row: softmax NaN
    x[2, 5] = np.inf
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        nan = np.isnan(x / (e / e.sum(axis=-1, keepdims=True)))
    assert nan[0, :8].all() and nan[1].all()
    got, want = compiled(x)[0], ort_session(model, optimized=False).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got[nan], 0)  # NaN: the lowest code, not the zero point 9 (docs/numerics.md)
    np.testing.assert_array_equal(got, want)


def _float_output_qdq(rng, m=3, k=256, n=64, bias=True):
    """x -> Q/DQ (uint8, per tensor) -> MatMul with DQ(int8 weights per column) [-> + bias] -> float output."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {"w": rng.integers(-127, 128, (k, n)).astype(np.int8), "ws": ((rng.random(n) + 0.5) * 0.01).astype(np.float32),
              "wz": np.zeros(n, np.int8), "xs": np.float32(0.02), "xz": np.uint8(128),
              "b": rng.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["mm" if bias else "y"])]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("target", ["native", "x86-avx512-vnni"])
def test_a_layer_whose_output_stays_float_takes_the_integer_gemm(target, rng):
    """DQ -> MatMul (-> + bias) with no QuantizeLinear after it (a graph output, a residual): the integer
    GEMM with a float epilogue, not a float matmul; equal to the ONNX reference up to float32 rounding
    of the reference's own sum."""
    from onnx.reference import ReferenceEvaluator

    model = _float_output_qdq(rng)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=target)
    [gemm] = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert gemm.name.endswith("_float") and gemm.intrinsic.startswith(f"lowprec_{compiled.spec.gemm.name}")
    x = rng.standard_normal((3, 256)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
