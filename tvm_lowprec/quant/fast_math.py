"""Pass: TVM's FastMathTransform, with each float GELU first written as the ``erf`` (or ``tanh``) it
computes and each float sigmoid as ``1 / (1 + exp(-x))``, so that TVM's vectorizable polynomials
replace those too (a decoder's SwiGLU, ``x * sigmoid(x) * up``, 4864 elements a token: 27 us through
libm's ``expf`` per element, Zen 3).

FastMathTransform swaps ``relax.exp``, ``relax.erf``, ``relax.tanh`` and softmax for their fast forms
(relative error about 1e-6), but not ``relax.nn.gelu`` / ``gelu_tanh``, which TVM legalizes to
``erf``/``tanh`` in TIR: a call of libm per element. A GELU whose output stays float (no quantize
after it for :mod:`~tvm_lowprec.quant.lookup_tables` to turn into a table: FastViT's last block
before its float head, 1x4x4x768) took 0.11 ms, 1 % of copy bandwidth (Zen 4, one thread, alone).
The decomposition is TVM's own legalization of the two operators, in Relax.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from .patterns import dtype_of, mutate_relax_functions


def _c(value: float):
    return relax.const(np.float32(value))


@relax.expr_functor.mutator
class _Decompose(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ("relax.nn.gelu", "relax.nn.gelu_tanh",
                                                                      "relax.sigmoid"):
            return call
        if dtype_of(call) != "float32":
            return call
        x = call.args[0]
        if call.op.name == "relax.sigmoid":  # 1 / (1 + exp(-x)): exp(88) is finite, exp(-88) > 0
            exp = self.builder_.emit(relax.op.exp(relax.op.negative(x)))
            return relax.op.divide(_c(1.0), relax.op.add(_c(1.0), exp))
        if call.op.name == "relax.nn.gelu":  # x * (0.5 + erf(x * sqrt(0.5)) * 0.5)
            erf = self.builder_.emit(relax.op.erf(relax.op.multiply(x, _c(0.5 ** 0.5))))
            return relax.op.multiply(x, relax.op.add(_c(0.5), relax.op.multiply(erf, _c(0.5))))
        # 0.5 * x * (1 + tanh(sqrt(2 / pi) * x * (1 + 0.044715 * x * x)))
        inner = relax.op.multiply(relax.op.multiply(_c(math.sqrt(2.0 / math.pi)), x),
                                  relax.op.add(_c(1.0), relax.op.multiply(relax.op.multiply(_c(0.044715), x), x)))
        tanh = self.builder_.emit(relax.op.tanh(inner))
        return relax.op.multiply(relax.op.multiply(_c(0.5), x), relax.op.add(_c(1.0), tanh))


def fast_math_module(mod):
    """GELUs decomposed (see the module), then TVM's FastMathTransform."""
    return relax.transform.FastMathTransform()(mutate_relax_functions(mod, _Decompose(mod)))
