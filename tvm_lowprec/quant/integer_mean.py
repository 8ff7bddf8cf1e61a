"""Pass: the mean of a dequantized 8-bit tensor is an integer sum of its codes.

``mean(dequantize(x, s, zp))`` over ``n`` elements is ``s * (sum(x) - n * zp) / n``. Written so, the
reduction reads the 8-bit codes (a squeeze-excite block's global average pool over a 1x240x240x16
tensor: 0.9 MiB instead of the 3.5 MiB of float32 that a dequantize kernel wrote for the mean to read
back) and sums them in int32, exactly; the rest is arithmetic on the reduced values, in the order
ONNX's ``DequantizeLinear``/``ReduceMean`` take (the scale, then the division by ``n``), in float32.

Not bit-identical to the float graph in every case: ONNX Runtime sums float32 values, rounding at
each addition, where the integer sum is exact; the quantized result differs where that rounding
carries the mean across a quantization boundary (one step at most; ``docs/numerics.md``).

Only per-tensor parameters (a scalar scale and zero point), sums that int32 and float32 hold exactly
(``n * 255 < 2**24``) and reductions that keep the innermost axis (an NHWC pool over H and W, as
:mod:`~tvm_lowprec.quant.propagate_layout` leaves a squeeze-excite block: the reduction rule
:mod:`~tvm_lowprec.schedule.strided` vectorizes along the channels, also with the codes' producer
fused in; a row reduction of integers has no rule of ours yet); anything else keeps the float mean. Runs before
:mod:`~tvm_lowprec.quant.dequantize_per_use`, so a dequantize the pool no longer reads is no longer
shared.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .patterns import call_of, constant, dtype_of, mutate_relax_functions, static_shape

_EXACT = 1 << 24  # |sum - n * zp| <= n * 255 below this: exact in int32 and as a float32


@relax.expr_functor.mutator
class _IntegerMean(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.mean"):
            return call
        value = call_of(call.args[0], "dequantize", self.lookup_binding)
        if value is None:
            return call
        codes = value.args[0]
        scale, zero_point = (constant(a, self.lookup_binding) for a in value.args[1:3])
        shape = static_shape(codes)
        if (scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1 or shape is None
                or dtype_of(codes) not in ("uint8", "int8") or dtype_of(call) != "float32"):
            return call
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
        axes = [int(a) % len(shape) for a in call.attrs.axis] if call.attrs.axis is not None else list(range(len(shape)))
        count = int(np.prod([shape[a] for a in axes]))
        if count * 255 >= _EXACT or len(shape) - 1 in axes:
            return call
        total = relax.op.sum(relax.op.astype(codes, "int32"), axes, call.attrs.keepdims)
        centred = relax.op.subtract(total, relax.const(count * int(zero_point), "int32"))
        real = relax.op.multiply(relax.op.astype(centred, "float32"), relax.const(np.float32(scale), "float32"))
        return relax.op.divide(real, relax.const(np.float32(count), "float32"))


def integer_mean_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mod, _IntegerMean(mod)))
