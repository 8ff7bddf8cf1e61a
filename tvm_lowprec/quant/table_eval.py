"""A lookup table's values computed in numpy: the chain's Relax operators evaluated on the 256 inputs.

:mod:`~tvm_lowprec.quant.lookup_tables` replaces an element-wise chain on one 8-bit tensor by its table.
Computing the tables through TVM (legalize, fuse, lower, LLVM, a child process for LLVM's back end)
took seconds on a detector's few hundred chains (YOLO11n: 185 chains, 2.7 s of its 21 s compile);
the same 185 x 256 values take milliseconds here, in code that cannot abort the process.

The semantics are those of the kernels the tables replace, operator by operator, in float32 (numpy
float32 arithmetic is IEEE's, as LLVM's without fast math): the quantize is
:func:`~tvm_lowprec.kernels.qgemm.quantize_linear`'s (``x / scale``, clamped, rounded half to even, NaN
to the lowest code as :mod:`~tvm_lowprec.quant.legalize` sends it), the dequantize TVM's (``(x - zp)``
in int32, then times the scale in float32), ``max``/``min``/``clip`` TVM's selects (``a > b ? a : b``).
A transcendental function is computed in float64 from its float32 argument and rounded to float32
once: correctly rounded where the compiled kernel's libm (glibc's ``expf``: at most 0.502 ulp) may be
half an ulp off, so a code can differ only where the chain's value lies within an ulp of a rounding
boundary of the quantize after it.

An operator or attribute not listed here raises :class:`Unsupported`, and that chain is computed by
TVM as before.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir.prim.expr import FloatImm, IntImm


class Unsupported(Exception):
    """The chain has an operator (or a form of one) this evaluator does not know."""


def _float_only(x):
    if x.dtype != np.float32:
        raise Unsupported(f"a float function of {x.dtype}")
    return x


def _in_float64(fn):
    """A float32 unary function computed in float64, rounded once."""
    def apply(x):
        with np.errstate(all="ignore"):
            return fn(_float_only(x).astype(np.float64)).astype(np.float32)
    return apply


def _select_max(a, b):
    return np.where(a > b, a, b)  # TVM's max: select(a > b, a, b) (NaN in b wins, NaN in a loses)


def _select_min(a, b):
    return np.where(a < b, a, b)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _selu(x):
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return scale * np.where(x > 0, x, alpha * (np.exp(x) - 1.0))


UNARY_FLOAT = {name: _in_float64(fn) for name, fn in {
    "relax.sigmoid": _sigmoid, "relax.tanh": np.tanh, "relax.exp": np.exp, "relax.log": np.log,
    "relax.erf": _erf, "relax.sqrt": np.sqrt, "relax.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "relax.nn.gelu": _gelu, "relax.nn.gelu_tanh": _gelu_tanh, "relax.nn.silu": lambda x: x * _sigmoid(x),
    "relax.nn.selu": _selu, "relax.sin": np.sin, "relax.cos": np.cos, "relax.tan": np.tan, "relax.sinh": np.sinh,
    "relax.cosh": np.cosh, "relax.asin": np.arcsin, "relax.acos": np.arccos, "relax.atan": np.arctan,
    "relax.asinh": np.arcsinh, "relax.acosh": np.arccosh, "relax.atanh": np.arctanh,
}.items()}


def _integral(fn):
    """A rounding function: the identity on integers."""
    return lambda x: x if x.dtype.kind != "f" else fn(x)


# operators exact in the input's own type
UNARY_EXACT = {
    "relax.negative": np.negative, "relax.abs": np.abs, "relax.square": lambda v: v * v,
    "relax.round": _integral(np.rint), "relax.floor": _integral(np.floor), "relax.ceil": _integral(np.ceil),
    "relax.trunc": _integral(np.trunc), "relax.logical_not": np.logical_not,
    "relax.sign": lambda v: np.where(v < 0, -1, np.where(v > 0, 1, 0)).astype(v.dtype),
}


def _same_kind(a, b):
    """Two operands of one arithmetic operator: float32 with float32 (a constant's value as float32),
    or integers; anything else is a promotion TVM and numpy may do differently."""
    if a.dtype == np.float32 or b.dtype == np.float32:
        if a.dtype != b.dtype:
            raise Unsupported(f"{a.dtype} with {b.dtype}")
    elif a.dtype.kind not in "iub" or b.dtype.kind not in "iub" or a.dtype != b.dtype:
        raise Unsupported(f"{a.dtype} with {b.dtype}")
    return a, b


def _divide(a, b):
    a, b = _same_kind(a, b)
    if a.dtype != np.float32:
        raise Unsupported("integer division")
    with np.errstate(all="ignore"):
        return a / b


BINARY = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": _divide,
    "relax.maximum": _select_max, "relax.minimum": _select_min, "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal, "relax.less": np.less, "relax.less_equal": np.less_equal,
    "relax.equal": np.equal, "relax.not_equal": np.not_equal, "relax.logical_and": np.logical_and,
    "relax.logical_or": np.logical_or,
}


def _cast(x, dtype: str):
    try:
        target = np.dtype(dtype)
    except TypeError as err:
        raise Unsupported(f"cast to {dtype}") from err
    if target.kind == "f" and target != np.float32 or x.dtype.kind == "f" and x.dtype != np.float32:
        raise Unsupported(f"cast {x.dtype} -> {dtype}")
    if x.dtype == np.float32 and target.kind in "iu":
        info = np.iinfo(target)
        if not (np.isfinite(x).all() and x.min() > info.min - 1 and x.max() < info.max + 1):
            raise Unsupported(f"float -> {dtype} out of range (LLVM: poison)")
        return np.trunc(x).astype(target)
    return x.astype(target)


def _scalar(value) -> np.ndarray:
    """A constant operand: a relax constant or an immediate, as a 0-d numpy array of its dtype."""
    if isinstance(value, (IntImm, FloatImm)):
        return np.asarray(value.value, dtype=str(value.ty))
    if isinstance(value, tvm.ir.expr.Constant) and isinstance(getattr(value, "value", None), tvm.runtime.Tensor):
        array = value.value.numpy()
        if array.size != 1:
            raise Unsupported("a constant of more than one element")
        return array.reshape(())
    raise Unsupported(f"operand {type(value).__name__}")


class TableEvaluator:
    """Evaluates chain bodies (Relax expressions over the two parameters of
    :func:`~tvm_lowprec.quant.lookup_tables.evaluate_tables`) on numpy inputs, memoized per node."""

    def __init__(self, inputs: dict):
        self.memo = dict(inputs)  # parameter var -> its input values

    def evaluate(self, expr) -> np.ndarray:
        # an explicit stack: a chain is up to lookup_tables.MAX_OPS operators deep
        stack = [expr]
        while stack:
            node = stack[-1]
            if node in self.memo:
                stack.pop()
                continue
            if not isinstance(node, relax.Call):
                stack.pop()
                self.memo[node] = _scalar(node)
                continue
            pending = [a for a in node.args if isinstance(a, relax.Call) and a not in self.memo
                       or isinstance(a, relax.Var) and a not in self.memo]
            if any(isinstance(a, relax.Var) for a in pending):
                raise Unsupported(f"a free variable {pending[0]}")
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self.memo[node] = self._call(node)
        return self.memo[expr]

    def _arg(self, node, i):
        a = node.args[i]
        return self.memo[a] if a in self.memo else _scalar(a)

    def _call(self, node) -> np.ndarray:
        if not isinstance(node.op, tvm.ir.Op):
            raise Unsupported(f"a call of {node.op}")
        name, x = node.op.name, self._arg(node, 0)
        if name == "relax.quantize":
            return self._quantize(x, self._arg(node, 1), self._arg(node, 2), str(node.attrs.out_dtype))
        if name == "relax.dequantize":
            return self._dequantize(x, self._arg(node, 1), self._arg(node, 2), str(node.attrs.out_dtype))
        if name in UNARY_FLOAT:
            return UNARY_FLOAT[name](x)
        if name in BINARY:
            a, b = x, self._arg(node, 1)
            if name not in ("relax.divide", "relax.logical_and", "relax.logical_or"):
                a, b = _same_kind(a, b)
            with np.errstate(all="ignore"):
                return np.asarray(BINARY[name](a, b))
        if name == "relax.astype":
            return _cast(x, str(node.attrs.dtype))
        if name == "relax.clip":
            lo, hi = (_scalar(node.args[i]).astype(x.dtype) for i in (1, 2))
            return _select_max(_select_min(x, hi), lo)
        if name == "relax.nn.relu":
            return _select_max(x, np.zeros((), x.dtype))
        if name == "relax.nn.leakyrelu":
            x = _float_only(x)
            return np.where(x > 0, x, x * np.float32(float(node.attrs.alpha)))
        if name == "relax.nn.softplus":
            beta, threshold = float(node.attrs.beta), float(node.attrs.threshold)
            return _in_float64(lambda v: np.where(v * beta > threshold, v, np.log1p(np.exp(v * beta)) / beta))(x)
        if name == "relax.power":
            exponent = self._arg(node, 1)
            if exponent.dtype != np.float32:
                raise Unsupported(f"power of {exponent.dtype}")
            return _in_float64(lambda v: np.power(v, float(exponent)))(x)
        if name == "relax.where":
            return np.where(x, self._arg(node, 1), self._arg(node, 2))
        if name in UNARY_EXACT:
            return np.asarray(UNARY_EXACT[name](x))
        raise Unsupported(name)

    @staticmethod
    def _quantize(x, scale, zero_point, out_dtype: str):
        if "int" not in out_dtype or scale.dtype != np.float32 or scale.ndim or zero_point.ndim:
            raise Unsupported(f"quantize to {out_dtype}")
        x = _float_only(x)
        info = np.iinfo(out_dtype)
        z = int(zero_point)
        with np.errstate(all="ignore"):
            v = x if float(scale) == 1.0 else x / scale
            v = _select_max(_select_min(v, np.float32(info.max - z)), np.float32(info.min - z))
            q = np.rint(v)
        q = np.where(np.isnan(x), np.float32(info.min - z), q)  # NaN -> the lowest code (quant/legalize.py)
        return (q.astype(np.int32) + z).astype(out_dtype)

    @staticmethod
    def _dequantize(x, scale, zero_point, out_dtype: str):
        if out_dtype != "float32" or scale.dtype != np.float32 or scale.ndim or zero_point.ndim:
            raise Unsupported(f"dequantize to {out_dtype}")
        if x.dtype.kind == "f":
            sub = _float_only(x) - zero_point.astype(np.float32)
        else:
            sub = (x.astype(np.int32) - np.int32(zero_point)).astype(np.float32)
        return sub * scale


def evaluate(chains, params, inputs: dict) -> list:
    """The table of each chain, one value per input (None where :class:`Unsupported`): ``params`` maps a
    dtype to its parameter var, ``inputs`` a dtype to its 256 input values."""
    count = len(next(iter(inputs.values())))
    tables = []
    for chain in chains:
        evaluator = TableEvaluator({params[dt]: inputs[dt] for dt in params})
        try:
            table = evaluator.evaluate(chain.body)
        except Unsupported:
            tables.append(None)
            continue
        tables.append(np.broadcast_to(table, (count,)).copy())  # a chain that ignores its input: one value
    return tables


__all__ = ["TableEvaluator", "Unsupported", "evaluate"]
