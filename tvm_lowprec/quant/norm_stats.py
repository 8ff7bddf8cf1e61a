"""Pass: a normalization of a dequantized 8-bit tensor over axes other than the innermost takes its
statistics from one integer kernel of the codes.

TVM's importer writes ``InstanceNormalization`` (and an exporter's group norm written through it) as
``(x - mean(x)) / sqrt(variance(x) + eps)``. With ``x = dequantize(q, s, z)`` per tensor, 8-bit, and
the reduced axes leaving the innermost out (an NWC tensor normalized over its frames, as
:mod:`~tvm_lowprec.quant.propagate_layout` leaves wav2vec2's first group norm), this becomes::

    mean_q, a = qnorm_stats(q)                          # per channel: one read of the codes
    (float(q) - mean_q) * a                             # per element, fused with what follows

:mod:`~tvm_lowprec.kernels.qnorm_stats` computes ``mean_q`` and ``a = s / sqrt(s² var_q + eps)`` from
exact int32 sums of the codes and of their squares. Before, the variance read a float32 copy of the
tensor written by a kernel of its own, and the square root and division were computed per element:
wav2vec2's 1599x512 group norm took 0.76 ms plus the copy's 0.12 ms on Zen 4 (one thread).

Not bit-identical to the float graph: ONNX Runtime sums float32 values with rounding; the integer sums
are exact; the normalized values differ in the last bits, which can move a following quantization by
one step where a value sits on a rounding boundary (``docs/numerics.md``). Runs in ``Finish`` before
:mod:`~tvm_lowprec.quant.integer_mean`, which would otherwise take the mean alone.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..kernels.qlayernorm import MAX_ROW
from ..kernels.qnorm_stats import build_qnorm_stats
from .patterns import call_of, constant, dtype_of, mutate_relax_functions, op, qparams, static_shape


def _axes(call, rank: int):
    axes = call.attrs.axis
    return None if axes is None else sorted(int(a) % rank for a in axes)


@relax.expr_functor.mutator
class _NormStats(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.kernels = {}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        new = self._rewrite(call) if call.op.same_as(op("relax.divide")) else None
        return call if new is None else new

    def _rewrite(self, call):
        lookup = self.lookup_binding
        centred, root = call_of(call.args[0], "subtract", lookup), call_of(call.args[1], "sqrt", lookup)
        shifted = None if root is None else call_of(root.args[0], "add", lookup)
        if centred is None or shifted is None:
            return None
        mean, var = call_of(centred.args[1], "mean", lookup), call_of(shifted.args[0], "variance", lookup)
        eps = constant(shifted.args[1], lookup)
        if mean is None or var is None or eps is None or eps.size != 1:
            return None
        source = centred.args[0]
        if not (_same(mean.args[0], source, lookup) and _same(var.args[0], source, lookup)):
            return None
        dq = call_of(source, "dequantize", lookup)
        shape = static_shape(source)
        if dq is None or shape is None or dtype_of(dq.args[0]) not in ("uint8", "int8") or dtype_of(source) != "float32":
            return None
        p = qparams(dq, lookup, "normalization input dequantize")
        axes = _axes(mean, len(shape))
        if p is None or not p.per_tensor or axes is None or axes != _axes(var, len(shape)):
            return None
        if not (mean.attrs.keepdims and var.attrs.keepdims) or not axes or len(shape) - 1 in axes:
            return None
        if int(np.prod([shape[a] for a in axes])) > MAX_ROW:
            return None
        scale, epsilon = float(np.asarray(p.scale).reshape(())), float(eps.reshape(()))
        key = (shape, tuple(axes), dtype_of(dq.args[0]), scale, epsilon)
        if key not in self.kernels:
            name = f"qnorm_stats_{dtype_of(dq.args[0])[0]}8_{'x'.join(map(str, shape))}"
            func = build_qnorm_stats(shape, axes, dtype_of(dq.args[0]), scale, epsilon, name=name)
            self.kernels[key] = self.builder_.add_func(func, name)
        kept = [1 if i in axes else n for i, n in enumerate(shape)]
        codes = dq.args[0]
        stats = self.builder_.emit(relax.call_tir(self.kernels[key], [codes], [relax.TensorType(kept, "float32")] * 2))
        mean_q = self.builder_.emit(relax.TupleGetItem(stats, 0))
        factor = self.builder_.emit(relax.TupleGetItem(stats, 1))
        return relax.op.multiply(relax.op.subtract(relax.op.astype(codes, "float32"), mean_q), factor)


def _same(a, b, lookup) -> bool:
    """``a`` and ``b`` are one value (the same var, or vars bound to the same expression)."""
    if a.same_as(b):
        return True
    if isinstance(a, relax.Var) and isinstance(b, relax.Var):
        bound_a, bound_b = lookup(a), lookup(b)
        return bound_a is not None and bound_a.same_as(bound_b)
    return False


def norm_stats_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mod, _NormStats(mod)))
