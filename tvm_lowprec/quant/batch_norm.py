"""Pass: an inference batch normalization with constant statistics becomes ``x * a + b``.

``batch_norm(x, gamma, beta, mean, var)`` (``training=False``) is, per channel ``c`` of its axis,
``x * a[c] + b[c]`` with ``a = (1 / sqrt(var + eps)) * gamma`` and ``b = beta - mean * a``: ONNX
Runtime's CPU ``BatchNormalization``, rounding for rounding (its scale and bias folded once, in float32).
A batch norm on activations (MobileOne's identity branches, any BN not folded into a convolution)
is then two element-wise operators with constants shaped ``[1, C, 1, 1]``, which
:mod:`~tvm_lowprec.quant.propagate_layout` moves past like any other: the block stays NHWC between
its convolutions instead of transposing back to NCHW for the normalization and forward again for
every consumer, and the fused kernel multiplies and adds instead of a square root and a division per
element. Runs before the layout pass. The parameters may be constants or dequantized
constants (ONNX Runtime's QDQ quantizer writes BN weights as int8 and biases as int32 under a
DequantizeLinear). A batch norm whose parameters are neither, or in training mode, is left as it is.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .patterns import call_of, constant, dtype_of, mutate_relax_functions, qparams, static_shape


def _value(expr, lookup) -> np.ndarray | None:
    """A 1-D parameter's float32 value: a constant, or a dequantize of one (``(q - z) * s`` as ONNX's
    DequantizeLinear computes it), else None."""
    value = constant(expr, lookup)
    if value is not None:
        return np.asarray(value, np.float32).reshape(-1)
    dq = call_of(expr, "dequantize", lookup)
    q = constant(dq.args[0], lookup) if dq is not None else None
    p = qparams(dq, lookup, "batch norm parameter dequantize") if q is not None and q.ndim <= 1 else None
    if p is None:
        return None
    return ((q.astype(np.int64) - p.zero_point.astype(np.int64)).astype(np.float32) * p.scale).reshape(-1)


@relax.expr_functor.mutator
class _Affine(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.batch_norm") or bool(call.attrs.training):
            return call
        x = call.args[0]
        params = [_value(a, self.lookup_binding) for a in call.args[1:5]]
        shape = static_shape(x)
        if any(p is None for p in params) or shape is None or dtype_of(x) != "float32":
            return call
        gamma, beta, mean, var = params
        axis = int(call.attrs.axis) % len(shape)
        if not (gamma.size == beta.size == mean.size == var.size == shape[axis]):
            return call
        a = (np.float32(1.0) / np.sqrt(var + np.float32(float(call.attrs.epsilon)))) * gamma
        b = beta - mean * a
        broadcast = [1] * len(shape)
        broadcast[axis] = shape[axis]
        y = relax.op.add(relax.op.multiply(x, relax.const(a.reshape(broadcast))), relax.const(b.reshape(broadcast)))
        # batch_norm returns (y, running mean, running var); in inference the last two are the inputs
        return relax.Tuple([self.builder_.emit(y), call.args[3], call.args[4]])

    def visit_tuple_getitem_(self, op):
        op = super().visit_tuple_getitem_(op)
        fields = op.tuple_value
        while isinstance(fields, relax.Var):
            bound = self.lookup_binding(fields)
            if bound is None:
                break
            fields = bound
        return fields.fields[op.index] if isinstance(fields, relax.Tuple) else op


def batch_norm_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Affine(mod))
