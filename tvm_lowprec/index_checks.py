"""Pass: indices that come from the model's inputs are checked before a ``take`` reads with them.

ONNX's ``Gather`` becomes ``relax.take(data, indices, axis)`` in TVM's importer (negative indices
already wrapped), and TVM lowers it in its ``fast`` mode: no bounds test. A token id past the end of an
embedding table (a tokenizer for another vocabulary, an off-by-one in a user's loop) then read memory
outside the table: a segmentation fault, or, silently, garbage logits (seen: ids of 100000 into a
512-row table ran and returned finite numbers). ONNX Runtime stops such a call with an error.

Here every ``take`` whose indices are not a constant reads them through a small kernel that copies
them and asserts ``0 <= i < extent`` for each (TIR's ``assert``: the call raises, naming the operator
and the extent, and the process goes on). The copy is of the indices only (a decoder step's few ids).
Indices of a symbolic shape (a prompt's ids, any length) go through one kernel per dtype and extent
whose count is bound at each call. Constant indices (checked when folded) are left as they are; the
pass runs for CPU rows only (the kernel's loop is serial host code).
"""

from __future__ import annotations

import functools
import math

import tvm
from tvm import relax
from tvm.script import tirx as T

from .quant.patterns import dtype_of, static_shape

OP = "check_indices"


def check_kernel(count: int, dtype: str, extent: int, what: str):
    """A PrimFunc copying ``count`` indices of ``dtype`` that raises where one is outside ``[0, extent)``."""
    message = f"{what}: an index is outside [0, {extent})"
    zero, end = tvm.tirx.const(0, dtype), tvm.tirx.const(extent, dtype)

    @T.prim_func(private=True, s_tir=True)
    def check(a: T.Buffer((count,), dtype), b: T.Buffer((count,), dtype)):
        T.func_attr({"tir.is_scheduled": True, "lowprec.op": OP, "lowprec.schedule": "default", "op_pattern": 8})
        with T.sblock("root"):  # Relax's analyses of a kernel (its reshape pattern) expect a root block
            for i in range(count):
                assert a[i] >= zero and a[i] < end, message
                b[i] = a[i]

    return check


def check_kernel_any_count(dtype: str, extent: int, what: str):
    """:func:`check_kernel` for a count known at run time (indices of a symbolic shape: a prompt's ids)."""
    message = f"{what}: an index is outside [0, {extent})"
    zero, end = tvm.tirx.const(0, dtype), tvm.tirx.const(extent, dtype)

    @T.prim_func(private=True, s_tir=True)
    def check(a_handle: T.handle, b_handle: T.handle):
        T.func_attr({"tir.is_scheduled": True, "lowprec.op": OP, "lowprec.schedule": "default", "op_pattern": 8})
        count = T.int64()
        a = T.match_buffer(a_handle, (count,), dtype)
        b = T.match_buffer(b_handle, (count,), dtype)
        with T.sblock("root"):
            for i in range(count):
                assert a[i] >= zero and a[i] < end, message
                b[i] = a[i]

    return check


def _symbolic_shape(expr) -> bool:
    """Whether ``expr`` is a tensor of known rank and shape with some dimension symbolic."""
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and ty.shape is not None and len(ty.shape) > 0


@relax.expr_functor.mutator
class _Checker(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.kernels = {}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take") or str(call.attrs.mode) != "fast":
            return call
        data, indices = call.args
        if isinstance(indices, tvm.ir.expr.Constant):
            return call
        shape, data_shape = static_shape(indices), static_shape(data)
        dtype = dtype_of(indices)
        symbolic = shape is None and _symbolic_shape(indices)
        if (shape is None and not symbolic) or data_shape is None or dtype not in ("int32", "int64"):
            return call
        axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
        extent = data_shape[axis % len(data_shape)] if data_shape else 1
        what = f"Gather (take) of {data_shape} along axis {axis}"
        if symbolic:  # one kernel per dtype and extent, its count bound at each call
            shape = list(indices.ty.shape)
            count = functools.reduce(lambda a, b: a * b, shape, tvm.tirx.const(1, "int64"))
            key = ("any", dtype, extent)
            if key not in self.kernels:
                self.kernels[key] = self.builder_.add_func(check_kernel_any_count(dtype, extent, what),
                                                           f"{OP}_{dtype}_n_below_{extent}")
        else:
            count = max(math.prod(shape), 1)
            key = (count, dtype, extent)
            if key not in self.kernels:
                name = f"{OP}_{dtype}_{count}_below_{extent}"
                self.kernels[key] = self.builder_.add_func(check_kernel(count, dtype, extent, what), name)
        flat = relax.op.reshape(indices, (count,)) if len(shape) != 1 else indices
        checked = relax.call_tir(self.kernels[key], [flat], relax.TensorType((count,), dtype))
        if len(shape) != 1:
            checked = relax.op.reshape(checked, shape)
        return relax.Call(call.op, [data, checked], call.attrs, call.ty_args)


def checked_indices_module(mod):
    """Every Relax function of ``mod`` with its non-constant ``take`` indices checked (CPU targets)."""
    target = tvm.target.Target.current(allow_none=True)
    if target is not None and target.kind.name != "llvm":
        return mod
    checker = _Checker(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            checker.builder_.update_func(gvar, checker.visit_expr(func))
    return checker.builder_.get() if checker.kernels else mod


__all__ = ["checked_indices_module", "check_kernel"]
