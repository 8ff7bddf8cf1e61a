"""How a dequantized weight is written in Relax, and how the weight-only rewrite reads it back.

Dequantizations that Relax has no operator for (blocked integer weights, float8 weights, bf16
weights) are ``call_tir`` calls to small TE kernels. Each such kernel carries the attribute
:data:`ATTR` that says what it computes (``{"kind": "blocked", "axis": a, "block": b}``,
``{"kind": "float8", "format": "float8_e4m3fn"}`` or ``{"kind": "bfloat16"}``), so that a pass can
recognise a dequantized *constant* without parsing TIR: the ONNX converters (:mod:`tvm_lowprec.frontend.converters`) and the post-training
quantizer (:mod:`tvm_lowprec.ptq`) both emit through :func:`emit_blocked_dequantize`, and
:mod:`tvm_lowprec.quant.weight_only` reads them with :func:`dequantized_constant`. Until that pass
(or FoldConstant) replaces them, they compute exactly what ONNX defines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te

from .patterns import constant

ATTR = "lowprec.dequantize"


def block_at(t, index, axis: int, block: int):
    """A blocked parameter (the input's shape, ``axis`` divided into blocks of ``block``) at ``index``."""
    return t[tuple(i // block if d == axis else i for d, i in enumerate(index))]


def emit_blocked_dequantize(bb, x, scale, zero_point, axis: int, block: int):
    """``(x - zero_point) * scale`` per block of ``block`` elements along ``axis``, in the scale's dtype
    (ONNX's blocked DequantizeLinear, opset 21); ``zero_point`` may be None."""
    out_dtype = str(scale.ty.dtype)

    def compute(x, scale, *zp):
        def element(*i):
            v = x[i].astype(out_dtype)
            if zp:
                v = v - block_at(zp[0], i, axis, block).astype(out_dtype)
            return v * block_at(scale, i, axis, block)

        return te.compute(x.shape, element, name="dequantize_blocked")

    attrs = {ATTR: {"kind": "blocked", "axis": int(axis), "block": int(block)}}
    args = [x, scale] + ([zero_point] if zero_point is not None else [])
    return bb.emit_te(compute, *args, primfunc_attrs=attrs, primfunc_name_hint="dequantize_blocked")


def emit_bf16_widen(bb, bits):
    """The float32 values of bf16 ``bits`` (a ``uint16`` tensor): each in a float32's top half, exact.
    How :mod:`tvm_lowprec.ptq` writes a matmul's weights rounded to bfloat16 (``QuantSpec("bfloat16")``)."""

    def compute(bits):
        return te.compute(bits.shape, lambda *i: tvm.tirx.reinterpret(
            "float32", bits[i].astype("uint32") << tvm.tirx.const(16, "uint32")), name="widen_bf16")

    return bb.emit_te(compute, bits, primfunc_attrs={ATTR: {"kind": "bfloat16"}}, primfunc_name_hint="widen_bf16")


@dataclass(frozen=True)
class DequantizedConst:
    """A constant weight and how it is dequantized: ``kind`` ``"blocked"`` (``values`` integers in an
    8-bit carrier, ``scale``/``zero_point`` shaped as the values with ``axis`` divided into blocks of
    ``block``), ``"float8"`` (``values`` the float8 bytes as uint8, ``fmt`` their format,
    ``scale`` per tensor or per ``axis``) or ``"bfloat16"`` (``values`` bf16 bits as uint16, no scale)."""

    kind: str
    values: np.ndarray
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    axis: int
    block: int = 0
    fmt: str | None = None


def dequantized_constant(expr, lookup, mod) -> DequantizedConst | None:
    """``expr`` as a :class:`DequantizedConst` when it is one of the marked dequantize kernels applied
    to constants (``mod``: the module holding the kernels), else None."""
    if isinstance(expr, relax.Var):
        expr = lookup(expr)
    if not isinstance(expr, relax.Call) or not expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return None
    gvar = expr.args[0]
    func = mod[gvar] if isinstance(gvar, tvm.ir.GlobalVar) and gvar in mod.functions else None
    info = func.attrs.get(ATTR) if func is not None and func.attrs is not None else None
    if info is None:
        return None
    kind = str(info["kind"])
    if kind == "float8":
        args = [_float8_argument(a, lookup) for a in expr.args[1].fields]
    else:
        args = [constant(a, lookup) for a in expr.args[1].fields]
    if any(a is None for a in args):
        return None
    values, scale = args[0], args[1] if len(args) > 1 else None
    zero_point = args[2] if len(args) > 2 else None
    return DequantizedConst(kind, values, scale, zero_point, axis=int(info.get("axis", 0)),
                            block=int(info.get("block", 0)), fmt=str(info["format"]) if "format" in info else None)


def _float8_argument(expr, lookup) -> np.ndarray | None:
    """A float8 dequantize's argument as a constant: float8 codes (the importer's ``float8_*`` arrays)
    as their uint8 bytes, and a scale or zero point reshaped by the converter to broadcast (``[1, N]``
    for axis 1 of a 2-D weight) as the ONNX parameter it was (a scalar or ``[N]``)."""
    if isinstance(expr, relax.Var):
        expr = lookup(expr)
    if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.reshape")):
        value = constant(expr.args[0], lookup)
        value = None if value is None else value.reshape(-1) if value.ndim else value
    else:
        value = constant(expr, lookup) if expr is not None else None
    if value is not None and value.dtype.itemsize == 1 and value.dtype.kind not in "iub":
        value = value.view(np.uint8)  # ml_dtypes float8 -> its bytes
    return value
