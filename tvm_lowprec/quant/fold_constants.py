"""Pass: kernels whose inputs are all constants run once, at compile time, built the way the model is.

Replaces TVM's ``relax.transform.FoldConstant`` in the pipeline (after legalization, before fusion).
Relax's folder builds each constant kernel itself, through a shorter path than ``tvm.compile``: TIR's
``build`` of ``LowerPrimFunc(func)`` for a generic ``Target("llvm")`` (no CPU, no features), with none
of the target's TIR pipeline. LLVM can abort there (``LLVM ERROR: Do not know how to split the result
of this operator!``, SIGABRT, the user's process gone) on kernels that build for the row's target: a
YOLOv8n exported with dynamic axes, whose anchor grid (Shape, Range, Cast, Expand) becomes constant
once its input shape is pinned, did, under the row's target and a plain ``llvm`` alike, while
``tvm.compile`` of each of its 357 kernels alone succeeded. An abort is no exception: nothing can catch it.

Here a constant kernel is built by ``tvm.compile`` for the target the model itself is compiled for (a
CPU row's LLVM target with its CPU and features; a GPU row's host), the path every kernel of the model
takes anyway, its machine code made in a child process (:mod:`tvm_lowprec.native_build`: an LLVM abort
is an exception there), and evaluated on the constants. A kernel that does not build or run stays in the graph, as Relax's folder leaves it; builds are shared by identical kernels. Folding is a
worklist over the function's bindings in order: a folded value is a constant for the bindings after it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..native_build import kernel_library
from .patterns import dtype_of, mutate_relax_functions, static_shape

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def evaluation_target() -> tvm.target.Target:
    """The LLVM target constant kernels are built for: the one in scope (a CPU row's), else its host's
    (a GPU row's), else the host's LLVM target."""
    target = tvm.target.Target.current(allow_none=True)
    if target is not None and target.kind.name == "llvm":
        return target
    if target is not None and target.host is not None and target.host.kind.name == "llvm":
        return target.host
    from ..targets import native_target

    return native_target()


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod, target):
        super().__init__(mod)
        self.mod, self.target = mod, target
        self.built: dict = {}  # kernel name -> its built function (None: it did not build)
        self.folded = 0

    def visit_call_(self, original):
        call = super().visit_call_(original)
        if not call.op.same_as(CALL_TIR) or len(call.args) != 2:  # a kernel with symbolic shape arguments: kept
            return call
        if not isinstance(original.ty, relax.TensorType):  # a kernel of several outputs: kept
            return call
        shape = static_shape(original)  # the visited call is not normalized yet: the original's type
        args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
        values = [self._constant(a) for a in args]
        if shape is None or any(v is None for v in values):
            return call
        dtype = dtype_of(original)
        kernel = self._kernel(call.args[0])
        if kernel is None:
            return call
        try:
            out = tvm.runtime.tensor(np.empty(shape, dtype))
            kernel(*(tvm.runtime.tensor(v) for v in values), out)
        except Exception:  # noqa: BLE001 - a kernel that does not run here is kept, as Relax's folder does
            return call
        self.folded += 1
        return relax.const(out.numpy(), dtype)  # relax.const alone makes float64 float32, int64 int32

    def _constant(self, expr):
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None

    def _kernel(self, gvar):
        name = gvar.name_hint
        if name not in self.built:
            func = self.mod[gvar]
            self.built[name] = None
            if isinstance(func, tvm.tirx.PrimFunc):
                try:
                    one = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
                    _, lib = kernel_library(one, self.target)  # LLVM's back end in a child process
                    self.built[name] = lib["main"]
                except Exception:  # noqa: BLE001 - a kernel that does not build is kept in the graph
                    pass
        return self.built[name]


def fold_constants_module(mod):
    """Every constant kernel call of ``mod``'s Relax functions replaced by its value (kernels nothing
    calls any more are left for dead-code elimination)."""
    return mutate_relax_functions(mod, _Folder(mod, evaluation_target()))
