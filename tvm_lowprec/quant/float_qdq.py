"""Pass: a quantize/dequantize pair inside a float chain rounds in float32, without the 8-bit codes.

``dequantize(quantize(y, s, z), s, z)`` is ``clip(rint(y / s), lo - z, hi - z) * s``: the same values
(rounding is monotone and the clamp bounds are integers, which ``rint`` fixes; the products of small
integers and ``s`` are the dequantize's own). Written with the codes, a kernel computing a chain of
such pairs (a normalization's output, then a per-channel scale, then a per-channel shift, each
quantized as ONNX Runtime's QDQ graphs are) converts every value to int32, packs it to bytes, unpacks
and converts it back: wav2vec2's group-norm chain over 1599x512 values, three pairs, 448 -> 291 us on
Zen 4 (one thread) in float32, bit-identical.

Taken only where the pair is internal to an element-wise chain: the quantize read by the dequantize
alone, the dequantize by one element-wise operator alone (so fusion puts the whole chain in one kernel
and no float tensor is written where bytes were), per-tensor constant parameters, an integer type, and
``y`` provably not NaN (:mod:`~tvm_lowprec.quant.finite_quantize`'s bounds: ONNX Runtime sends NaN to
the lowest code, which the float form cannot do without the test). Runs in ``Finish`` before
:mod:`~tvm_lowprec.quant.finite_quantize`, after :mod:`~tvm_lowprec.quant.integer_mean` (a pool reads
codes).
"""

from __future__ import annotations

import collections

import numpy as np
import tvm
from tvm import relax

from .finite_quantize import UNBOUNDED, Bounds
from .patterns import bindings, constant, dtype_of, mutate_relax_functions, op
from .requant import qrange

# the operators a pair's dequantize may feed (element-wise: fusion keeps the chain in one kernel)
ELEMENTWISE = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "clip", "nn.relu", "negative", "abs",
    "exp", "sigmoid", "tanh", "erf", "sqrt", "nn.gelu", "nn.gelu_tanh", "nn.silu", "quantize"))


def _internal_pairs(mod) -> set[int]:
    """The dequantize calls (their handles) whose argument is a quantize read by them alone and whose
    value one element-wise call alone reads. Vars are told apart by identity (names repeat)."""
    quantize, dequantize = op("relax.quantize"), op("relax.dequantize")
    found = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        found_bindings = bindings(func)
        value_of = {b.var: b.value for b in found_bindings}
        readers = collections.defaultdict(list)
        for b in found_bindings:
            for var in relax.analysis.free_vars(b.value):
                readers[var].append(b.value)
        for var in relax.analysis.free_vars(func.body.body):
            readers[var].append(None)  # the function's result
        for b in found_bindings:
            call = b.value
            if not (isinstance(call, relax.Call) and call.op.same_as(dequantize) and isinstance(call.args[0], relax.Var)):
                continue
            source, users = value_of.get(call.args[0]), readers[b.var]
            if (isinstance(source, relax.Call) and source.op.same_as(quantize) and len(readers[call.args[0]]) == 1
                    and len(users) == 1 and isinstance(users[0], relax.Call)
                    and getattr(users[0].op, "name", None) in ELEMENTWISE):
                found.add(call.__chandle__())
    return found


def _scalar(expr, lookup):
    value = constant(expr, lookup)
    return None if value is None or value.size != 1 else value.reshape(())


@relax.expr_functor.mutator
class _FloatPairs(relax.PyExprMutator):
    def __init__(self, mod, pairs):
        super().__init__(mod)
        self.pairs, self.bounds = pairs, Bounds(self.lookup_binding, lambda gvar: self.builder_.get()[gvar])

    def visit_call_(self, call):
        internal = call.__chandle__() in self.pairs  # the call as written (args not yet rewritten)
        call = super().visit_call_(call)
        if not internal or not isinstance(call.args[0], relax.Var) or dtype_of(call) != "float32":
            return call
        q = self.lookup_binding(call.args[0])
        if not (isinstance(q, relax.Call) and q.op.same_as(op("relax.quantize"))) or dtype_of(q.args[0]) != "float32":
            return call
        out_dtype = str(q.attrs.out_dtype)
        params = [_scalar(a, self.lookup_binding) for a in (q.args[1], q.args[2], call.args[1], call.args[2])]
        if "int" not in out_dtype or any(p is None for p in params):
            return call
        s, z, s2, z2 = params
        if np.float32(s) != np.float32(s2) or int(z) != int(z2) or not np.float32(s) > 0:
            return call
        if self.bounds(q.args[0]) >= UNBOUNDED:  # NaN possible: the codes' lowest value, not the float form's
            return call
        lo, hi = qrange(out_dtype)
        scale = relax.const(np.float32(s), "float32")
        steps = relax.op.round(relax.op.divide(q.args[0], scale))  # round: to nearest even, as rint
        return relax.op.multiply(relax.op.clip(steps, float(lo - int(z)), float(hi - int(z))), scale)


def float_qdq_module(mod):
    """Apply the pass to every Relax function of ``mod`` (unchanged where no pair is internal)."""
    pairs = _internal_pairs(mod)
    if not pairs:
        return mod
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mod, _FloatPairs(mod, pairs)))
