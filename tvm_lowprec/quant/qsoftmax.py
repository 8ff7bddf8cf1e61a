"""Pass: ``quantize(softmax(dequantize(x), axis=-1))`` with 8-bit ``x`` -> one 8-bit-in, 8-bit-out kernel.

The attention softmax of a quantized transformer otherwise dequantizes its scores to float32, runs a
float softmax (TVM's, or its fast-math polynomial) and quantizes: four bytes read per score where one
carries the information. :func:`~tvm_lowprec.kernels.qsoftmax.build_qsoftmax` takes the 8-bit scores
and a 256-entry exponential table instead. Matched only with per-tensor constant parameters, the
softmax over the last axis and static shapes; anything else stays as it is.

Runs after :mod:`~tvm_lowprec.quant.fold_qdq` (which leaves the ``dequantize`` beside the softmax)
and before :mod:`~tvm_lowprec.quant.lookup_tables`.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..kernels.qsoftmax import build_qsoftmax, exp_table
from .patterns import call_of, dtype_of, qparams, static_shape
from .requant import qrange

EIGHT_BIT = ("uint8", "int8")


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
        softmax = call_of(call.args[0], "nn.softmax", self.lookup_binding)
        if softmax is None:
            return None
        dq = call_of(softmax.args[0], "dequantize", self.lookup_binding)
        shape = static_shape(softmax)
        if dq is None or shape is None or dtype_of(dq.args[0]) not in EIGHT_BIT:
            return None
        if int(softmax.attrs.axis) not in (-1, len(shape) - 1):
            return None
        p_in, p_out = qparams(dq, self.lookup_binding, "softmax input"), qparams(call, self.lookup_binding, "softmax output")
        if p_in is None or p_out is None or not (p_in.per_tensor and p_out.per_tensor):
            return None
        out_dtype = dtype_of(call)
        qmin, qmax = qrange(out_dtype)
        in_dtype = dtype_of(dq.args[0])
        name = f"qsoftmax_{in_dtype[0]}8_{'x'.join(map(str, shape))}"
        func = build_qsoftmax(shape, in_dtype, out_dtype, float(p_out.scale.reshape(())),
                              int(p_out.zero_point.reshape(())), qmin, qmax, name)
        gvar = self.builder_.add_func(func, name)
        table = relax.const(exp_table(float(np.asarray(p_in.scale).reshape(()))))
        self.rewritten += 1
        return relax.call_tir(gvar, [dq.args[0], table], relax.TensorType(shape, out_dtype))


def qsoftmax_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    rewriter = _Rewriter(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()
