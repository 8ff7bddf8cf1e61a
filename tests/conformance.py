"""The ONNX backend conformance cases that tvm-lowprec claims (8-bit quantization operators)."""

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
)


def load_cases():
    from onnx.backend.test.case.node import collect_testcases

    by_name = {c.name: c for c in collect_testcases()}
    return [by_name[n] for n in CLAIMED if n in by_name]


def run_case(case, target):
    import tvm_lowprec

    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(case.model), target=target)
    inputs, expected = case.data_sets[0]
    got = compiled(*[np.asarray(x) for x in inputs])
    return got, [np.asarray(e) for e in expected]
