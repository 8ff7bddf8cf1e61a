"""Pass: keep data movement in the integer domain.

``quantize(op(dequantize(x, s, z)), s, z)`` with the same per-tensor constant parameters and dtype
becomes ``op(x)`` for operators that only move or select values (reshape, transpose, squeeze,
expand_dims, flatten, max pooling: they commute with the monotone dequantize), and
``quantize(dequantize(x, s, z), s, z)`` becomes ``x``. A ``split`` of a dequantized tensor whose
outputs are quantized back with the same parameters (a YOLO C2f block's ``Split``, each output with its
Q/DQ pair) splits the codes: ``quantize(split(dequantize(x))[i])`` becomes ``split(x)[i]``, the integer
split emitted once for all its outputs (a float split left for other uses is removed as dead code).
A quantized concatenation (of data, not of constants) is a concatenation of quantized pieces, ``quantize(concat(pieces))`` becomes
``concat([quantize(p) for p in pieces])`` (per-tensor parameters: the same values), so that each piece
folds on its own: a piece dequantized with the output's parameters is copied as codes, another is a
requantization of one tensor (a table lookup, :mod:`~tvm_lowprec.quant.lookup_tables`). A resize with
nearest-neighbour sampling only moves values and folds like the movement operators; so does a constant
pad whose value is a code of the parameters (``0.0`` is the zero point), which pads the codes with that
code. A requantization
of codes that movement operators made from fewer (an upsampling resize on codes) is done before them,
on the smaller tensor: the same values, since a requantization is elementwise on the codes (it then
becomes a table lookup of its own, :mod:`~tvm_lowprec.quant.lookup_tables`, which keeps fusion from
computing it again for every output element).
Exact: for |x - z| <= 255,
``rint(float32(float32((x - z) * s) / s)) == x - z``.

Runs after :mod:`~tvm_lowprec.quant.qdq_to_integer` and before legalization. Pairs with different
parameters (a requantization) are left for a later pass.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .patterns import call_of, constant, dtype_of, first_call, mutate_relax_functions, reads_an_input, static_shape

MOVEMENT_OPS = ("reshape", "permute_dims", "squeeze", "expand_dims", "flatten", "nn.max_pool2d", "image.resize2d")


def _moves_only(call) -> bool:
    """A MOVEMENT_OPS call that only moves values: a resize only with nearest-neighbour sampling."""
    return call.op.name != "relax.image.resize2d" or str(call.attrs.method) == "nearest_neighbor"


def _scalar_params(q, dq, lookup):
    """The four per-tensor constants (q's scale and zero point, then dq's) as 0-d arrays, or None."""
    values = [constant(e, lookup) for e in (q.args[1], q.args[2], dq.args[1], dq.args[2])]
    if any(v is None or np.asarray(v).size != 1 for v in values):
        return None
    return [np.asarray(v).reshape(()) for v in values]


def _same_params(q, dq, lookup) -> bool:
    values = _scalar_params(q, dq, lookup)
    if values is None:
        return False
    qs, qz, ds, dz = values
    return qs == ds and int(qz) == int(dz) and str(q.attrs.out_dtype) == dtype_of(dq.args[0])


def _unalias(expr, lookup):
    """``expr``, or the var it is bound to through ``y = x`` bindings (a folded operator's result)."""
    while isinstance(expr, relax.Var) and isinstance(bound := lookup(expr), relax.Var):
        expr = bound
    return expr


def grows(before, after) -> bool:
    """Whether ``after`` has more elements than ``before`` (static shapes)."""
    a, b = static_shape(before), static_shape(after)
    return a is not None and b is not None and int(np.prod(b)) > int(np.prod(a))


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0
        self._splits = {}  # the var bound to a float split -> the var of its integer twin

    def _split_item(self, call, lookup):
        """``split(x)[i]`` for ``quantize(split(dequantize(x))[i])`` with matching parameters, else None."""
        item = call.args[0]
        if isinstance(item, relax.Var):
            item = lookup(item)
        if not isinstance(item, relax.TupleGetItem):
            return None
        split = call_of(item.tuple_value, "split", lookup)
        dq = call_of(split.args[0], "dequantize", lookup) if split is not None else None
        if dq is None or not _same_params(call, dq, lookup):
            return None
        twin = self._splits.get(item.tuple_value)
        if twin is None:
            twin = self.builder_.emit(relax.Call(split.op, [dq.args[0], *split.args[1:]], split.attrs))
            self._splits[item.tuple_value] = twin
        self.folded += 1
        return self.builder_.emit(relax.TupleGetItem(twin, item.index))

    def _concat_pieces(self, call, lookup):
        """``concat([quantize(p, s, z) for p in pieces])`` for ``quantize(concat(pieces), s, z)`` with
        per-tensor parameters, each piece's quantize folded where it can be (a piece dequantized with
        the same parameters is its codes); None for anything else."""
        cat = call_of(call.args[0], "concat", lookup)
        params = [constant(p, lookup) for p in call.args[1:]]
        if cat is None or any(v is None or np.asarray(v).size != 1 for v in params):
            return None
        fields = cat.args[0]
        if isinstance(fields, relax.Var):
            fields = lookup(fields)
        if not isinstance(fields, relax.Tuple):
            return None
        if not all(reads_an_input(f, lookup) for f in fields.fields):
            # data only: pieces of a YOLO head's (2, N) anchor grid, computed from the image's shape
            # alone, distributed, made FoldConstant's LLVM build abort ("Do not know how to split")
            return None
        pieces = [self.builder_.emit(self._fold(relax.op.quantize(f, call.args[1], call.args[2], -1, str(call.attrs.out_dtype))))
                  for f in fields.fields]
        self.folded += 1
        return relax.op.concat(pieces, int(cat.attrs.axis))

    def _requantize_before_growth(self, call, dq, lookup):
        """``moves(quantize(dequantize(x)))`` for ``quantize(dequantize(moves(x)))`` where ``moves`` (a
        chain of movement operators) makes more elements than it reads (an FPN's nearest x8 resize into a
        concatenation: 64 times fewer requantizations, and the concatenation a copy of codes); None
        elsewhere."""
        chain, source = [], _unalias(dq.args[0], lookup)
        while (move := first_call(source, MOVEMENT_OPS, lookup)) is not None and _moves_only(move):
            chain.append(move)
            source = _unalias(move.args[0], lookup)
        if not chain or not grows(source, chain[0]):
            return None
        self.folded += 1
        x = self.builder_.emit(relax.Call(dq.op, [source, *dq.args[1:]], dq.attrs))
        x = self.builder_.emit(relax.Call(call.op, [x, *call.args[1:]], call.attrs))
        for move in reversed(chain):
            x = self.builder_.emit(relax.Call(move.op, [x, *move.args[1:]], move.attrs))
        return x

    def _padded_codes(self, call, lookup):
        """``pad(x, code)`` for ``quantize(pad(dequantize(x), v))`` with matching parameters, where ``v``
        is exactly the value of the integer code ``code``; else None."""
        pad = call_of(call.args[0], "nn.pad", lookup)
        dq = call_of(pad.args[0], "dequantize", lookup) if pad is not None else None
        if dq is None or str(pad.attrs.pad_mode) != "constant" or not _same_params(call, dq, lookup):
            return None
        scale, zero = _scalar_params(call, dq, lookup)[:2]
        value = np.float32(float(pad.attrs.pad_value))
        code = int(zero) + int(np.rint(value / np.float32(scale)))
        info = np.iinfo(dtype_of(dq.args[0]))
        if not info.min <= code <= info.max or np.float32((code - int(zero)) * np.float32(scale)) != value:
            return None
        self.folded += 1
        return self.builder_.emit(relax.op.nn.pad(dq.args[0], [int(w) for w in pad.attrs.pad_width], "constant", float(code)))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(tvm.ir.Op.get("relax.quantize")):
            return call
        return self._fold(call)

    def _fold(self, call):
        lookup = self.lookup_binding
        dq = call_of(call.args[0], "dequantize", lookup)
        if dq is not None and _same_params(call, dq, lookup):
            self.folded += 1
            return dq.args[0]
        if dq is not None and _scalar_params(call, dq, lookup) is not None:
            moved = self._requantize_before_growth(call, dq, lookup)
            if moved is not None:
                return moved
        item = self._split_item(call, lookup)
        if item is not None:
            return item
        pieces = self._concat_pieces(call, lookup)
        if pieces is not None:
            return pieces
        padded = self._padded_codes(call, lookup)
        if padded is not None:
            return padded
        move = first_call(call.args[0], MOVEMENT_OPS, lookup)
        dq = call_of(move.args[0], "dequantize", lookup) if move is not None and _moves_only(move) else None
        if dq is None or not _same_params(call, dq, lookup):
            return call
        self.folded += 1
        return self.builder_.emit(relax.Call(move.op, [dq.args[0], *move.args[1:]], move.attrs))


def fold_qdq_module(mod):
    """Apply the fold to every Relax function of ``mod``."""
    return mutate_relax_functions(mod, _Folder(mod))
