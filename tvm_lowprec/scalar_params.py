"""Pass: a legalized kernel that takes a scalar parameter (a dimension passed by value, as
``shape_to_tensor(past_sequence_length)`` is) is not fused with others.

A fused kernel with such a scalar parameter and the shape variables of its other kernels passed as
``tir_vars`` (``arange(sequence_length)`` has no tensor input to carry them) stops TVM 0.27's
``FuseTIR`` with ``renew_defs.cc``: ``Check failed: (VarRemapGet(source) == nullptr)``: the positions
``arange(seq) + past_length`` of every decoder exported with symbolic lengths. Marked opaque
(``op_pattern`` 8) after ``AnnotateTIROpPattern``, the scalar's kernel stays a kernel of its own (one
element written once per call) and the kernels around it fuse as before.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx.buffer import BufferType

OPAQUE = 8  # relax's OpPatternKind::kOpaque


def _scalar_params(func) -> bool:
    """Whether ``func`` takes a parameter that is not a buffer (a scalar passed by value)."""
    return any(not isinstance(getattr(param, "ty", None), BufferType) for param in func.params)


def opaque_scalar_kernels(mod):
    """``mod`` with every PrimFunc that takes a scalar parameter marked opaque to fusion."""
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and _scalar_params(func):
            updates[gv] = func.with_attr("op_pattern", OPAQUE)
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def opaque_scalar_kernels_pass():
    return tvm.transform.module_pass(lambda mod, _ctx: opaque_scalar_kernels(mod), opt_level=0,
                                     name="lowprec.OpaqueScalarKernels")
