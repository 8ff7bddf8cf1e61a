"""Weight-only emitter for bf16 weights: ``matmul(x_float32, widen_bf16(W_bits const))``, and the call of the
bf16 GEMM that float8 weights share (:func:`emit_bf16_gemm`).

Called by :mod:`tvm_lowprec.quant.weight_only` (phase 1 of :mod:`tvm_lowprec.pipeline`) for a
dequantize marked ``{"kind": "bfloat16"}`` (:func:`tvm_lowprec.quant.dequantized.emit_bf16_widen`): how
:mod:`tvm_lowprec.ptq` writes a layer given ``QuantSpec("bfloat16")``, its weights rounded to bf16.

- Where the target's spec has a bf16 recipe (:attr:`~tvm_lowprec.hwspec.TargetSpec.bf16`), the bf16
  GEMM (:mod:`tvm_lowprec.kernels.bf16_gemm`): activations rounded to bf16, ``vdpbf16ps``.
- Elsewhere (and for what the kernel does not take: a shape that is not static, a GPU row) the matmul
  of ``x`` with the float32 constant of the bf16 values, which the float32 GEMM pass then takes:
  float32 math on bf16-rounded weights. The two differ only by the bf16 rounding of the activations
  (docs/numerics.md).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..kernels import bf16_gemm
from .patterns import static_shape


def call_2d(builder, x, shape, gvar, consts, n: int) -> relax.Expr:
    """``gvar(x as [M, K], *consts) -> [M, N]``, reshaped back to ``x``'s leading axes."""
    m, k = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    x2 = x if len(shape) == 2 else builder.emit(relax.op.reshape(x, (m, k)))
    y = builder.emit(relax.call_tir(gvar, [x2, *consts], relax.TensorType((m, n), "float32")))
    return y if len(shape) == 2 else builder.emit(relax.op.reshape(y, (*shape[:-1], n)))


def emit_bf16_gemm(builder, x, shape, layout: bf16_gemm.Bf16Layout, packed, scale) -> relax.Expr:
    """``x[..., K]`` times the packed bf16 weights of ``layout``, scaled per column (``scale`` padded)."""
    short = {"float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2"}.get(layout.source, layout.source)
    name = f"bf16_gemm_{short}_{layout.m}x{layout.n}x{layout.k}"
    gvar = builder.add_func(bf16_gemm.build_bf16_gemm(layout, name), name)
    return call_2d(builder, x, shape, gvar, [relax.const(packed), relax.const(scale)], layout.n)


def emit_bfloat16(builder, x, dq, spec, config) -> relax.Expr | None:
    """``x[..., K] @ W[K, N]`` with ``W`` the bf16 weights of ``dq``; None (the marked widening stays, a
    float matmul) for a weight that is not ``[K, N]`` uint16 bits."""
    bits = np.asarray(dq.values)
    if bits.dtype != np.uint16 or bits.ndim != 2:
        return None
    k, n = bits.shape
    shape = static_shape(x)
    m = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 0
    if getattr(spec, "device", "cpu") == "cpu" and spec.bf16 is not None and m > 0 and shape[-1] == k:
        layout = bf16_gemm.Bf16Layout.choose("bfloat16", m, n, k, spec.bf16)
        packed = bf16_gemm.pack_bf16_weights(bits, layout)
        return emit_bf16_gemm(builder, x, shape, layout, packed, bf16_gemm.column_scale(1.0, layout))
    return relax.op.matmul(x, relax.const(bf16_gemm.bf16_to_float32(bits)))
