"""Benchmark inputs: one quantized GEMM problem per shape and the one-node ONNX models built from it.

All providers of a benchmark point draw their data with :func:`make_problem` from a generator seeded by
the shape, so ORT, torch and tvm-lowprec multiply the same matrices and their outputs can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OPSET = 13
IR_VERSION = 8
A_ZERO_POINT = 128
Y_ZERO_POINT = 128
A_SCALE = 0.02
B_SCALE = 0.01
_HEADROOM = 1.05  # y_scale leaves 5% spare range so that rounding never reaches the uint8 bounds
# Weights are 7-bit ([-64, 63]). ORT's and fbgemm's u8 x s8 kernels on AVX2 hosts (no VNNI) add
# adjacent products with VPMADDUBSW, which saturates at int16: 255*127 + 255*127 overflows, and with
# full-range int8 weights their outputs drift from the exact result (25 steps seen at K=128). With
# 7-bit weights a pair sum stays within 2*255*64 = 32640, so both compute exactly and ORT's output is a
# valid reference for tvm-lowprec. Values do not change the timings.
B_LOW, B_HIGH = -64, 64
DATA_DESCRIPTION = (f"A uint8 uniform [0, 255] (zero point {A_ZERO_POINT}); B int8 uniform [{B_LOW}, {B_HIGH - 1}] "
                    f"(7-bit, zero point 0); y_scale from the largest accumulator, y zero point {Y_ZERO_POINT}")


@dataclass(frozen=True)
class QGemmProblem:
    """``Y = requant((A - a_zp) @ B)`` with ``A`` uint8 ``[M, K]`` and ``B`` int8 ``[K, N]``.

    Attributes
    ----------
    a, b : numpy.ndarray
        Activations (uint8, ``[M, K]``) and weights (int8 in ``[-64, 63]``, ``[K, N]``, zero point 0).
    y_scale : float
        Output scale chosen from the largest accumulator of this very input, so the uint8 output
        uses most of its range and never saturates.
    """

    a: np.ndarray
    b: np.ndarray
    y_scale: float
    a_scale: float = A_SCALE
    b_scale: float = B_SCALE
    a_zero_point: int = A_ZERO_POINT
    y_zero_point: int = Y_ZERO_POINT

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(M, N, K)``."""
        (m, k), n = self.a.shape, self.b.shape[1]
        return m, n, k


def make_problem(m: int, n: int, k: int, rng: np.random.Generator, full_range: bool = False) -> QGemmProblem:
    """Draw uniform uint8 activations and 7-bit int8 weights; pick a non-saturating output scale.

    Parameters
    ----------
    m, n, k : int
        GEMM shape: ``A`` is ``[m, k]``, ``B`` is ``[k, n]``.
    rng : numpy.random.Generator
        Source of the data; the same seed gives the same problem.
    full_range : bool
        Weights uniform over all of int8 (``[-128, 127]``) instead of 7-bit.

    Returns
    -------
    QGemmProblem
    """
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    b = rng.integers(-128 if full_range else B_LOW, 128 if full_range else B_HIGH, size=(k, n), dtype=np.int8)
    acc = (a.astype(np.float32) - A_ZERO_POINT) @ b.astype(np.float32)
    peak = max(float(np.abs(acc).max()), 1.0)
    y_scale = A_SCALE * B_SCALE * peak * _HEADROOM / 127.0
    return QGemmProblem(a=a, b=b, y_scale=float(np.float32(y_scale)))


def _scalar(name: str, value, dtype) -> "onnx.TensorProto":
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def _model(node, problem: QGemmProblem, initializers, out_type: int, name: str):
    from onnx import TensorProto, helper

    m, n, k = problem.shape
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("Y", out_type, [m, n])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def matmulinteger_model(problem: QGemmProblem):
    """One ``MatMulInteger`` node: uint8 ``A`` input, int8 ``B`` initializer, int32 output.

    Returns
    -------
    onnx.ModelProto
    """
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(problem.b, "B"),
        _scalar("a_zero_point", problem.a_zero_point, np.uint8),
        _scalar("b_zero_point", 0, np.int8),
    ]
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zero_point", "b_zero_point"], ["Y"])
    return _model(node, problem, inits, TensorProto.INT32, "matmulinteger")


def qlinearmatmul_model(problem: QGemmProblem):
    """One ``QLinearMatMul`` node: uint8 ``A`` input, int8 ``B`` initializer, uint8 output.

    Returns
    -------
    onnx.ModelProto
    """
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        _scalar("a_scale", problem.a_scale, np.float32),
        _scalar("a_zero_point", problem.a_zero_point, np.uint8),
        numpy_helper.from_array(problem.b, "B"),
        _scalar("b_scale", problem.b_scale, np.float32),
        _scalar("b_zero_point", 0, np.int8),
        _scalar("y_scale", problem.y_scale, np.float32),
        _scalar("y_zero_point", problem.y_zero_point, np.uint8),
    ]
    inputs = ["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
    node = helper.make_node("QLinearMatMul", inputs, ["Y"])
    return _model(node, problem, inits, TensorProto.UINT8, "qlinearmatmul")
