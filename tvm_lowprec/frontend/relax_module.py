"""Any Relax module in: what TVM's own frontends hand over, made ready for our passes.

TVM's frontends (``tvm.relax.frontend.onnx.from_onnx``, ``tvm.relax.frontend.torch.from_exported_program``
and ``from_fx``, ``tvm.relax.frontend.nn``'s ``export_tvm``) and hand-written TVMScript give a module
whose ``main`` names its inputs by its parameters (``Var.name`` in TVM 0.27) and may keep the weights
as trailing parameters: ``keep_params_in_input=True`` / ``keep_params_as_input=True`` put the number of
real inputs in ``main``'s ``num_input`` attribute and the weights' values in its ``params`` attribute.
:func:`prepare_module` binds those values as constants (``relax.transform.BindParams``), so that
every pass sees the weights as our importer writes them; weights with no value (``export_tvm``, or a
module after ``relax.frontend.detach_params``) are an :class:`~tvm_lowprec.errors.InputError` naming
them and saying how to bind them.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import InputError


def var_name(var) -> str:
    """A Relax variable's name (TVM 0.27: ``Var.name``; older TVMs: ``name_hint``)."""
    name = getattr(var, "name", None)
    return str(name if name is not None else var.name_hint)


def prepare_module(mod) -> tvm.IRModule:
    """``mod`` with ``main``'s weight parameters bound as constants where the frontend kept them as
    inputs with their values; ``mod`` itself when there is nothing to bind."""
    if not isinstance(mod, tvm.IRModule):
        raise InputError(f"expected a tvm.IRModule (from tvm_lowprec.from_onnx, a TVM frontend or TVMScript), "
                         f"got {type(mod).__name__}")
    if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
        names = sorted(gv.name_hint for gv in mod.get_global_vars())
        raise InputError(f"the module has no 'main' function (it has {names}): the model's entry must be called 'main'")
    main = mod["main"]
    if not isinstance(main, relax.Function):
        raise InputError(f"the module's 'main' is a {type(main).__name__}, not a Relax function")
    attrs = main.attrs if main.attrs is not None else {}
    num_input = attrs.get("num_input", None)
    if num_input is None:
        return mod
    num_input = int(num_input)
    weights = list(main.params[num_input:])
    if not weights:  # nothing to bind: the attributes only
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        out["main"] = _without(main, ("params", "num_input"))
        return out
    values = list(attrs.get("params", None) or [])
    if len(values) != len(weights):
        shown = [var_name(w) for w in weights][:8]
        more = f" and {len(weights) - 8} more" if len(weights) > 8 else ""
        raise InputError(
            f"'main' takes {num_input} input(s) and {len(weights)} weight parameter(s) ({shown}{more}) whose values "
            f"the module does not hold ({len(values)} given): bind them first, e.g. "
            f"mod = relax.transform.BindParams('main', {{name: array, ...}})(mod), or import with the weights as "
            f"constants (keep_params_in_input=False)")
    bound = relax.transform.BindParams("main", {w: v for w, v in zip(weights, values)})(mod)
    bound["main"] = _without(bound["main"], ("params", "num_input"))
    return bound


def _without(func, keys):
    for key in keys:
        if func.attrs is not None and key in func.attrs:
            func = func.without_attr(key)
    return func


__all__ = ["prepare_module", "var_name"]
