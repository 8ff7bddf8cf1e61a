"""The ONNX backend conformance cases that tvm-lowprec claims: all 45 quantization cases that ``onnx``
ships (QLinearMatMul/Conv, MatMul/ConvInteger, Q/DQ in every type, blocked, DynamicQuantizeLinear)."""

from __future__ import annotations

import numpy as np

CLAIMED = (
    "test_qlinearmatmul_2D_uint8_float32",
    "test_qlinearmatmul_3D_uint8_float32",
    "test_qlinearmatmul_2D_uint8_float16",
    "test_qlinearmatmul_3D_uint8_float16",
    "test_qlinearmatmul_2D_int8_float32",
    "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_2D_int8_float16",
    "test_qlinearmatmul_3D_int8_float16",
    "test_matmulinteger",
    "test_qlinearconv",
    "test_convinteger_without_padding",
    "test_convinteger_with_padding",
    "test_quantizelinear",
    "test_quantizelinear_axis",
    "test_dequantizelinear",
    "test_dequantizelinear_axis",
    "test_dynamicquantizelinear",
    "test_dynamicquantizelinear_max_adjusted",
    "test_dynamicquantizelinear_min_adjusted",
    # 16-bit Q/DQ (TVM's own converters)
    "test_quantizelinear_int16",
    "test_quantizelinear_uint16",
    "test_dequantizelinear_int16",
    "test_dequantizelinear_uint16",
    # float8 (tvm_lowprec.quant.float8: the formats' own rounding and saturation)
    "test_quantizelinear_e4m3fn",
    "test_quantizelinear_e5m2",
    "test_dequantizelinear_e4m3fn",
    "test_dequantizelinear_e4m3fn_float16",
    "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2",
    # 4- and 2-bit integers (tvm_lowprec.frontend.narrow_types: 8-bit carriers, the narrow range enforced)
    "test_quantizelinear_int4",
    "test_quantizelinear_uint4",
    "test_quantizelinear_int2",
    "test_quantizelinear_uint2",
    "test_dequantizelinear_int4",
    "test_dequantizelinear_uint4",
    "test_dequantizelinear_int2",
    "test_dequantizelinear_uint2",
    # float4 e2m1 (carried as float8 e4m3fn; QuantizeLinear rounds to the float4 grid)
    "test_quantizelinear_float4e2m1",
    "test_dequantizelinear_float4e2m1",
    # blocked quantization (block_size, opset 21)
    "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_blocked_symmetric",
    "test_dequantizelinear_blocked",
    # DynamicQuantizeLinear as its function body (ReduceMin/Max, Div, Round, Clip, Cast)
    "test_dynamicquantizelinear_expanded",
    "test_dynamicquantizelinear_max_adjusted_expanded",
    "test_dynamicquantizelinear_min_adjusted_expanded",
)


def load_cases():
    from onnx.backend.test.case.node import collect_testcases

    by_name = {c.name: c for c in collect_testcases()}
    return [_as_numpy(by_name[n]) for n in CLAIMED if n in by_name]


def _as_numpy(case):
    """The case with its data as numpy arrays: float8 tensors come as TensorProto (ml_dtypes arrays
    once converted)."""
    import dataclasses

    import onnx
    from onnx import numpy_helper

    def convert(values):
        return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in values]

    return dataclasses.replace(case, data_sets=[(convert(i), convert(o)) for i, o in case.data_sets])


def run_case(case, target):
    import tvm_lowprec

    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(case.model), target=target)
    inputs, expected = case.data_sets[0]
    got = compiled(*[np.asarray(x) for x in inputs])
    return got, [np.asarray(e) for e in expected]
