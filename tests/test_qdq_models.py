"""QDQ models from ONNX Runtime's quantize_static, and QLinearMatMul models, against ONNX Runtime.

Two ONNX Runtime references. With graph optimizations off, ORT executes the QDQ graph as written
(float dequantize/matmul/quantize): our integer kernels must match it to one quantization step,
nearly all exactly. With optimizations on, ORT fuses into its own integer kernels; on AVX2-only
hosts those use the saturating ``vpmaddubsw`` and can be far off for full-range weights, so that
comparison uses ``reduce_range=True`` models (7-bit weights, which ORT's fused path handles).
"""

import numpy as np
import pytest

import tvm_lowprec

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
