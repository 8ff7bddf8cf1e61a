"""Inputs of the weight-only benchmark (``benchmarks/int4_bench.py``): one GEMV/GEMM problem per shape,
the one-node ``com.microsoft.MatMulNBits`` model and the int8 QDQ model built from it, and numpy
references of both.

The models are written directly with ``onnx.helper`` (ORT's quantizer would take minutes on a
4096x11008 float32 weight, and the values do not change the timings). Layouts follow ORT's contrib
operator (as :mod:`tvm_lowprec.frontend.matmul_nbits` reads them): ``B`` uint8
``[N, k_blocks, block_size / 2]``, two 4-bit values a byte, the first in the low nibble; ``scales``
float32 ``[N * k_blocks]``; ``zero_points`` uint8 ``[N * ceil(k_blocks / 2)]`` packed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OPSET = 21
IR_VERSION = 10
MS_DOMAIN = "com.microsoft"
INT4_DATA = ("x float32 N(0, 1); 4-bit weights uniform [0, 15]; zero points uniform [0, 15] (or none: 8); "
             "scales uniform [0.5, 1.5] / (8 sqrt(K)) per (column, K block)")
INT8_DATA = ("x: the same float32 input; QuantizeLinear uint8 per tensor (scale and zero point from x's min/max); "
             "weights int8 per output channel (axis 1), uniform [-127, 127] (or 7-bit [-64, 63]), symmetric; "
             "output QuantizeLinear uint8 (scale from the reference's largest |y|) + DequantizeLinear to float32")
_Y_HEADROOM = 1.05  # the int8 model's output scale leaves 5% spare range: no saturation


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """``[..., 2j]`` -> low nibble, ``[..., 2j + 1]`` -> high nibble (an odd last axis is padded with 0)."""
    values = np.asarray(values, np.uint8)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


@dataclass(frozen=True)
class NBitsProblem:
    """``y = x @ W`` with ``W[k, n] = (q[n, k] - zp[n, k // block]) * scale[n, k // block]``.

    Attributes
    ----------
    x : numpy.ndarray
        Activations, float32 ``[M, K]``.
    q : numpy.ndarray
        4-bit weights, uint8 values in [0, 15], ``[N, k_blocks * block]`` (K padded to whole blocks).
    scales : numpy.ndarray
        float32 ``[N, k_blocks]``.
    zero_points : numpy.ndarray or None
        uint8 values in [0, 15], ``[N, k_blocks]``; None: no zero-point input (ORT then uses 8).
    block : int
        K block size of the scales and zero points.
    """

    x: np.ndarray
    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    block: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(M, N, K)``."""
        (m, k), n = self.x.shape, self.q.shape[0]
        return m, n, k

    @property
    def k_blocks(self) -> int:
        return self.scales.shape[1]

    def packed_b(self) -> np.ndarray:
        """ORT's ``B``: uint8 ``[N, k_blocks, block / 2]``."""
        n = self.q.shape[0]
        return _pack_nibbles(self.q).reshape(n, self.k_blocks, self.block // 2)

    def packed_zero_points(self) -> np.ndarray | None:
        """ORT's ``zero_points``: uint8 ``[N * ceil(k_blocks / 2)]``, or None."""
        return None if self.zero_points is None else _pack_nibbles(self.zero_points).reshape(-1)

    def weight_bytes(self) -> int:
        """Bytes of the weights as stored: packed 4-bit values, float32 scales, packed zero points."""
        _, n, k = self.shape
        return nbits_weight_bytes(n, k, self.block, self.zero_points is not None)

    def dequantized(self) -> np.ndarray:
        """``W`` float32 ``[K, N]`` exactly as ORT's operator defines it."""
        _, _, k = self.shape
        zp = np.full(self.scales.shape, 8, np.uint8) if self.zero_points is None else self.zero_points
        w = (self.q.astype(np.float32) - zp.repeat(self.block, axis=1)) * self.scales.repeat(self.block, axis=1)
        return np.ascontiguousarray(w[:, :k].T)

    def reference(self) -> np.ndarray:
        """``x @ W`` in float64 (the float providers' reference; int8-activation ones are compared to it too)."""
        return self.x.astype(np.float64) @ self.dequantized().astype(np.float64)


def nbits_weight_bytes(n: int, k: int, block: int, zero_points: bool = True) -> int:
    """Bytes of ``MatMulNBits`` 4-bit weights ``[K, N]``: ``B``, the float32 scales, the packed zero points."""
    k_blocks = -(-k // block)
    return n * k_blocks * block // 2 + 4 * n * k_blocks + (n * -(-k_blocks // 2) if zero_points else 0)


def int8_weight_bytes(n: int, k: int) -> int:
    """Bytes of int8 weights ``[K, N]`` with float32 per-channel scales."""
    return k * n + 4 * n


def make_nbits_problem(m: int, n: int, k: int, block: int, rng: np.random.Generator,
                       zero_points: bool = True) -> NBitsProblem:
    """Draw a :class:`NBitsProblem` (asymmetric with zero points unless ``zero_points=False``).

    Examples
    --------
    >>> p = make_nbits_problem(1, 64, 64, 32, np.random.default_rng(0))
    >>> p.packed_b().shape, p.weight_bytes()
    ((64, 2, 16), 2624)
    """
    if block < 16 or block & (block - 1):
        raise ValueError(f"block size {block} must be a power of 2 of at least 16 (MatMulNBits)")
    k_blocks = -(-k // block)
    x = rng.standard_normal((m, k), dtype=np.float32)
    q = rng.integers(0, 16, size=(n, k_blocks * block), dtype=np.uint8)
    scales = (rng.uniform(0.5, 1.5, size=(n, k_blocks)) / (8.0 * np.sqrt(k))).astype(np.float32)
    zp = rng.integers(0, 16, size=(n, k_blocks), dtype=np.uint8) if zero_points else None
    return NBitsProblem(x=x, q=q, scales=scales, zero_points=zp, block=block)


def matmul_nbits_model(problem: NBitsProblem, accuracy_level: int = 0):
    """One ``com.microsoft.MatMulNBits`` node (bits 4): float32 input ``A`` ``[M, K]``, output ``Y``.

    Returns
    -------
    onnx.ModelProto
    """
    from onnx import TensorProto, helper, numpy_helper

    m, n, k = problem.shape
    inits = [numpy_helper.from_array(problem.packed_b(), "B"),
             numpy_helper.from_array(problem.scales.reshape(-1), "scales")]
    inputs = ["A", "B", "scales"]
    zp = problem.packed_zero_points()
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], name="matmul_nbits", domain=MS_DOMAIN, K=k, N=n, bits=4,
                            block_size=problem.block, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "matmul_nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = IR_VERSION
    return model


# ---------------------------------------------------------------- the int8 QDQ comparison

@dataclass(frozen=True)
class Int8Problem:
    """``y = DQ(Q(DQ(Q(x)) @ DQ(w)))``: uint8 per-tensor activations and output, int8 per-channel weights.

    Attributes
    ----------
    x : numpy.ndarray
        float32 ``[M, K]``.
    w : numpy.ndarray
        int8 ``[K, N]``, zero point 0.
    w_scale : numpy.ndarray
        float32 ``[N]`` (per output channel).
    x_scale, x_zero_point, y_scale, y_zero_point : float, int
        Per-tensor parameters of the uint8 activation and output.
    """

    x: np.ndarray
    w: np.ndarray
    w_scale: np.ndarray
    x_scale: float
    x_zero_point: int
    y_scale: float
    y_zero_point: int = 128

    @property
    def shape(self) -> tuple[int, int, int]:
        (m, k), n = self.x.shape, self.w.shape[1]
        return m, n, k

    def weight_bytes(self) -> int:
        """int8 weights and float32 per-channel scales."""
        _, n, k = self.shape
        return int8_weight_bytes(n, k)

    def reference(self) -> np.ndarray:
        """The model's output by the ONNX definitions (round half to even, saturate), float32."""
        return _qdq_output(_qdq_matmul(self.x, self.w, self.w_scale, self.x_scale, self.x_zero_point),
                           self.y_scale, self.y_zero_point)


def _quantize_u8(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return np.clip(np.rint(x / np.float32(scale)) + zero_point, 0, 255)


def _qdq_matmul(x, w, w_scale, x_scale, x_zero_point) -> np.ndarray:
    """``DQ(Q(x)) @ DQ(w)`` in float64 (the integer products are exact)."""
    acc = (_quantize_u8(x, x_scale, x_zero_point) - x_zero_point) @ w.astype(np.float64)
    return acc * np.float64(np.float32(x_scale)) * w_scale.astype(np.float64)


def _qdq_output(y: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return ((_quantize_u8(y, scale, zero_point) - zero_point) * np.float32(scale)).astype(np.float32)


def make_int8_problem(x: np.ndarray, n: int, rng: np.random.Generator, seven_bit: bool = False) -> Int8Problem:
    """Draw int8 weights for input ``x`` ``[M, K]``; activation parameters from ``x``'s range, the output
    scale from the reference's largest value (so the uint8 output uses its range and never saturates)."""
    k = x.shape[1]
    low, high = (-64, 64) if seven_bit else (-127, 128)
    w = rng.integers(low, high, size=(k, n), dtype=np.int8)
    w_scale = (rng.uniform(0.5, 1.5, size=n) / (127.0 * np.sqrt(k))).astype(np.float32)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    x_scale = float(np.float32(max(hi - lo, 1e-6) / 255.0))
    x_zero_point = int(np.clip(round(-lo / x_scale), 0, 255))
    peak = max(float(np.abs(_qdq_matmul(x, w, w_scale, x_scale, x_zero_point)).max()), 1e-6)
    y_scale = float(np.float32(peak * _Y_HEADROOM / 127.0))
    return Int8Problem(x=x, w=w, w_scale=w_scale, x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale)


def qdq_matmul_model(problem: Int8Problem):
    """``A -> QuantizeLinear -> DequantizeLinear -> MatMul(., DequantizeLinear(W, axis=1)) -> QuantizeLinear
    -> DequantizeLinear -> Y`` (float32 in and out). The output QuantizeLinear is what makes the chain a
    tvm-lowprec integer GEMM (``quant/qdq_to_integer.py`` matches ``quantize(matmul(dq, dq))``); without it
    the MatMul stays a float matmul of dequantized operands.

    Returns
    -------
    onnx.ModelProto
    """
    from onnx import TensorProto, helper, numpy_helper

    m, n, k = problem.shape
    values = {"W": problem.w, "w_scale": problem.w_scale, "w_zero_point": np.zeros(n, np.int8),
              "x_scale": np.float32(problem.x_scale), "x_zero_point": np.uint8(problem.x_zero_point),
              "y_scale": np.float32(problem.y_scale), "y_zero_point": np.uint8(problem.y_zero_point)}
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in values.items()]
    nodes = [
        helper.make_node("QuantizeLinear", ["A", "x_scale", "x_zero_point"], ["A_q"], name="quantize_a"),
        helper.make_node("DequantizeLinear", ["A_q", "x_scale", "x_zero_point"], ["A_dq"], name="dequantize_a"),
        helper.make_node("DequantizeLinear", ["W", "w_scale", "w_zero_point"], ["W_dq"], name="dequantize_w", axis=1),
        helper.make_node("MatMul", ["A_dq", "W_dq"], ["Y_f"], name="matmul"),
        helper.make_node("QuantizeLinear", ["Y_f", "y_scale", "y_zero_point"], ["Y_q"], name="quantize_y"),
        helper.make_node("DequantizeLinear", ["Y_q", "y_scale", "y_zero_point"], ["Y"], name="dequantize_y"),
    ]
    graph = helper.make_graph(nodes, "qdq_matmul", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model
