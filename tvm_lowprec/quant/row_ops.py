"""Pass: the row operators of a quantized transformer as 8-bit-in, 8-bit-out kernels.

``quantize(softmax(dequantize(x), axis=-1))`` and ``quantize(layer_norm(dequantize(x), gamma, beta,
axes=[-1]))`` with 8-bit ``x``: the graph as written dequantizes to float32, reduces, and quantizes,
reading four bytes per element where one carries the information (and, for layer norm, the residual
add before it writes float32 for it). :mod:`~tvm_lowprec.kernels.qsoftmax` and
:mod:`~tvm_lowprec.kernels.qlayernorm` read the 8-bit tensor instead. Matched only with per-tensor
constant parameters (constant ``gamma``/``beta`` for layer norm), static shapes, and the reduction over
the last axis, or for softmax over any one axis (a YOLO DFL head's bins, axis 1); a ``permute_dims``
between the dequantize and the softmax (the head's bins moved to axis 1) moves the 8-bit codes instead.
Anything else stays as it is.

Runs after :mod:`~tvm_lowprec.quant.fold_qdq` (which leaves the ``dequantize`` beside the operator)
and before :mod:`~tvm_lowprec.quant.lookup_tables`.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..kernels.qlayernorm import MAX_ROW, build_qlayernorm
from ..kernels.qsoftmax import build_qsoftmax
from .patterns import call_of, constant, dtype_of, qparams, static_shape
from .requant import qrange

EIGHT_BIT = ("uint8", "int8")


def _scalar(values) -> float:
    return float(np.asarray(values).reshape(()))


def _last_axis(axes, rank: int) -> bool:
    axes = [int(axes)] if isinstance(axes, int) or hasattr(axes, "value") else [int(a) for a in axes]
    return axes in ([-1], [rank - 1])


def _softmax(builder, core, dq, p_in, out, name_shape):
    """(PrimFunc name stem, PrimFunc, constant arguments) for a softmax along any axis, or None."""
    axis = int(core.attrs.axis) % len(name_shape)
    func = build_qsoftmax(name_shape, dtype_of(dq.args[0]), _scalar(p_in.scale), out.dtype, out.scale, out.zero_point,
                          *out.range, axis=axis)
    return "qsoftmax" if axis == len(name_shape) - 1 else f"qsoftmax_axis{axis}", func, []


def _float_constant(expr, lookup) -> np.ndarray | None:
    """A float constant, or ``dequantize`` of a constant (ONNX Runtime quantizes layer norm's gamma and
    beta too): its values as the dequantize computes them, ``(q - z) * s`` in float32."""
    value = constant(expr, lookup)
    if value is not None:
        return value
    dq = call_of(expr, "dequantize", lookup)
    q = None if dq is None else constant(dq.args[0], lookup)
    p = None if q is None else qparams(dq, lookup, "layer norm parameter dequantize")
    if p is None or not p.per_tensor:
        return None
    return ((q.astype(np.float32) - np.float32(_scalar(p.zero_point))) * np.float32(_scalar(p.scale))).astype(np.float32)


def _layer_norm(builder, core, dq, p_in, out, name_shape):
    lookup = builder.lookup_binding
    gamma, beta = _float_constant(core.args[1], lookup), _float_constant(core.args[2], lookup)
    n = name_shape[-1]
    if gamma is None or beta is None or gamma.size != n or beta.size != n or n > MAX_ROW:
        return None
    if not _last_axis(core.attrs.axes, len(name_shape)) or not (core.attrs.center and core.attrs.scale):
        return None
    func = build_qlayernorm(name_shape, dtype_of(dq.args[0]), _scalar(p_in.scale), int(_scalar(p_in.zero_point)),
                            float(core.attrs.epsilon), out.dtype, out.zero_point, *out.range)
    sy = np.float32(out.scale)  # the kernel takes gamma and beta in output steps (no division per element)
    return "qlayernorm", func, [(np.asarray(gamma, np.float32).reshape(n) / sy).astype(np.float32),
                                (np.asarray(beta, np.float32).reshape(n) / sy).astype(np.float32)]


ROW_OPS = {"nn.softmax": _softmax, "nn.layer_norm": _layer_norm}


class _Output:
    def __init__(self, call, p):
        self.dtype = dtype_of(call)
        self.scale, self.zero_point = _scalar(p.scale), int(_scalar(p.zero_point))
        self.range = qrange(self.dtype)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        new = self._rewrite(call)
        return call if new is None else new

    def _rewrite(self, call):
        if not call.op.same_as(tvm.ir.Op.get("relax.quantize")) or dtype_of(call) not in EIGHT_BIT:
            return None
        for op_name, make in ROW_OPS.items():
            core = call_of(call.args[0], op_name, self.lookup_binding)
            if core is not None:
                break
        else:
            return None
        source, permute = core.args[0], None
        if op_name == "nn.softmax":  # a transposed dequantize (a DFL head's bins moved to axis 1): the
            permute = call_of(source, "permute_dims", self.lookup_binding)  # codes are transposed instead
            source = permute.args[0] if permute is not None else source
        dq = call_of(source, "dequantize", self.lookup_binding)
        shape = static_shape(core)
        if dq is None or shape is None or dtype_of(dq.args[0]) not in EIGHT_BIT:
            return None
        p_in, p_out = qparams(dq, self.lookup_binding, f"{op_name} input"), qparams(call, self.lookup_binding, f"{op_name} output")
        if p_in is None or p_out is None or not (p_in.per_tensor and p_out.per_tensor):
            return None
        made = make(self, core, dq, p_in, _Output(call, p_out), shape)
        if made is None:
            return None
        stem, func, consts = made
        name = f"{stem}_{dtype_of(dq.args[0])[0]}8_{'x'.join(map(str, shape))}"
        gvar = self.builder_.add_func(func.with_attr("global_symbol", name), name)
        self.rewritten += 1
        codes = dq.args[0]
        if permute is not None:
            codes = self.builder_.emit(relax.op.permute_dims(codes, permute.attrs.axes))
        return relax.call_tir(gvar, [codes] + [relax.const(c) for c in consts], relax.TensorType(shape, dtype_of(call)))


def row_ops_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    rewriter = _Rewriter(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()
