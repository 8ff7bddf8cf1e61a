"""Pass: the model's inputs taken at any alignment, so that ``Compiled.__call__`` passes numpy's arrays in
without a copy.

TVM marks every argument buffer of a kernel 64-byte aligned, and LLVM then emits aligned vector moves:
a numpy array (16-byte aligned as numpy allocates it) handed to such a kernel faults, so the call
copied every misaligned input into aligned memory first. For an image that copy is a visible part of
the call: 1x3x480x480 float32, 2.7 MB, 0.12 ms of a 2.5 ms text detector on Zen 5, read from DRAM
after the previous call evicted it. Here the kernels that read a ``main`` parameter (directly, or
through ``vm.builtin.reshape`` views of it) declare that parameter's buffer aligned to its element
only; LLVM then uses unaligned moves (as fast on aligned data on current x86 and Arm cores).

TVM 0.27 keeps no Python TIR mutator and ``PrimFunc.specialize`` refuses to change a buffer's
alignment, so a kernel is rewritten through its TVMScript: printed, the parameter's ``T.Buffer``
given ``align=``, parsed back. The round trip is checked first (the kernel printed and parsed
unchanged must be structurally equal to itself); a kernel that does not survive it keeps its
alignment, and the input that feeds it is copied as before. Used on CPU rows only.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

_RESHAPE = "vm.builtin.reshape"  # a view of its first argument
_CHECKS = ("vm.builtin.check_tensor_info", "vm.builtin.match_shape")  # read the shape only
_HARMLESS = ("relax.vm.kill_object",)


def _kernel_uses(mod) -> tuple[dict, set]:
    """(``{input position: [(kernel GlobalVar, argument index), ...]}``, positions of the inputs used in
    any other way: by a builtin other than a reshape or a shape check, in a tuple, ...)."""
    main = mod["main"]
    roots = {p: i for i, p in enumerate(main.params)}
    uses: dict[int, list] = {i: [] for i in roots.values()}
    other: set[int] = set()

    def root(expr):
        return roots.get(expr) if isinstance(expr, relax.Var) else None

    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Var):
                if root(value) is not None:
                    roots[binding.var] = root(value)
                continue
            if not isinstance(value, relax.Call):
                other |= {r for r in map(root, _vars_in(value)) if r is not None}
                continue
            args = list(value.args)
            if isinstance(value.op, relax.ExternFunc):
                name = str(value.op.global_symbol)
                if name == _RESHAPE and root(args[0]) is not None:
                    roots[binding.var] = root(args[0])
                    continue
                if name in _CHECKS:
                    continue
            is_kernel = isinstance(value.op, tvm.ir.GlobalVar) and isinstance(mod[value.op], tvm.tirx.PrimFunc)
            harmless = isinstance(value.op, tvm.ir.Op) and value.op.name in _HARMLESS
            for i, arg in enumerate(args):
                r = root(arg)
                if r is None:
                    continue
                if is_kernel:
                    uses[r].append((value.op, i))
                elif not harmless:
                    other.add(r)
    return uses, other


def _vars_in(expr) -> list:
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _vars_in(f)]
    return [expr] if isinstance(expr, relax.Var) else []


def _realigned(func, index: int):
    """``func`` with parameter ``index``'s buffer aligned to its element size, or None where the
    TVMScript round trip does not give ``func`` back, or the signature is not the plain form."""
    param = func.params[index]
    source = func.script()
    try:
        if not tvm_ffi.structural_equal(tvm.script.from_source(source), func):
            return None
    except Exception:  # noqa: BLE001 - a kernel TVMScript cannot parse back: leave it alone
        return None
    head, sep, body = source.partition("):\n")
    pattern = rf'\b{re.escape(param.name)}: T\.Buffer\(\((.*?)\), "([a-z0-9_]+)"\)'
    match = re.search(pattern, head)
    if not sep or match is None:
        return None
    align = max(1, np.dtype(match.group(2)).itemsize) if match.group(2) != "bool" else 1
    head = head[:match.start()] + f'{param.name}: T.Buffer(({match.group(1)}), "{match.group(2)}", align={align})' \
        + head[match.end():]
    try:
        return tvm.script.from_source(head + sep + body)
    except Exception:  # noqa: BLE001
        return None


def unaligned_inputs(mod) -> tuple[tvm.IRModule, frozenset]:
    """(``mod`` with the kernels that read ``main``'s parameters taking them at any alignment, the
    positions of the parameters that may now be passed at any alignment)."""
    if "main" not in [g.name_hint for g in mod.get_global_vars()]:
        return mod, frozenset()
    uses, other = _kernel_uses(mod)
    funcs = {}
    free = set()
    for position, sites in uses.items():
        if position in other or not sites:
            continue
        done = []
        for gvar, index in sites:
            func = funcs.get(gvar, mod[gvar])
            new = _realigned(func, index)
            if new is None:
                break
            done.append((gvar, new))
        else:
            for gvar, new in done:
                funcs[gvar] = new.with_attrs(dict(mod[gvar].attrs)) if mod[gvar].attrs is not None else new
            free.add(position)
    for gvar, func in funcs.items():  # in place: ``mod`` is the lowered module that compile() builds
        mod[gvar] = func
    return mod, frozenset(free)
