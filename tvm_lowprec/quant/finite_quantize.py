"""Pass: a quantize whose input cannot be NaN skips the NaN test.

:mod:`~tvm_lowprec.quant.legalize` sends NaN to the lowest code, as ONNX Runtime does, with a test on
the input. The test names the input twice, and when TVM inlines a chain of quantize/dequantize pairs
into one kernel each pair doubles the inlined expression: the anchor arithmetic of a YOLO-style
detector's head (split, subtract, add, divide, concatenate, multiply, each between Q/DQ pairs) became
a 60 kB expression that ran in 1.8 ms over 32,000 values; without the tests, 0.15 ms.

Most quantize inputs provably hold no NaN: an 8-bit tensor dequantized with finite constant
parameters is bounded, and adding, multiplying, resizing, pooling, concatenating bounded values keeps
them bounded. This pass bounds ``|x|`` through the operators it knows (:data:`_RULES`, from the
integer tensors and constants they start at) and legalizes the quantizes with a finite bound itself,
without the test; anything else (a graph input, a float kernel's output, an operator it does not
know, a bound past :data:`LIMIT`) keeps the test. Runs just before legalization.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from .legalize import legalize_quantize
from .patterns import constant, dtype_of, mutate_relax_functions

LIMIT = 1e30  # bounds past this are treated as unbounded: a product of two could overflow to inf
UNBOUNDED = math.inf


def _first(call, bound):
    return bound(call.args[0])


def _sum(call, bound):
    return bound(call.args[0]) + bound(call.args[1])


def _product(call, bound):
    return bound(call.args[0]) * bound(call.args[1])


def _divide(call, bound):
    divisor = constant(call.args[1])
    if divisor is None or not np.all(np.isfinite(divisor)) or np.min(np.abs(divisor)) == 0:
        return UNBOUNDED
    return bound(call.args[0]) / float(np.min(np.abs(divisor)))


def _larger(call, bound):
    return max(bound(call.args[0]), bound(call.args[1]))


def _dequantize(call, bound):
    scale, zero = constant(call.args[1]), constant(call.args[2])
    if scale is None or zero is None or not np.all(np.isfinite(scale)):
        return UNBOUNDED
    info = np.iinfo(dtype_of(call.args[0]))
    reach = max(abs(int(info.min)), abs(int(info.max))) + float(np.max(np.abs(zero)))
    return reach * float(np.max(np.abs(scale)))


def _exp(call, bound):
    b = bound(call.args[0])
    return math.exp(b) if b < 80 else UNBOUNDED


def _unit(call, bound):  # sigmoid, tanh, erf, softmax: |f(x)| <= 1 for every finite x
    return 1.0 if bound(call.args[0]) < UNBOUNDED else UNBOUNDED


def _resize(call, bound):  # nearest and linear stay within the input's range; cubic overshoots a little
    return bound(call.args[0]) * (2.0 if str(call.attrs.method) == "cubic" else 1.0)


_SAME = ("reshape", "permute_dims", "squeeze", "expand_dims", "flatten", "broadcast_to", "strided_slice",
         "split", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "mean", "max", "min", "clip",
         "nn.relu", "negative", "abs", "astype", "nn.silu", "nn.gelu", "nn.gelu_tanh", "layout_transform")
_RULES = {
    **{f"relax.{name}": _first for name in _SAME},
    **{f"relax.{name}": (lambda call, bound: bound(call.args[0]) + 1.0) for name in ("round", "floor", "ceil")},
    "relax.add": _sum, "relax.subtract": _sum, "relax.multiply": _product, "relax.divide": _divide,
    "relax.maximum": _larger, "relax.minimum": _larger, "relax.dequantize": _dequantize,
    "relax.exp": _exp, "relax.sigmoid": _unit, "relax.tanh": _unit, "relax.erf": _unit, "relax.nn.softmax": _unit,
    "relax.image.resize2d": _resize, "relax.concat": _first,  # concat's one argument is the tuple
    "relax.take": _first,  # gathers values of its first argument
}


class Bounds:
    """``bound(expr)``: an upper bound of ``|value|`` over every element, or ``inf`` when unknown (NaN
    possible). ``lookup`` maps a var to the expression bound to it (None for a function parameter)."""

    def __init__(self, lookup, functions=None):
        self.lookup, self.memo = lookup, {}
        self.functions = functions  # gvar -> function: a kernel's declared bound (``lowprec.bound``)

    def __call__(self, expr) -> float:
        if isinstance(expr, tvm.ir.expr.Constant):
            value = expr.value.numpy()
            return float(np.max(np.abs(value), initial=0.0)) if np.all(np.isfinite(value)) else UNBOUNDED
        dtype = getattr(getattr(expr, "ty", None), "dtype", None)
        if dtype is not None and ("int" in str(dtype) or str(dtype) == "bool"):
            info = np.iinfo(str(dtype)) if str(dtype) != "bool" else np.iinfo("uint8")
            return float(max(abs(int(info.min)), abs(int(info.max))))  # integers are never NaN
        if isinstance(expr, relax.Var):
            key = expr
            if key not in self.memo:
                bound_to = self.lookup(expr)
                self.memo[key] = self(bound_to) if bound_to is not None else UNBOUNDED
            return self.memo[key]
        if isinstance(expr, relax.Tuple):
            return max((self(f) for f in expr.fields), default=0.0)
        if isinstance(expr, relax.TupleGetItem):
            return self(expr.tuple_value)
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            return self._kernel(expr.args[0])
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            rule = _RULES.get(expr.op.name)
            value = rule(expr, self) if rule is not None else UNBOUNDED
            return value if value <= LIMIT else UNBOUNDED
        return UNBOUNDED

    def _kernel(self, gvar) -> float:
        """A kernel that declares a bound of its outputs' magnitudes (``lowprec.bound``, a normalization's
        statistics), else unbounded."""
        func = self.functions(gvar) if self.functions is not None and isinstance(gvar, relax.GlobalVar) else None
        bound = None if func is None or func.attrs is None else func.attrs.get("lowprec.bound", None)
        return float(bound) if bound is not None else UNBOUNDED


@relax.expr_functor.mutator
class _Legalizer(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.bounds = Bounds(self.lookup_binding, lambda gvar: self.builder_.get()[gvar])
        self.without_test = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(tvm.ir.Op.get("relax.quantize")) or "int" not in str(call.attrs.out_dtype):
            return call
        if self.bounds(call.args[0]) >= UNBOUNDED:
            return call
        self.without_test += 1
        return legalize_quantize(self.builder_, call, nan_test=False)


def finite_quantize_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Legalizer(mod))
