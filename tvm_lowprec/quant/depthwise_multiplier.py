"""Pass: a depthwise convolution with a channel multiplier becomes a depthwise convolution of its
input's channels repeated.

``conv2d(x, w, groups=C)`` with ``C`` input channels and ``m * C`` filters of one input channel each
(FastViT's 7x7 stride-2 patch embeddings, 48 -> 96 channels; MobileNet-style blocks with a depth
multiplier) is, output channel ``o = c * m + j`` reading input channel ``c``, the depthwise convolution
(``groups = m * C``) of ``repeat(x, m, axis=1)``. As written it is a grouped convolution of ``C``
GEMMs with two output columns each (an im2col of 49 taps per group at 2.5 % of copy bandwidth, 0.3 ms
of FastViT-T8's 2.4 ms; Zen 4, one thread); repeated, it runs on the depthwise kernel.

A quantized input (``dequantize(q)`` per tensor) is repeated as codes, ``dequantize(repeat(q))``, so
the QDQ rewrite sees its usual pattern; :mod:`~tvm_lowprec.quant.propagate_layout` moves transposes
through the repeat like through a concatenation. Runs before the QDQ rewrite
(:mod:`~tvm_lowprec.quant.qdq_to_integer`).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .patterns import call_of, conv_geometry, mutate_relax_functions, qparams


@relax.expr_functor.mutator
class _Repeat(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        g = conv_geometry(call, grouped=True)
        m = g.multiplier if g is not None else 0
        if not m:
            return call
        x = call.args[0]
        dq = call_of(x, "dequantize", self.lookup_binding)
        if dq is not None and (p := qparams(dq, self.lookup_binding, "depthwise input dequantize")) is not None \
                and p.per_tensor:
            codes = self.builder_.emit(relax.op.repeat(dq.args[0], m, axis=1))
            data = self.builder_.emit(relax.op.dequantize(codes, dq.args[1], dq.args[2], int(dq.attrs.axis),
                                                          str(dq.attrs.out_dtype)))
        else:
            data = self.builder_.emit(relax.op.repeat(x, m, axis=1))
        attrs = call.attrs
        out_layout = str(attrs.out_layout) if attrs.out_layout is not None else None
        out_dtype = str(attrs.out_dtype) if attrs.out_dtype is not None else None
        return relax.op.nn.conv2d(data, call.args[1], [int(s) for s in attrs.strides], [int(p) for p in attrs.padding],
                                  [int(d) for d in attrs.dilation], m * g.channels, str(attrs.data_layout),
                                  str(attrs.kernel_layout), out_layout, out_dtype)


def depthwise_multiplier_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Repeat(mod))
