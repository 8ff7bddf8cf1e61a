"""Pass: move transposes towards the graph's outputs until they cancel.

The integer convolutions run on NHWC (:mod:`~tvm_lowprec.quant.qdq_to_integer` emits
``NCHW -> NHWC`` before each one and ``NHWC -> NCHW`` after it). Between two convolutions sit
operators that do not care about the layout: quantize and dequantize, the activations, the
residual add, pooling, padding, concatenation, split, resize, reductions with kept axes (a group
norm's mean and variance), and the squeeze/unsqueeze of a Conv1d lifted to two dimensions. This pass
rewrites ``op(permute_dims(x, p))`` into ``permute_dims(op'(x), p)`` (``op'`` with its axes or layout
attributes moved accordingly) and ``permute_dims(permute_dims(x, q), p)`` into one transpose, a
reshape (only unit axes move) or none;
a reshape to the tensor's own shape is dropped, and a small broadcast operand of a binary operator (a
``[C, 1]`` weight) is transposed instead of the activations. The transposes that survive are
the ones before an operator that needs the original layout (a reshape, say) or at an output: the
layout changes happen once, at the graph's boundary, instead of around every layer.

Exact: every rewrite only reorders the same computation. Runs after the Q/DQ fold and before
legalization. An operator it does not know keeps its transposed inputs (the transposes stay).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .patterns import mutate_relax_functions, static_shape

# One-input operators applied element by element (extra inputs, if any, are per-tensor or per-axis
# parameters that do not depend on the layout).
UNARY = frozenset(
    f"relax.{name}"
    for name in ("quantize", "dequantize", "nn.relu", "clip", "sigmoid", "tanh", "exp", "astype", "negative",
                 "nn.gelu", "nn.silu", "erf", "sqrt", "abs", "round", "floor", "ceil")
)
BINARY = frozenset(
    f"relax.{name}" for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
)
POOLS = {"relax.nn.max_pool2d": relax.op.nn.max_pool2d, "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d}
REDUCTIONS = {"relax.mean": relax.op.mean, "relax.sum": relax.op.sum, "relax.max": relax.op.max,
              "relax.variance": relax.op.variance}
# a broadcast operand of a binary operator that is not transposed moves (expanded to full rank, then
# transposed) when it has at most this fraction of the output's elements: a per-channel [C, 1] weight
SMALL_OPERAND = 1 / 16
NHWC_TO_NCHW = (0, 3, 1, 2)


def _perm(call) -> tuple[int, ...] | None:
    """The axes of a ``permute_dims`` call (None: not one, or of unknown rank)."""
    if not isinstance(call, relax.Call) or not call.op.same_as(tvm.ir.Op.get("relax.permute_dims")):
        return None
    if call.attrs.axes is None:
        shape = static_shape(call)
        return None if shape is None else tuple(reversed(range(len(shape))))
    return tuple(int(a) for a in call.attrs.axes)


def _axis(axis: int, perm) -> int:
    """An axis of the transposed tensor, as an axis of the tensor before the transpose."""
    return perm[axis % len(perm)]


@relax.expr_functor.mutator
class _Propagator(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.moved = 0

    def _transposed(self, expr):
        """(x, p) when ``expr`` is bound to ``permute_dims(x, p)``, else None."""
        bound = expr
        while True:
            while isinstance(bound, relax.Var):  # through aliases (``y = lv``)
                bound = self.lookup_binding(bound)
            if not isinstance(bound, relax.TupleGetItem):
                break
            fields = bound.tuple_value  # a piece of a split the transpose moved past
            while isinstance(fields, relax.Var):
                fields = self.lookup_binding(fields)
            if not isinstance(fields, relax.Tuple):
                return None
            bound = fields.fields[bound.index]
        perm = _perm(bound)
        return None if perm is None else (bound.args[0], perm)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        name = call.op.name
        if name == "relax.permute_dims":
            return self._compose(call)
        if name == "relax.reshape" and self._transposed(call.args[0]) is not None:
            before, after = static_shape(call.args[0]), static_shape(call)
            if before is not None and before == after:  # a reshape to the same shape (an exporter's no-op)
                return call.args[0]
        handler = (
            self._unary if name in UNARY else self._binary if name in BINARY else
            self._pool if name in POOLS else self._reduce if name in REDUCTIONS else
            self._concat if name == "relax.concat" else self._split if name == "relax.split" else
            self._resize if name == "relax.image.resize2d" else
            self._squeeze if name == "relax.squeeze" else self._expand_dims if name == "relax.expand_dims" else
            self._pad if name == "relax.nn.pad" else self._repeat if name == "relax.repeat" else None
        )
        if handler is None:
            return call
        moved = handler(call, name)
        if moved is None:
            return call
        self.moved += 1
        return moved

    def _emit_transposed(self, expr, perm):
        return relax.op.permute_dims(self.builder_.emit(expr), perm)

    def _compose(self, call):
        inner = self._transposed(call.args[0])
        if inner is None:
            return call
        x, q = inner
        composed = tuple(q[a] for a in _perm(call))
        if composed == tuple(range(len(composed))):
            return x
        shape = static_shape(x)
        if shape is not None and [a for a in composed if shape[a] != 1] == sorted(a for a in composed if shape[a] != 1):
            return relax.op.reshape(x, [shape[a] for a in composed])  # only unit axes move: a view
        return relax.op.permute_dims(x, composed)

    def _unary(self, call, name):
        inner = self._transposed(call.args[0])
        if inner is None:
            return None
        x, perm = inner
        attrs = call.attrs
        if name in ("relax.quantize", "relax.dequantize"):
            op = relax.op.quantize if name == "relax.quantize" else relax.op.dequantize
            new = op(x, call.args[1], call.args[2], _axis(int(attrs.axis), perm), str(attrs.out_dtype))
        else:
            new = relax.Call(call.op, [x, *call.args[1:]], attrs, call.ty_args)
        return self._emit_transposed(new, perm)

    def _binary(self, call, name):
        sides = [self._transposed(a) for a in call.args]
        perms = {s[1] for s in sides if s is not None}
        if len(perms) != 1:
            return None
        perm = perms.pop()
        args = []
        for arg, side in zip(call.args, sides):
            if side is not None:
                args.append(side[0])
                continue
            shape = static_shape(arg)
            if shape is None:
                return None
            if int(np.prod(shape)) == 1 and len(shape) <= len(perm):
                args.append(arg)  # a scalar broadcasts the same in any layout
            elif isinstance(arg, tvm.ir.expr.Constant) and len(shape) == len(perm):
                args.append(relax.const(np.transpose(arg.value.numpy(), np.argsort(perm))))
            elif len(shape) <= len(perm) and self._small(shape, call):
                full = [1] * (len(perm) - len(shape)) + list(shape)  # numpy broadcasting: aligned right
                args.append(relax.op.permute_dims(relax.op.reshape(arg, full), [int(a) for a in np.argsort(perm)]))
            else:
                return None
        return self._emit_transposed(relax.Call(call.op, args, call.attrs, call.ty_args), perm)

    @staticmethod
    def _small(shape, call) -> bool:
        out = static_shape(call)
        return out is not None and int(np.prod(shape)) <= SMALL_OPERAND * int(np.prod(out))

    def _squeeze(self, call, name):
        """``squeeze(permute_dims(x, p), axes)``: the same unit axes squeezed from ``x`` (a Conv1d lifted
        to a 2-D convolution drops its unit height)."""
        inner = self._transposed(call.args[0])
        if inner is None or call.attrs.axis is None:
            return None
        x, perm = inner
        axes = {int(a) % len(perm) for a in call.attrs.axis}
        gone = sorted(perm[a] for a in axes)
        kept = [perm[j] for j in range(len(perm)) if j not in axes]
        return self._emit_transposed(relax.op.squeeze(x, gone), [s - sum(t < s for t in gone) for s in kept])

    def _expand_dims(self, call, name):
        """``expand_dims(permute_dims(x, p), a)``: ``x`` gets the unit axis last, the transpose puts it at ``a``."""
        inner = self._transposed(call.args[0])
        if inner is None or len(call.attrs.axis) != 1:
            return None
        x, perm = inner
        rank = len(perm)
        a = int(call.attrs.axis[0]) % (rank + 1)
        return self._emit_transposed(relax.op.expand_dims(x, [rank]), [*perm[:a], rank, *perm[a:]])

    def _pad(self, call, name):
        """``pad(permute_dims(x, p))``: ``x`` padded by the same widths, each moved to its axis of ``x``."""
        inner = self._transposed(call.args[0])
        if inner is None:
            return None
        x, perm = inner
        width = [int(w) for w in call.attrs.pad_width]
        moved = [0] * len(width)
        for j, s in enumerate(perm):
            moved[2 * s: 2 * s + 2] = width[2 * j: 2 * j + 2]
        return self._emit_transposed(relax.op.nn.pad(x, moved, str(call.attrs.pad_mode), float(call.attrs.pad_value)), perm)

    def _pool(self, call, name):
        inner = self._transposed(call.args[0])
        a = call.attrs
        if inner is None or inner[1] != NHWC_TO_NCHW or str(a.layout) != "NCHW" or str(a.out_layout) != "NCHW":
            return None
        kwargs = {"count_include_pad": bool(a.count_include_pad)} if name == "relax.nn.avg_pool2d" else {}
        new = POOLS[name](inner[0], a.pool_size, a.strides, a.padding, a.dilation, bool(a.ceil_mode),
                          layout="NHWC", out_layout="NHWC", **kwargs)
        return self._emit_transposed(new, NHWC_TO_NCHW)

    def _resize(self, call, name):
        inner = self._transposed(call.args[0])
        a = call.attrs
        if inner is None or inner[1] != NHWC_TO_NCHW or str(a.layout) != "NCHW":
            return None
        new = relax.op.image.resize2d(
            inner[0], call.args[1], [float(v) for v in a.roi], "NHWC", str(a.method),
            str(a.coordinate_transformation_mode), str(a.rounding_method), float(a.cubic_alpha),
            int(a.cubic_exclude), float(a.extrapolation_value), a.out_dtype,
        )
        return self._emit_transposed(new, NHWC_TO_NCHW)

    def _reduce(self, call, name):
        inner = self._transposed(call.args[0])
        if inner is None or not bool(call.attrs.keepdims) or call.attrs.axis is None:
            return None
        x, perm = inner
        axes = [_axis(int(a), perm) for a in call.attrs.axis]
        return self._emit_transposed(REDUCTIONS[name](x, axes, keepdims=True), perm)

    def _concat(self, call, name):
        fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else None
        sides = [self._transposed(f) for f in fields] if fields else [None]
        if any(s is None for s in sides) or len({s[1] for s in sides}) != 1:
            return None
        perm = sides[0][1]
        new = relax.op.concat([s[0] for s in sides], _axis(int(call.attrs.axis), perm))
        return self._emit_transposed(new, perm)

    def _repeat(self, call, name):
        """``repeat(permute_dims(x, p))``: ``x`` repeated along the moved axis (a depthwise
        convolution's channel multiplier, :mod:`~tvm_lowprec.quant.depthwise_multiplier`)."""
        inner = self._transposed(call.args[0])
        if inner is None or call.attrs.axis is None:
            return None
        x, perm = inner
        return self._emit_transposed(relax.op.repeat(x, int(call.attrs.repeats), _axis(int(call.attrs.axis), perm)), perm)

    def _split(self, call, name):
        """``split(permute_dims(x, p))``: the pieces of ``x`` split along the moved axis, each transposed
        (a C2f block's Split between two NHWC convolutions)."""
        inner = self._transposed(call.args[0])
        if inner is None:
            return None
        x, perm = inner
        indices = call.attrs.indices_or_sections
        indices = int(indices) if isinstance(indices, (int, tvm.tirx.IntImm)) else [int(i) for i in indices]
        pieces = self.builder_.emit(relax.op.split(x, indices, _axis(int(call.attrs.axis), perm)))
        count = len(pieces.ty.fields)
        return relax.Tuple([self.builder_.emit(relax.op.permute_dims(relax.TupleGetItem(pieces, i), perm))
                            for i in range(count)])


def propagate_layout_module(mod):
    """Apply the pass to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Propagator(mod))
