"""Weight-only emitter for float8 weights: ``matmul(x_float32, DequantizeLinear(W_fp8 const, scale))``.

Called by :mod:`tvm_lowprec.quant.weight_only` (phase 1 of :mod:`tvm_lowprec.pipeline`, before
FoldConstant would widen the weights to a float32 constant) for a dequantize marked
``{"kind": "float8"}`` by the ONNX converter. Emits one call to a kernel that keeps the weights
narrow, the scale (per tensor, or per output column) applied once per output:

- where the target's spec has a bf16 recipe (:attr:`~tvm_lowprec.hwspec.TargetSpec.bf16`: the
  AVX-512 VNNI row, on CPUs with AVX512_BF16), the bf16 GEMM (:mod:`tvm_lowprec.kernels.bf16_gemm`):
  the codes widened to bf16 at compile time (exactly), the activations rounded to bf16, products
  summed in float32 by ``vdpbf16ps``;
- elsewhere the float32 kernel (:mod:`tvm_lowprec.kernels.fp8_weights`): the weights kept as bytes and
  widened in registers, float32 activations.

Returns None (the matmul stays float: correct, unscheduled) for what it does not take: a weight
that is not ``[K, N]``, a scale along K, a nonzero float8 zero point, an activation whose shape is
not static, a target without a tile row (GPU rows, 128-bit vectors). e4m3fn NaN codes are refused
with :class:`Float8WeightError`: the kernel's widening reads them as numbers. e5m2's infinities
and NaNs widen exactly and are taken.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..errors import LowPrecError
from ..kernels import bf16_gemm
from ..kernels.fp8_weights import DECODES, Fp8Layout, build_fp8_weights, column_scale, pack_fp8_weights
from .patterns import static_shape
from .weight_bf16 import call_2d, emit_bf16_gemm


class Float8WeightError(LowPrecError, ValueError):
    """A float8 weight the kernel cannot widen exactly (an e4m3fn NaN code)."""


def _refuse_nan(x, dq, fmt: str):
    """Raise when the weight holds a code the format's widening cannot take, naming the layer by its
    activation and weight shape, and the first bad element."""
    bad = np.isin(dq.values, DECODES[fmt].nan_codes)
    if not bad.any():
        return
    k, n = (int(i) for i in np.argwhere(bad)[0])
    raise Float8WeightError(
        f"MatMul of {getattr(x, 'name_hint', 'an activation')!s} {list(static_shape(x) or ())} by a {fmt} weight "
        f"{list(dq.values.shape)}: {int(bad.sum())} weight(s) are NaN (first at [{k}, {n}], byte "
        f"0x{int(dq.values[k, n]):02X}); a NaN weight makes its output columns NaN, so it is refused "
        "rather than compiled: replace it in the model")


def _per_column_scale(dq, n: int) -> np.ndarray | None:
    """The scale per output column, or None when it is not per tensor or per column (axis 1)."""
    scale = np.asarray(dq.scale)
    if str(scale.dtype) != "float32":
        return None
    if scale.size == 1:
        return np.full((n,), scale.reshape(-1)[0], np.float32)
    if scale.ndim == 1 and scale.size == n and dq.axis == 1:
        return scale
    return None


def _zero_point_is_zero(dq) -> bool:
    return dq.zero_point is None or not np.any(np.asarray(dq.zero_point).view(np.uint8) & 0x7F)  # +0 or -0


def emit_float8(builder, x, dq, spec, config) -> relax.Expr | None:
    """``x[..., K] @ W[K, N]`` with ``W`` the float8 weight of ``dq``, or None when not taken.
    ``config`` (:class:`~tvm_lowprec.quant.weight_only.WeightOnlyConfig`) is not consulted: float8
    weights always meet float activations (``activations="int8"`` has no float8 form)."""
    fmt, values = dq.fmt, np.asarray(dq.values)
    if getattr(spec, "device", "cpu") != "cpu" or fmt not in DECODES or values.dtype != np.uint8 or values.ndim != 2:
        return None
    k, n = values.shape
    shape = static_shape(x)
    scale = _per_column_scale(dq, n)
    if shape is None or len(shape) < 1 or shape[-1] != k or scale is None or not _zero_point_is_zero(dq):
        return None
    m = int(np.prod(shape[:-1], dtype=np.int64))
    if m < 1:
        return None
    if spec.bf16 is not None:
        _refuse_nan(x, dq, fmt)
        layout = bf16_gemm.Bf16Layout.choose(fmt, m, n, k, spec.bf16)
        packed = bf16_gemm.pack_bf16_weights(bf16_gemm.float8_to_bf16(values, fmt), layout)
        return emit_bf16_gemm(builder, x, shape, layout, packed, bf16_gemm.column_scale(scale, layout))
    layout = Fp8Layout.choose(fmt, m, n, k, spec.gemm.vector_bits)
    if layout is None:
        return None
    _refuse_nan(x, dq, fmt)
    name = f"fp8_weights_{fmt.removeprefix('float8_')}_{m}x{n}x{k}"
    gvar = builder.add_func(build_fp8_weights(layout, name), name)
    args = [relax.const(pack_fp8_weights(values, layout)), relax.const(column_scale(scale, layout))]
    return call_2d(builder, x, shape, gvar, args, n)
